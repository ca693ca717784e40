#!/usr/bin/env bash
# SGLang 0.5.23's OWN argument parser and config classes, runnable without a GPU, for the tests that check
# fleetgen's plan against SGLang itself (tests/integration/engines/test_sglang_parser.py). Idempotent.
#
#   scripts/install-sglang-parser.sh [VENV]     (default: $FLEETGEN_SGLANG_VENV or ~/.cache/fleetgen/sglang-venv)
#
# The server cannot start here (no GPU, no sgl_kernel); `import sglang.srt.server_args` can, given the wheel
# installed with --no-deps plus what that module imports (real-components.md). torch 2.13.0 (CPU) comes from
# this machine's local wheel folder; triton is imported unconditionally by server_args, so it is installed too.
set -euo pipefail

VERSION=0.5.23
VENV="${1:-${FLEETGEN_SGLANG_VENV:-$HOME/.cache/fleetgen/sglang-venv}}"
MARKER="$VENV/.fleetgen-sglang-$VERSION-ok"
say() { printf '[install-sglang-parser] %s\n' "$*"; }

if [[ -f "$MARKER" ]]; then
    say "$VENV already has SGLang $VERSION's parser"
    exit 0
fi
[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --no-input --progress-bar off -q)
say "torch 2.13.0 (CPU), sglang==$VERSION --no-deps, and server_args' imports into $VENV"
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" --no-deps "sglang==$VERSION"
"${PIP[@]}" numpy orjson psutil pybase64 requests triton packaging pillow starlette msgspec pydantic_core pyzmq \
    tqdm IPython pydantic aiohttp transformers==5.19.0
got="$("$VENV/bin/python" -c 'import sglang.srt.server_args, sglang; print(sglang.__version__)')"
[[ "$got" == "$VERSION" ]] || { say "ERROR: expected SGLang $VERSION, imported $got" >&2; exit 1; }
: >"$MARKER"
say "ok: SGLang $got's server_args imports from $VENV/bin/python"
