#!/usr/bin/env bash
# The upstream-verl interchange tests (`pytest -m verl_side`): verl 0.9.1's own model merger and
# checkpoint manager against verl-npu's checkpoints, in both directions (docs/checkpoints.md), and
# verl's own policy losses and advantage estimators against verl-npu's on the same inputs
# (tests/algorithms/test_verl_algorithms.py), verl's dapo reward manager's overlong penalty (tests/rewards/test_verl_dapo.py), and
# verl-npu's key table against verl 0.9.1's generated schemas (tests/config/test_verl_key_table.py; the checked-in key
# lists are rewritten by `.venv-verl/bin/python tests/helpers/verl_keys_from_yaml.py`).
# verl's rollout correction: IS weights, rejection masks, metrics, the bypass_mode loss
# (tests/algorithms/test_verl_rollout_correction.py).
# verl's SFT dataset (token ids, assistant-token loss masks), sft_loss with its gradient, and verl's model
# merger on an SFT checkpoint (tests/sft/test_verl_sft.py). verl's on-policy distillation losses and their
# metrics (tests/algorithms/test_verl_distillation.py).
#
# verl pins its own torch and transformers, so it lives in a side venv (.venv-verl, or $VERL_VENV)
# beside the project's: verl==0.9.1 with torch 2.13.0+cpu (about 2.5 minutes to build the first
# time). The tests themselves run in the project's venv (.venv, or $PROJECT_VENV) and call verl as
# a subprocess in the side venv (VERL_SIDE_PYTHON). Finding no such test is a failure, never a
# silent pass.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VERL_VENV:-.venv-verl}"
PROJECT_VENV="${PROJECT_VENV:-.venv}"
VERL_VERSION="0.9.1"
TORCH_VERSION="2.13.0+cpu"

if ! "$VENV/bin/python" -c "import verl.model_merger, torch" >/dev/null 2>&1; then
  echo "verl_side: building $VENV with verl==$VERL_VERSION and torch==$TORCH_VERSION"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" "verl==$VERL_VERSION"
fi

export VERL_SIDE_PYTHON="$PWD/$VENV/bin/python"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false
set +e
"$PROJECT_VENV/bin/python" -m pytest -q -m verl_side -p no:cacheprovider tests/
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "verl_side: no verl_side test was collected; failing" >&2
  exit 1
fi
exit "$status"
