#!/usr/bin/env bash
# Run a verl-npu recipe: validation first (stops on any problem), then the device, then training.
#
#   bash launch/run_recipe.sh NAME|PATH [key=value ...]
#   bash launch/run_recipe.sh tiny_geo3k                         # CPU demo
#   bash launch/run_recipe.sh my_geo3k.yaml trainer.total_epochs=1
#
# Python: $VERL_NPU_PYTHON, else <repo>/.venv/bin/python, else python3.
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: bash launch/run_recipe.sh NAME|PATH [key=value ...]" >&2
    echo "       (shipped recipes: python -m verl_npu.cli list)" >&2
    exit 2
fi

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ -n "${VERL_NPU_PYTHON:-}" ]]; then
    PYTHON="${VERL_NPU_PYTHON}"
elif [[ -x "${REPO_ROOT}/.venv/bin/python" ]]; then
    PYTHON="${REPO_ROOT}/.venv/bin/python"
else
    PYTHON="python3"
fi

# ---------------------------------------------------------------------------------------------
# MULTI-NODE / ASCEND ENVIRONMENT: reserved for the multi-node issue, not implemented yet.
# This is where NNODES / NODE_RANK / MASTER_ADDR handling, sourcing CANN's set_env.sh, and
# `ray start --head` (rank 0) or `ray start --address=$MASTER_ADDR:PORT` (other ranks) will go.
# Today the launcher runs a single node: the trainer starts whatever it needs itself.
# ---------------------------------------------------------------------------------------------

# Relative recipe paths and data paths in recipes are relative to the caller's directory, as in
# verl; the package is imported from the repo even when it is not installed.
export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"

echo "[run_recipe] repo: ${REPO_ROOT}"
echo "[run_recipe] python: ${PYTHON}"
echo "[run_recipe] running: ${PYTHON} -m verl_npu.cli run $*"
exec "${PYTHON}" -m verl_npu.cli run "$@"
