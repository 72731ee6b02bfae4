"""`validate --check-paths`: the tool, interaction and function-tool classes a multi-turn config names,
imported and checked in a separate Python process (`verl_npu.tools.class_check`), each problem reported
like any other key's. A module that exits, crashes or hangs while importing becomes a problem too,
never the end of validate. The custom agent loops of agent.agent_loop_config_path are imported and checked
the same way, by `python -m verl_npu.rollout.custom_loops` (`agent_loop_class_problems`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from verl_npu.config.tree import BC, get
from verl_npu.errors import Problem

MT = BC + "actor_rollout_ref.rollout.multi_turn."
TIMEOUT_S = 120.0  # importing a user's module (and what it imports: torch, transformers) on a busy machine
PATH_KEYS = ("tool_config_path", "interaction_config_path", "function_tool_path")


def class_problems(cfg, skip: frozenset[str] | set[str] = frozenset()) -> list[Problem]:
    """Problems of the classes the config's multi-turn files name (module docstring); keys in `skip`
    (their files already have problems) are not checked."""
    if not get(cfg, MT + "enable"):
        return []
    paths = {k: str(get(cfg, MT + k)) for k in PATH_KEYS if get(cfg, MT + k) and MT + k not in skip}
    if not paths:
        return []
    return _checked_in_subprocess(
        MT + next(iter(paths)), list(paths.values()), ["-m", "verl_npu.tools.class_check", json.dumps(paths)]
    )


def agent_loop_class_problems(cfg, skip: frozenset[str] | set[str] = frozenset()) -> list[Problem]:
    """Problems of the classes agent.agent_loop_config_path names (not importable, not an AgentLoopBase
    subclass, no async run), checked in a process of their own; nothing when the file has shape problems
    (`skip` holds its key)."""
    key = BC + "actor_rollout_ref.rollout.agent.agent_loop_config_path"
    path = get(cfg, key)
    if not path or key in skip:
        return []
    return _checked_in_subprocess(key, [str(path)], ["-m", "verl_npu.rollout.custom_loops", str(path)])


def _checked_in_subprocess(anchor: str, files: list[str], args: list[str]) -> list[Problem]:
    """The [key, message, fix] rows the checking module prints, as Problems; a checker that hangs, crashes or
    exits is one Problem at `anchor`."""
    named = ", ".join(files)
    cmd = [sys.executable, *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this verl_npu, this cwd
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return [
            Problem(
                anchor,
                f"importing the classes named by {named} did not finish within {TIMEOUT_S:g} s",
                "find the module that blocks at import (run the check again with `verl-npu run`, which names it)",
            )
        ]
    lines = done.stdout.strip().splitlines()
    try:
        rows = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except json.JSONDecodeError:
        rows = None
    if rows is None:
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return [
            Problem(
                anchor,
                f"importing the classes named by {named} ended the checking process ({tail[:300]})",
                "fix the module a class_name names",
            )
        ]
    return [Problem(BC + key, message, fix) for key, message, fix in rows]
