"""A worker's side of step profiling: records this process when an enabled role's profiler selects
its rank (`<role>.profiler.*`; what the keys mean, and the controller's side, `StepProfiling`: see
verl_npu/trainer/profiling.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_npu.config.rules_profiler import ROLES, TOOLS


def cfg_value(node: Any, key: str, default: Any = None) -> Any:
    """`node.key` (`default` when `node` is None or the value is missing or null)."""
    value = node.get(key, default) if node is not None else default
    return default if value is None else value


def role_profiles_rank(role_cfg: Any, rank: int) -> bool:
    """Whether a role's profiler config selects this rank."""
    if not cfg_value(role_cfg, "enable", False):
        return False
    return bool(cfg_value(role_cfg, "all_ranks", False)) or rank in [int(r) for r in cfg_value(role_cfg, "ranks", [])]


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
                tool_config = cfg_value(role_cfg, "tool_config", {}) or {}
                for tool in TOOLS:
                    contents.update(str(c) for c in (cfg_value(tool_config.get(tool), "contents", []) or []))
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
