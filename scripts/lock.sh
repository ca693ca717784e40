#!/usr/bin/env bash
# Re-resolve requirements.lock: the exact version, with its hashes, of every package fleetgen's dependencies,
# its dev and ray extras and its build backend need, for every Python the project supports (>= 3.11, any platform:
# uv's universal resolution). scripts/install-deps.sh (so CI, the demo and the tests) installs exactly these
# with `pip install --require-hashes`; pyproject.toml keeps its ranges for those who install fleetgen as a
# library. tests/unit/scripts/test_lock.py fails while the two disagree.
#
#   scripts/lock.sh                                 after editing pyproject.toml: keeps every locked version
#                                                   that pyproject still allows, resolves the rest
#   scripts/lock.sh --upgrade                       the newest release of everything (then bash scripts/test.sh)
#   scripts/lock.sh --upgrade-package cryptography  one package (any option of `uv pip compile` passes through)
#
# uv (pinned below) only resolves: it is installed into its own venv under ~/.cache/fleetgen, never into .venv,
# and reads PyPI only (whatever pip's configuration says), so the hashes are PyPI's, the ones CI installs.
set -euo pipefail

UV_VERSION="0.13.9"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
UV_VENV="${XDG_CACHE_HOME:-$HOME/.cache}/fleetgen/uv-$UV_VERSION"

say() { printf '[lock] %s\n' "$*"; }
die() { printf '[lock] ERROR: %s\n' "$*" >&2; exit 1; }
trap 'die "failed at line $LINENO (exit $?): $BASH_COMMAND"' ERR

if [[ ! -x "$UV_VENV/bin/uv" ]]; then
    say "installing uv $UV_VERSION into $UV_VENV"
    "$PYTHON" -m venv "$UV_VENV"
    "$UV_VENV/bin/python" -m pip install --no-input --progress-bar off --quiet "uv==$UV_VERSION"
fi
# The build backend ([build-system] requires) is locked too: install-deps builds fleetgen without isolation.
build_requires="$("$PYTHON" -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' "$ROOT/pyproject.toml")"
cd "$ROOT"
printf '%s\n' "$build_requires" | "$UV_VENV/bin/uv" pip compile pyproject.toml - --extra dev --extra ray \
    --universal --python-version 3.11 --generate-hashes --index-url https://pypi.org/simple \
    --custom-compile-command "scripts/lock.sh" --quiet -o requirements.lock "$@"
say "requirements.lock: $(grep -c '^[A-Za-z0-9]' requirements.lock) pins; run bash scripts/test.sh, then commit it"
