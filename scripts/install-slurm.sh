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
bash "$(dirname "${BASH_SOURCE[0]}")/apt-ensure.sh" install-slurm "${APT_PACKAGES[@]}"
for program in munged slurmctld slurmd sbatch; do
    command -v "$program" >/dev/null || [[ -x /usr/sbin/$program ]] || die "$program is missing after the install"
done
say "slurm-wlm $(dpkg-query -W -f='${Version}' slurm-wlm) ready (the tests start their own cluster)"
