#!/usr/bin/env bash
# Run a verl-npu recipe: validation first (stops on any problem), then the device, then training.
#
#   bash launch/run_recipe.sh NAME|PATH [key=value ...]
#   bash launch/run_recipe.sh tiny_geo3k                         # CPU demo
#   bash launch/run_recipe.sh my_geo3k.yaml trainer.total_epochs=1
#   bash launch/run_recipe.sh tiny_sft                           # an SFT recipe: detected (verl-npu sft)
#   bash launch/run_recipe.sh --sft my_sft.yaml optim.lr=1e-5     # the same, said explicitly
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

# Multi-node (NNODES > 1) and the Ascend CANN environment: launch/cluster.sh, see docs/multinode.md.
#   NNODES (default 1), NODE_RANK (default 0), MASTER_ADDR (required when NNODES > 1),
#   MASTER_PORT (Ray port, default 6379), NODE_WAIT_TIMEOUT (seconds, default 600).
# With NNODES unset or 1 the launcher runs one node: the trainer starts whatever it needs itself.
source "${REPO_ROOT}/launch/cluster.sh"
source_cann_env

# Relative recipe paths and data paths in recipes are relative to the caller's directory, as in
# verl; the package is imported from the repo even when it is not installed.
export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"

if [[ "${NNODES:-1}" != "1" ]]; then
    run_multinode "$@"
    exit $?
fi

VERB=run
if [[ "${1:-}" == "--sft" ]]; then
    VERB=sft
    shift
fi

echo "[run_recipe] repo: ${REPO_ROOT}"
echo "[run_recipe] python: ${PYTHON}"
echo "[run_recipe] running: ${PYTHON} -m verl_npu.cli ${VERB} $*"
exec "${PYTHON}" -m verl_npu.cli "${VERB}" "$@"
