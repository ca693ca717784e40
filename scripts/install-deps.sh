#!/usr/bin/env bash
# Install what the project's checks and tests need on a fresh Debian/Ubuntu machine. Idempotent.
#
#   scripts/install-deps.sh
#
# 1. System packages: openssh-server (the tests' real sshd hosts), iproute2 (`ip netns` test hosts), chromium and
#    p7zip-full, strace (see APT_PACKAGES),
#    only when missing — apt-get update is skipped when nothing is to install.
# 2. The project venv .venv (python3 -m venv; $PYTHON picks the interpreter) with `pip install -e '.[dev]'`,
#    skipped when .venv was already installed from this exact pyproject.toml.
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
# The stamp names the pyproject.toml it was installed from: an edited pyproject re-installs.
STAMP="$VENV/.fleetgen-deps-$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
if [[ -f "$STAMP" ]]; then
    say "$VENV already has this pyproject.toml's dependencies"
else
    say "pip install -e '.[dev]' into $VENV"
    "$VENV/bin/python" -m pip install --no-input --progress-bar off -e "$ROOT[dev]"
    rm -f "$VENV"/.fleetgen-deps-*
    : >"$STAMP"
fi
"$VENV/bin/python" -c 'import fleetgen; print(f"[install-deps] fleetgen importable from {fleetgen.__file__}")'
