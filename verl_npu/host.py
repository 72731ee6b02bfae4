"""The host machine, whatever the device: the cores this process may use, the CPU thread policy of a run's
processes (docs/performance.md, "CPU threads") and the host's memory. No device kind is asked here; the device
layer (`verl_npu.device`) builds its answers on these and re-exports them.

Only the stdlib is imported at module level (torch lazily, in `set_torch_threads`)."""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

#: bytes in one GiB (every GiB figure of the host and device layers divides by it)
GIB = float(1 << 30)


def host_memory_bytes() -> int:
    """This machine's memory (MemTotal; sysconf elsewhere), 0 when unknown: what a CPU run plans for."""
    return int(cpu_memory_gb()["total_gb"] * GIB)


# ----------------------------------------------------------------------------------------------
# CPU threads (docs/performance.md, "CPU threads")

#: what makes OpenMP threads sleep instead of spin while they wait for work: a spinning thread
#: keeps its core from the process it waits for, and on a busy machine a step then takes 10-20x
#: longer. Read by the OpenMP runtime when torch is first imported: set before that, in every process.
PASSIVE_WAIT_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}
#: thread-count variables a user may set; the first one set wins over verl-npu's choice
THREAD_COUNT_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def allowed_cores(cgroup_root: str = "/sys/fs/cgroup") -> tuple[int, str]:
    """The cores this process may use and what limits them: the CPUs of its affinity mask
    (`taskset`, Slurm, a container's cpuset) and a cgroup quota (cgroup v2 `cpu.max`, v1
    `cpu.cfs_quota_us` / `cpu.cfs_period_us`) rounded up, whichever is smaller. Not `os.cpu_count()`,
    which counts the machine's cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    why = f"affinity {cores}"
    quota = None
    try:
        text = Path(cgroup_root, "cpu.max").read_text().split()
        if text and text[0] != "max":
            quota = int(text[0]) / int(text[1])
    except (OSError, ValueError, IndexError):
        try:
            q = int(Path(cgroup_root, "cpu", "cpu.cfs_quota_us").read_text())
            quota = q / int(Path(cgroup_root, "cpu", "cpu.cfs_period_us").read_text()) if q > 0 else None
        except (OSError, ValueError, ZeroDivisionError):
            quota = None
    if quota is not None:
        why += f", cgroup quota {quota:g}"
        cores = min(cores, max(1, -(-int(quota * 1000) // 1000)))
    return max(1, cores), why


@dataclass(frozen=True)
class ThreadPolicy:
    """The CPU threads of each process of a run: `intra_op` threads per worker process (torch's
    intra-op pool, what OpenMP runs a kernel on), `inter_op` (torch's inter-op pool), `workers`
    compute processes sharing `cores` allowed cores, and where the count came from (`source`)."""

    intra_op: int
    inter_op: int
    workers: int
    cores: int
    cores_why: str
    source: str

    def env(self) -> dict[str, str]:
        """The variables every process of the run gets (workers through Ray's runtime_env, spawned
        ranks by inheritance): the chosen thread count (a user's OMP_NUM_THREADS was already weighed
        in choosing it) and the passive wait, where the user has not set a wait variable."""
        waits = {var: os.environ.get(var, value) for var, value in PASSIVE_WAIT_ENV.items()}
        return {**waits, "OMP_NUM_THREADS": str(self.intra_op)}

    def describe(self) -> str:
        over = " (more threads than cores: they will compete)" if self.intra_op * self.workers > self.cores else ""
        return (
            f"{self.intra_op} intra-op + {self.inter_op} inter-op thread(s) per process x {self.workers} "
            f"worker process(es) on {self.cores} allowed core(s) ({self.cores_why}){over}; from {self.source}; "
            f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', PASSIVE_WAIT_ENV['OMP_WAIT_POLICY'])}. "
            f"Override: trainer.cpu_threads or OMP_NUM_THREADS"
        )


def set_passive_wait(env: MutableMapping[str, str] | None = None) -> list[str]:
    """Set `PASSIVE_WAIT_ENV` in `env` (default `os.environ`) where the user has not; call before
    torch is imported. Returns the variables set."""
    env = os.environ if env is None else env
    applied = [var for var in PASSIVE_WAIT_ENV if var not in env]
    for var in applied:
        env[var] = PASSIVE_WAIT_ENV[var]
    return applied


def set_torch_threads(intra_op: int, inter_op: int = 1) -> None:
    """Size torch's thread pools in this process. The inter-op pool can be sized only before its
    first use; a process where it already ran keeps its size."""
    import torch

    torch.set_num_threads(int(intra_op))
    try:
        torch.set_num_interop_threads(int(inter_op))
    except RuntimeError:  # already started in this process
        pass


def _proc_kib(path: str, field: str) -> int | None:
    """The value in KiB of `field:` in a /proc file such as /proc/self/status, or None."""
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def cpu_memory_gb() -> dict[str, float]:
    """Process and host memory on CPU (Linux /proc; getrusage / sysconf elsewhere)."""
    rss_kib = _proc_kib("/proc/self/status", "VmRSS")
    peak_kib = _proc_kib("/proc/self/status", "VmHWM")
    if peak_kib is None:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak_kib = peak // 1024 if sys.platform == "darwin" else peak  # macOS reports bytes
    if rss_kib is None:
        rss_kib = peak_kib
    total_kib = _proc_kib("/proc/meminfo", "MemTotal")
    free_kib = _proc_kib("/proc/meminfo", "MemAvailable")
    if total_kib is None:
        try:
            page = os.sysconf("SC_PAGE_SIZE")
            total_kib = os.sysconf("SC_PHYS_PAGES") * page // 1024
            free_kib = os.sysconf("SC_AVPHYS_PAGES") * page // 1024
        except (ValueError, OSError, AttributeError):
            total_kib = free_kib = 0
    to_gb = 1024.0 / GIB
    return {
        "allocated_gb": rss_kib * to_gb,
        "reserved_gb": rss_kib * to_gb,
        "peak_gb": max(peak_kib, rss_kib) * to_gb,
        "free_gb": (free_kib or 0) * to_gb,
        "total_gb": total_kib * to_gb,
    }
