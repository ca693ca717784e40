#!/usr/bin/env bash
# bash scripts/apt-ensure.sh TAG PACKAGE...: apt-get install the PACKAGEs not installed yet (root, else sudo).
set -euo pipefail
tag=$1; shift
say() { printf '[%s] %s\n' "$tag" "$*"; }
die() { printf '[%s] ERROR: %s\n' "$tag" "$*" >&2; exit 1; }

missing=()
for pkg in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$pkg")
    fi
done
if ((${#missing[@]} == 0)); then
    say "apt packages present: $*"
    exit 0
fi
SUDO=()
if [[ $EUID -ne 0 ]]; then
    command -v sudo >/dev/null || die "need root (or sudo) to apt-get install ${missing[*]}"
    SUDO=(sudo)
fi
say "apt-get install ${missing[*]}"
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
