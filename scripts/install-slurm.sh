#!/usr/bin/env bash
# Install Debian's Slurm (slurm-wlm: slurmctld, slurmd, sbatch…) and munge when missing. Idempotent.
#
#   scripts/install-slurm.sh
#
# The tests start their own single-node cluster from these binaries (tests/fixtures/slurm.py: private
# munged + slurmctld + slurmd, generated slurm.conf); nothing is configured or started here. The packages'
# own services are not started either (no systemd on the CI machines).
set -euo pipefail

say() { printf '[install-slurm] %s\n' "$*"; }
die() { printf '[install-slurm] ERROR: %s\n' "$*" >&2; exit 1; }
trap 'die "failed at line $LINENO (exit $?): $BASH_COMMAND"' ERR

APT_PACKAGES=(slurm-wlm munge)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$pkg")
    fi
done
if ((${#missing[@]} == 0)); then
    say "apt packages present: ${APT_PACKAGES[*]}"
else
    SUDO=()
    if [[ $EUID -ne 0 ]]; then
        command -v sudo >/dev/null || die "need root (or sudo) to apt-get install ${missing[*]}"
        SUDO=(sudo)
    fi
    say "apt-get install ${missing[*]}"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi
for program in munged slurmctld slurmd sbatch; do
    command -v "$program" >/dev/null || [[ -x /usr/sbin/$program ]] || die "$program is missing after the install"
done
say "slurm-wlm $(dpkg-query -W -f='${Version}' slurm-wlm) ready (the tests start their own cluster)"
