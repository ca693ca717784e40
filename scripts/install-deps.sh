#!/usr/bin/env bash
# Install what the project's checks and tests need on a fresh Debian/Ubuntu machine. Idempotent.
#
#   scripts/install-deps.sh
#
# 1. System packages: openssh-server (the tests' real sshd hosts), iproute2 (`ip netns` test hosts), chromium and
#    p7zip-full, strace (see APT_PACKAGES),
#    only when missing — apt-get update is skipped when nothing is to install.
# 2. The project venv .venv (python3 -m venv; $PYTHON picks the interpreter) with the exact versions of
#    requirements.lock (hashes checked), then fleetgen itself (`pip install --no-deps -e .`); skipped when .venv
#    was already installed from this exact pyproject.toml and lock. scripts/lock.sh updates the lock.
set -euo pipefail

say() { printf '[install-deps] %s\n' "$*"; }
die() { printf '[install-deps] ERROR: %s\n' "$*" >&2; exit 1; }
trap 'die "failed at line $LINENO (exit $?): $BASH_COMMAND"' ERR

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
# chromium: `report --png` and `bench --png` rasterise their SVG charts with it; the dashboard tests load the pages in it.
# p7zip-full: tests/integration/generate/test_input_archives.py makes a real 7z archive with it (README: archives refused).
# strace: tests/integration/deploy/test_secrets.py records every exec on a host during `up` (no key on any argv).
APT_PACKAGES=(openssh-server iproute2 chromium p7zip-full strace)

bash "$(dirname "${BASH_SOURCE[0]}")/apt-ensure.sh" install-deps "${APT_PACKAGES[@]}"

VENV="$ROOT/.venv"
if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating $VENV with $("$PYTHON" -V 2>&1) ($PYTHON)"
    "$PYTHON" -m venv "$VENV"
fi
LOCK="$ROOT/requirements.lock"
# The stamp names the pyproject.toml and the lock it was installed from: an edit to either re-installs.
STAMP="$VENV/.fleetgen-deps-$(cat "$ROOT/pyproject.toml" "$LOCK" | sha256sum | cut -c1-16)"
if [[ -f "$STAMP" ]]; then
    say "$VENV already has this pyproject.toml's and requirements.lock's dependencies"
else
    # Exactly the locked versions, each file checked against its hash: the suite that passed with this lock
    # passes with it a month later, whatever PyPI has released since. The build backend is locked too, hence
    # fleetgen's own editable install without build isolation (and without dependencies: they are installed).
    say "pip install --require-hashes -r requirements.lock into $VENV"
    "$VENV/bin/python" -m pip install --no-input --progress-bar off --require-hashes -r "$LOCK"
    say "pip install --no-deps -e . into $VENV"
    "$VENV/bin/python" -m pip install --no-input --progress-bar off --no-deps --no-build-isolation -e "$ROOT"
    "$VENV/bin/python" -m pip check
    rm -f "$VENV"/.fleetgen-deps-*
    : >"$STAMP"
fi
"$VENV/bin/python" -c 'import fleetgen; print(f"[install-deps] fleetgen importable from {fleetgen.__file__}")'
