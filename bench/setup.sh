#!/usr/bin/env bash
# Create the benchmark's own venv with the peer drivers (openai, Bespoke Curator) and py-spy.
# They are NOT fleetgen dependencies: the bench compares against them, so they live apart from .venv.
#   BENCH_VENV  where to create it (default: ~/.cache/fleetgen/bench-venv)
#   PYTHON      the interpreter to build it from (default: python3.11, else python3)
set -euo pipefail
BENCH_VENV="${BENCH_VENV:-$HOME/.cache/fleetgen/bench-venv}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
if [ ! -x "$BENCH_VENV/bin/python" ]; then
  "$PYTHON" -m venv "$BENCH_VENV"
fi
"$BENCH_VENV/bin/python" -m pip install --quiet --upgrade pip
# openai: the hand-written-script peer; bespokelabs-curator: the batch-generation peer; py-spy: profiling.
"$BENCH_VENV/bin/python" -m pip install --quiet openai bespokelabs-curator py-spy
"$BENCH_VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("openai", "bespokelabs-curator", "py-spy"):
    print(f"{name} {md.version(name)}")
PY
echo "bench venv ready: $BENCH_VENV"
