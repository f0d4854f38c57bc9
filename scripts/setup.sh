#!/usr/bin/env bash
# Installs everything rlbuild needs into ./.venv from the lock file: Python 3.12, uv, the locked packages
# (Snakemake and its S3 plugin, the Iris executor plugin, torch, ray, transformers, moto for tests).
# Idempotent: a second run only checks that the environment matches uv.lock.
# `scripts/setup.sh --extra gpu` on a GPU node adds vLLM (with the torch and transformers it pins).
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  if command -v python3.12 >/dev/null 2>&1 && python3.12 -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    command -v python3.12
    return
  fi
  for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 /usr/bin/python3.12 /usr/local/bin/python3.12; do
    if [[ -x "$candidate" ]]; then
      echo "$candidate"
      return
    fi
  done
  echo "rlbuild setup: no Python 3.12 found; install it (e.g. 'pyenv install 3.12' or your distribution's python3.12)" >&2
  exit 1
}

PYTHON=$(find_python)
if [[ ! -x .tools/bin/uv ]]; then
  "$PYTHON" -m venv .tools
  .tools/bin/python -m pip install --quiet --disable-pip-version-check "uv>=0.9,<1"
fi
# Bytecode is compiled up front: environments that set PYTHONDONTWRITEBYTECODE would otherwise recompile
# Snakemake and its plugins on every invocation (seconds per dry run).
# `--extra gpu` (a GPU node: vLLM, Linux x86_64) leaves out the Slurm submit plugin, which cannot share a venv
# with vLLM (pyproject.toml says why); uv.lock holds both resolutions.
extra=()
for arg in "$@"; do
  if [[ "$arg" == "gpu" || "$arg" == "--extra=gpu" ]]; then
    extra=(--no-group slurm)
  fi
done
UV_PYTHON="$PYTHON" .tools/bin/uv sync --frozen --compile-bytecode "$@" "${extra[@]}"
# The checkout's own packages are installed editable (the sync compiles none of them): compiled here likewise,
# or every `snakemake` invocation compiles rlbuild again (a tenth of a second of each dry run). A module edited
# later is recompiled in memory until the next set-up, as Python checks each cache against its source.
.venv/bin/python -m compileall -q -j 0 rlbuild trainer plugins >/dev/null
