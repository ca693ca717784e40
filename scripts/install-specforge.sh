#!/usr/bin/env bash
# SpecForge 0.2.0's OWN data code (what its training runs on an exported file), runnable on a CPU, for the test
# that feeds every `fleetgen export --format sharegpt` row to it (tests/integration/generate/test_export_specforge.py).
# Idempotent.
#
#   scripts/install-specforge.sh [VENV]     (default: $FLEETGEN_SPECFORGE_VENV or ~/.cache/fleetgen/specforge-venv)
#
# The wheel pins torch 2.11 + sglang + training extras that a CPU test does not import; it is installed with
# --no-deps plus what `specforge.data.preprocessing` imports. torch 2.13.0 (CPU) comes from this machine's local
# wheel folder (never a CUDA build: the pip constraints cap torch to the local one).
set -euo pipefail

VERSION=0.2.0
VENV="${1:-${FLEETGEN_SPECFORGE_VENV:-$HOME/.cache/fleetgen/specforge-venv}}"
TRANSFORMERS=5.8.1  # the version SpecForge 0.2.0 pins
MARKER="$VENV/.fleetgen-specforge-$VERSION-transformers-$TRANSFORMERS-ok"
say() { printf '[install-specforge] %s\n' "$*"; }

if [[ -f "$MARKER" ]]; then
    say "$VENV already has SpecForge $VERSION's data code"
    exit 0
fi
[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
# --no-compile: no .pyc for torch's thousands of files at install time (most of the install's CPU time);
# Python compiles the few modules the test imports on first use.
PIP=("$VENV/bin/python" -m pip install --no-input --progress-bar off -q --no-compile)
say "torch 2.13.0 (CPU), specforge==$VERSION --no-deps, and specforge.data's imports into $VENV"
"${PIP[@]}" --no-deps "specforge==$VERSION"
"${PIP[@]}" torch==2.13.0 "transformers==$TRANSFORMERS" datasets tqdm pydantic jinja2 numpy
got="$("$VENV/bin/python" -c '
import importlib.metadata as m
import specforge.data.preprocessing, specforge.data.template
print(m.version("specforge"))')"
[[ "$got" == "$VERSION" ]] || { say "ERROR: expected SpecForge $VERSION, imported $got" >&2; exit 1; }
: >"$MARKER"
say "ok: SpecForge $got's specforge.data imports from $VENV/bin/python"
