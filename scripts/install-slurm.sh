#!/usr/bin/env bash
# Installs Slurm from the distribution's packages for the tests' local cluster (tests/slurm/local_cluster.py):
# the controller, the node daemon, the client commands and munge. No accounting (slurmdbd, MariaDB): the
# official Snakemake plugin reads job states with squeue, which needs none. Nothing is started or configured
# here; the tests start their own daemons with a generated slurm.conf and stop them after.
# Idempotent: does nothing when every command is already there. Needs root (CI runs as root).
set -euo pipefail

needed=(munged slurmctld slurmd sbatch srun squeue scontrol scancel sinfo)
missing=()
for command in "${needed[@]}"; do
  command -v "$command" >/dev/null 2>&1 || missing+=("$command")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "install-slurm: missing ${missing[*]}; run this script as root (it uses apt-get)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
echo "install-slurm: installed $(sbatch --version)"
