#!/usr/bin/env bash
# SGLang's own source for every release fleetgen's timeline names (tests/unit/engines/test_sglang_timeline.py re-reads
# it: the timeline's first releases against the wheels, not against a hand-written table). Idempotent.
#
#   scripts/install-sglang-src.sh DIR      → DIR/<release>/sglang/srt/**.py
#
# `pip download --no-deps sglang==X` per release (a 7–10 MB wheel each), only `sglang/srt/*.py` unpacked.
set -euo pipefail
DIR="${1:?usage: install-sglang-src.sh DIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
mkdir -p "$DIR"
releases=$("$PY" -c 'from fleetgen.engines.sglang_timeline import RELEASES; print(" ".join(RELEASES))')
for r in $releases; do
    [[ -f "$DIR/$r/.done" ]] && continue
    tmp=$(mktemp -d)
    "$PY" -m pip download -q --no-deps --no-input --progress-bar off "sglang==$r" -d "$tmp"
    mkdir -p "$DIR/$r"
    "$PY" - "$tmp"/sglang-*.whl "$DIR/$r" <<'PYEOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("sglang/srt/") and n.endswith(".py")])
PYEOF
    rm -rf "$tmp"
    : >"$DIR/$r/.done"
done
echo "[install-sglang-src] $(ls "$DIR" | wc -l) releases in $DIR"
