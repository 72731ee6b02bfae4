"""The device layer's tables: the device kinds and their Ray resource names, the environment variables each
device kind's runtime needs set before it starts (with the reason for each) and the memory of one device of
known accelerators.

Data only: which environment table applies to a run is `verl_npu.device_env`'s answer (`env_defaults`,
`apply_env_defaults`, which `device.py` re-exports with the kinds and Ray resources); the memory planner reads
the accelerator tables.
"""

from __future__ import annotations

from typing import NamedTuple

KINDS = ("npu", "cuda", "cpu")
#: Ray resource of one device (cpu: none): every Ray request is built from it; node R also gets `<prefix>R`
RAY_RESOURCES = {"npu": "NPU", "cuda": "GPU", "cpu": None}
NODE_RANK_RESOURCE_PREFIX = "verl_npu_node_rank_"


class EnvDefault(NamedTuple):
    """One environment default: the variable, the value set when the user has not set it, and why."""

    var: str
    value: str
    reason: str


# TOKENIZERS_PARALLELISM applies to every kind.
COMMON_ENV_DEFAULTS: tuple[EnvDefault, ...] = (
    EnvDefault(
        "TOKENIZERS_PARALLELISM",
        "false",
        "Dataloader workers and Ray workers fork after the tokenizer is "
        "used; HF tokenizers then warns and can deadlock. Tokenization here is not the bottleneck.",
    ),
)

NPU_ENV_DEFAULTS: tuple[EnvDefault, ...] = (
    EnvDefault(
        "HCCL_CONNECT_TIMEOUT",
        "1800",
        "HCCL link setup waits only 120 s by default; ranks of an RL job "
        "reach their first collective minutes apart (model loading, vLLM start-up on many nodes) and would "
        "fail with EI0006 socket timeouts.",
    ),
    EnvDefault(
        "HCCL_EXEC_TIMEOUT",
        "3600",
        "A collective may wait while other ranks finish a long rollout or "
        "checkpoint save; the default (1836 s) can abort a healthy run with EI0002 'Notify register times "
        "out'. Note: in AIV expansion mode HCCL caps this at 1091 s.",
    ),
    EnvDefault(
        "TASK_QUEUE_ENABLE",
        "1",
        "Level 1 task queue: works with vLLM-Ascend graph mode (ACLGraph capture "
        "is rejected at level 2) and keeps peak memory lower than level 2. Set 2 yourself for eager-only "
        "runs.",
    ),
    EnvDefault(
        "PYTORCH_NPU_ALLOC_CONF",
        "garbage_collection_threshold:0.95",
        "Training and rollout share each NPU, "
        "so cached blocks are reclaimed before the allocator reports OOM from fragmentation. "
        "expandable_segments is not used because it conflicts with vLLM sleep mode.",
    ),
    EnvDefault(
        "VLLM_ASCEND_ENABLE_NZ",
        "0",
        "The FRACTAL_NZ weight layout breaks in-place weight updates from the "
        "trainer (garbled rollouts after a sync, vllm-ascend #5747).",
    ),
    EnvDefault(
        "USE_OPTIMIZED_MODEL",
        "0",
        "vLLM-Ascend's optimized model classes are not suited to RL training, "
        "where the rollout weights are replaced every step.",
    ),
    EnvDefault(
        "HCCL_HOST_SOCKET_PORT_RANGE",
        "auto",
        "Several processes (trainer and rollout engine) open HCCL "
        "communicators on the same NPU and need distinct host ports.",
    ),
    EnvDefault(
        "HCCL_NPU_SOCKET_PORT_RANGE", "auto", "Same reason as HCCL_HOST_SOCKET_PORT_RANGE, for the device-side sockets."
    ),
)

CUDA_ENV_DEFAULTS: tuple[EnvDefault, ...] = (
    EnvDefault("NCCL_DEBUG", "WARN", "Shows NCCL warnings (e.g. a wrong network interface) without the INFO flood."),
)

CPU_ENV_DEFAULTS: tuple[EnvDefault, ...] = ()
# CPU threads are not an environment default: they depend on the run (workers, allowed cores,
# trainer.cpu_threads), see `verl_npu.device.DeviceInfo.thread_policy`.


#: memory of one device of known accelerators (GiB), what `verl-npu plan` plans for (`--device-memory NAME`)
DEVICE_MEMORY_GIB = {
    "910B": 64,
    "910B1": 64,
    "910B2": 64,
    "910B3": 64,
    "910B4": 32,
    "910C": 64,
    "A100-40": 40,
    "A100-80": 80,
    "A100": 80,
    "H100": 80,
    "H20": 96,
    "H200": 141,
    "L40S": 48,
    "A10": 24,
}
#: the accelerator a plan assumes for a device kind when none is named (torch is not asked: validate stays instant)
DEFAULT_ACCELERATOR = {"npu": "910B", "cuda": "H100"}
