"""A worker's side of step profiling: records this process when an enabled role's profiler selects
its rank (`<role>.profiler.*`; what the keys mean, and the controller's side, `StepProfiling`: see
verl_npu/trainer/profiling.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_npu.config.rules_profiler import ROLES, TOOLS


def role_profiles_rank(profiler_cfg: Any, rank: int) -> bool:
    """Whether a role's profiler section (`<role>.profiler`) selects this rank."""
    return profiler_cfg.enable and (profiler_cfg.all_ranks or rank in profiler_cfg.ranks)


class WorkerProfiler:
    """A worker's side: records when an enabled role selects this rank. `arr_cfg` is the
    `actor_rollout_ref` section (its roles' `profiler` sections)."""

    def __init__(self, arr_cfg: Any, rank: int, device: Any):
        self.device = device
        self.rank = rank
        roles = [arr_cfg[role].profiler for role in ROLES]
        self.enabled = any(role_profiles_rank(r, rank) for r in roles)
        contents: set[str] = set()
        for role_cfg in roles:
            if role_profiles_rank(role_cfg, rank):
                for tool in TOOLS:  # tool_config is free-form: {tool: {contents: [...]}}
                    contents.update(str(c) for c in ((role_cfg.tool_config.get(tool) or {}).get("contents") or []))
        self.contents = sorted(contents)
        self._running = None

    def start(self, folder: str, tool: str = "torch", options: dict | None = None) -> None:
        if not self.enabled or self._running is not None:
            return
        out = Path(folder) / f"rank_{self.rank}"
        out.mkdir(parents=True, exist_ok=True)
        if tool == "torch_memory":
            self._running = MemorySnapshot(self.device, out, options or {})
        else:
            self._running = self.device.start_profiler(out, self.contents)

    def stop(self) -> str | None:
        if self._running is None:
            return None
        running, self._running = self._running, None
        return str(running.stop())


class MemorySnapshot:
    """`global_profiler.tool=torch_memory`: the device caching allocator's history (every allocation and
    free, with its Python stack) recorded from start to stop, then dumped as `memory_snapshot.pickle`
    (drag it into https://pytorch.org/memory_viz). The device's memory module answers: `torch.cuda.memory`
    on CUDA, torch_npu's `torch.npu.memory` on NPU (the validator refuses the tool on CPU).
    `options`: global_tool_config.torch_memory (`trace_alloc_max_entries`, default 100000; `stack_depth`
    0 records no stacks)."""

    def __init__(self, device: Any, out_dir: Path, options: dict):
        self.memory = device.torch_module.memory
        self.path = Path(out_dir) / "memory_snapshot.pickle"
        with_stacks = int(options.get("stack_depth", 32) or 0) > 0
        self.memory._record_memory_history(
            enabled="all",
            context="all" if with_stacks else None,
            stacks="all" if with_stacks else "python",
            max_entries=int(options.get("trace_alloc_max_entries", 100_000)),
        )

    def stop(self) -> Path:
        try:
            self.memory._dump_snapshot(str(self.path))
        finally:
            self.memory._record_memory_history(enabled=None)
        return self.path
