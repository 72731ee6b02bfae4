"""Step profiling (`global_profiler.*`, `actor_rollout_ref.{actor,ref,rollout}.profiler.*`), verl's meanings.

- `global_profiler.tool` picks the profiler (`torch`: torch.profiler on cpu / cuda and
  torch_npu.profiler on npu, through `verl_npu.device`; `npu`: the same torch_npu profiler,
  NPU runs only); null turns profiling off.
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
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("verl_npu")

#: tools that run here, and the device kinds each runs on.
TOOLS = {"torch": ("cpu", "cuda", "npu"), "npu": ("npu",)}
#: verl's other tools: refused by name, with the reason.
REFUSED_TOOLS = {
    "nsys": "Nsight Systems must wrap each Ray worker process at start-up, which verl-npu does not do; "
            "use global_profiler.tool=torch (CUDA kernels are in its trace)",
    "torch_memory": "memory snapshots are not implemented; use global_profiler.tool=torch with "
                    "<role>.profiler.tool_config.torch.contents=[memory]",
    "precision_debugger": "msprobe's precision debugger is not integrated; use global_profiler.tool=torch",
    "memray": "memray traces are not implemented; use global_profiler.tool=torch with contents=[memory]",
}
CONTENTS = ("cpu", "cuda", "npu", "memory", "shapes", "stack")
ROLES = ("actor", "ref", "rollout")


def _get(node: Any, key: str, default: Any = None) -> Any:
    value = node.get(key, default) if node is not None else default
    return default if value is None else value


def role_profiles_rank(role_cfg: Any, rank: int) -> bool:
    """Whether a role's profiler config selects this rank."""
    if not _get(role_cfg, "enable", False):
        return False
    return bool(_get(role_cfg, "all_ranks", False)) or rank in [int(r) for r in _get(role_cfg, "ranks", [])]


def _role_setting(cfg: Any, key: str) -> Any:
    """A role's override of a global_profiler setting (the first enabled role that sets it), else the global."""
    for role in ROLES:
        role_cfg = cfg.actor_rollout_ref[role].get("profiler")
        if _get(role_cfg, "enable", False) and _get(role_cfg, key) is not None:
            return _get(role_cfg, key)
    return _get(cfg.get("global_profiler"), key)


class StepProfiling:
    """The controller's side: which steps are profiled, where traces go; tells the workers."""

    def __init__(self, cfg: Any, out_dir: Path, workers: Any):
        gp = cfg.get("global_profiler")
        self.tool = _role_setting(cfg, "tool")
        self.steps = sorted({int(s) for s in _get(gp, "steps", [])}) if self.tool else []
        self.continuous = bool(_get(gp, "profile_continuous_steps", False))
        save = Path(str(_role_setting(cfg, "save_path") or "profile")).expanduser()
        self.root = save if save.is_absolute() else Path(out_dir) / save
        self.workers = workers
        self.active = False

    def before_step(self, step: int) -> None:
        if step in self.steps and not self.active:
            folder = self.root / f"step_{step}"
            self.workers.broadcast("start_profile", str(folder))
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


class WorkerProfiler:
    """A worker's side: records when an enabled role selects this rank."""

    def __init__(self, cfg: Any, rank: int, device: Any):
        self.device = device
        self.rank = rank
        roles = [cfg.actor_rollout_ref[role].get("profiler") for role in ROLES]
        self.enabled = any(role_profiles_rank(r, rank) for r in roles)
        contents: set[str] = set()
        for role_cfg in roles:
            if role_profiles_rank(role_cfg, rank):
                tool_config = _get(role_cfg, "tool_config", {}) or {}
                for tool in TOOLS:
                    contents.update(str(c) for c in (_get(tool_config.get(tool), "contents", []) or []))
        self.contents = sorted(contents)
        self._running = None

    def start(self, folder: str) -> None:
        if not self.enabled or self._running is not None:
            return
        out = Path(folder) / f"rank_{self.rank}"
        out.mkdir(parents=True, exist_ok=True)
        self._running = self.device.start_profiler(out, self.contents)

    def stop(self) -> str | None:
        if self._running is None:
            return None
        running, self._running = self._running, None
        return str(running.stop())


# ---- config checks (called by verl_npu.config.rules; nothing here imports torch) -------------------
def _device_kind(requested: Any) -> str:
    from verl_npu.device import detect_device

    try:
        return detect_device(requested).kind
    except Exception:  # noqa: BLE001 - a bad trainer.device is reported by its own check
        return str(requested)


def config_problems(c, gp: str, roles: dict[str, str], device_key: str, world: int):
    """(key, message, fix) for profiler settings that cannot run here or would record nothing.
    `c(key)` reads a full key; `gp` / `roles[role]` are the full prefixes of global_profiler. and
    actor_rollout_ref.<role>.profiler."""
    enabled = [role for role, p in roles.items() if c(p + "enable")]
    tool_keys = [gp + "tool"] + [roles[r] + "tool" for r in enabled]
    kind = None
    for key in tool_keys:
        tool = c(key)
        if tool is None:
            continue
        if tool in REFUSED_TOOLS:
            why, _, fix = REFUSED_TOOLS[tool].partition("; ")
            yield key, f"verl-npu does not support the {tool} profiler: {why}", fix
        elif tool not in TOOLS:
            yield key, f"{tool!r} is not one of {', '.join(TOOLS)}", "use global_profiler.tool=torch"
        else:
            kind = kind or _device_kind(c(device_key))
            if kind not in TOOLS[tool]:
                yield (key, f"the {tool} profiler runs on {' / '.join(TOOLS[tool])} devices, this run is on {kind}",
                       "use global_profiler.tool=torch (torch_npu.profiler on NPU runs)")
    tool = next((c(k) for k in reversed(tool_keys) if c(k) is not None), None)
    steps = c(gp + "steps") or []
    if tool is not None and not enabled:
        yield (gp + "tool", f"is {tool} but no role records: nothing would be profiled",
               "set actor_rollout_ref.actor.profiler.enable=true and .all_ranks=true (or .ranks=[0])")
    if tool is not None and not steps:
        yield (gp + "steps", f"is empty while global_profiler.tool={tool}: nothing would be profiled",
               "name the steps, e.g. global_profiler.steps=[2]")
    if enabled and tool is None:
        yield (gp + "tool", f"is null while {enabled[0]}.profiler.enable=true: nothing would be profiled",
               "set global_profiler.tool=torch (and global_profiler.steps)")
    if any(int(s) < 1 for s in steps):
        yield gp + "steps", f"{steps}: training steps count from 1", "use steps >= 1"
    for role in enabled:
        p = roles[role]
        ranks = c(p + "ranks") or []
        if not c(p + "all_ranks") and not ranks:
            yield (p + "ranks", f"is empty and {role}.profiler.all_ranks is false: no rank would record",
                   f"set actor_rollout_ref.{role}.profiler.all_ranks=true or ranks=[0]")
        bad = [r for r in ranks if not 0 <= r < world]
        if bad:
            yield p + "ranks", f"{bad} outside the {world} ranks of this run", f"use ranks in 0..{world - 1}"
        for tool_name, options in (c(p + "tool_config") or {}).items():
            contents = options.get("contents") if isinstance(options, dict) else None
            unknown = [x for x in (contents or []) if x not in CONTENTS]
            if tool_name in TOOLS and unknown:
                yield (p + "tool_config", f"{tool_name}.contents has {unknown}, not among {', '.join(CONTENTS)}",
                       "use memory, shapes and/or stack")
