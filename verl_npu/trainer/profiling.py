"""Step profiling (`global_profiler.*`, `actor_rollout_ref.{actor,ref,rollout}.profiler.*`), verl's meanings.

- `global_profiler.tool` picks the profiler (`torch`: torch.profiler on cpu / cuda and
  torch_npu.profiler on npu, through `verl_npu.device`; `npu`: the same torch_npu profiler,
  NPU runs only; `torch_memory`: the caching allocator's history, dumped as
  `memory_snapshot.pickle` per rank, CUDA / NPU only, options from
  `global_profiler.global_tool_config.torch_memory`); null turns profiling off.
- `global_profiler.steps` names the training steps to profile; `profile_continuous_steps=true`
  keeps one trace running over consecutive profiled steps (named after the first).
- `global_profiler.save_path` (relative paths are under af_output_dir) receives, per profiled step,
  `step_<N>/rank_<R>/`: a Chrome trace `trace.json` (cpu / cuda; open it in https://ui.perfetto.dev
  or chrome://tracing) or torch_npu's own trace folder (npu).
- `<role>.profiler.enable` (role: actor, ref, rollout) with `all_ranks` or `ranks` selects the
  worker processes that record. The actor, the reference model and the rollout engine run in the
  same worker process, so any role enabling it records the whole step of that process (rollout,
  log-probs, update). `<role>.profiler.tool` /
  `save_path` override the global ones when set; `<role>.profiler.tool_config.<tool>.contents`
  adds to the trace: `memory` (allocations), `shapes` (operator input shapes), `stack` (Python
  stacks); CPU and device activity are always recorded.

This module is the controller's side (`StepProfiling`); the worker's side, `WorkerProfiler`, is in
verl_npu/workers/profiler.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from verl_npu.config.rules_profiler import ROLES

log = logging.getLogger("verl_npu")


def _role_setting(cfg: Any, key: str) -> Any:
    """A role's override of a global_profiler setting (the first enabled role that sets it), else the global."""
    for role in ROLES:
        role_cfg = cfg.actor_rollout_ref[role].profiler
        if role_cfg.enable and role_cfg[key] is not None:
            return role_cfg[key]
    return cfg.global_profiler[key]


class StepProfiling:
    """The controller's side: which steps are profiled, where traces go; tells the workers. `cfg` is
    the typed backend config (`actor_rollout_ref`'s roles and `global_profiler`)."""

    def __init__(self, cfg: Any, out_dir: Path, workers: Any):
        gp = cfg.global_profiler
        self.tool = _role_setting(cfg, "tool")
        self.steps = sorted(set(gp.steps or ())) if self.tool else []  # null: no step
        self.continuous = gp.profile_continuous_steps
        # global_profiler.global_tool_config.<tool>: the chosen tool's options (torch_memory's)
        self.options = dict((gp.global_tool_config or {}).get(self.tool) or {}) if self.tool else {}
        save = Path(str(_role_setting(cfg, "save_path"))).expanduser()
        self.root = save if save.is_absolute() else Path(out_dir) / save
        self.workers = workers
        self.active = False

    def before_step(self, step: int) -> None:
        if step in self.steps and not self.active:
            folder = self.root / f"step_{step}"
            self.workers.broadcast("start_profile", str(folder), self.tool, self.options)
            self.active = True

    def after_step(self, step: int, is_last: bool) -> None:
        if not self.active:
            return
        if self.continuous and not is_last and step + 1 in self.steps:
            return
        written = [p for p in self.workers.broadcast("stop_profile") if p]
        self.active = False
        if written:
            log.info("profile of step %d: %s", step, ", ".join(written))

    def close(self) -> None:
        """Stop a trace still running (a run that stopped early)."""
        if self.active:
            self.workers.broadcast("stop_profile")
            self.active = False
