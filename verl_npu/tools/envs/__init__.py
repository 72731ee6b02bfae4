"""ROLL-style text environments: small seeded grid games the model plays one action per turn.

`make_env(name, seed, **options)` builds one; every environment has

    reset() -> str                         the first observation (text)
    step(action: str | None) -> StepResult the next observation, the step's reward, done, success, info
    parse_action(text) -> str | None       the action a model turn names, None when malformed

Built-in: `frozen_lake` (`verl_npu.tools.envs.frozen_lake`) and `sokoban` (`verl_npu.tools.envs.sokoban`).
An environment is deterministic for its seed: the same seed gives the same map, and the same actions
the same observations and rewards. The model meets them through the `grid_env` interaction
(`verl_npu.tools.interactions.grid_env`, docs/agents.md).
"""

from __future__ import annotations

from verl_npu.tools.envs.grid import ACTIONS, GridEnv, StepResult, parse_action

ENVS = {"frozen_lake": "verl_npu.tools.envs.frozen_lake:FrozenLake", "sokoban": "verl_npu.tools.envs.sokoban:Sokoban"}


def env_class(name: str) -> type:
    """The class of built-in environment `name` (KeyError for an unknown name)."""
    import importlib

    module, _, cls = ENVS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def make_env(name: str, seed: int = 0, **options) -> GridEnv:
    """Environment `name` for `seed`, with its options (size, map, ...)."""
    return env_class(name)(seed=seed, **options)


__all__ = ["ACTIONS", "ENVS", "GridEnv", "StepResult", "env_class", "make_env", "parse_action"]
