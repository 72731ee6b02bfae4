"""`validate --check-paths`: the tool, interaction and function-tool classes a multi-turn config names,
imported and checked in a separate Python process (`verl_npu.tools.class_check`), each problem reported
like any other key's. A module that exits, crashes or hangs while importing becomes a problem too,
never the end of validate. The agent loops a config may name are built-in names, checked by the
config's rules (agent.agent_loop_config_path, which would name classes, is refused by name)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from verl_npu.config.tree import BC, get
from verl_npu.errors import Problem

MT = BC + "actor_rollout_ref.rollout.multi_turn."
TIMEOUT_S = 120.0   # importing a user's module (and what it imports: torch, transformers) on a busy machine
PATH_KEYS = ("tool_config_path", "interaction_config_path", "function_tool_path")


def class_problems(cfg, skip: frozenset[str] | set[str] = frozenset()) -> list[Problem]:
    """Problems of the classes the config's multi-turn files name (module docstring); keys in `skip`
    (their files already have problems) are not checked."""
    if not get(cfg, MT + "enable"):
        return []
    paths = {k: str(get(cfg, MT + k)) for k in PATH_KEYS if get(cfg, MT + k) and MT + k not in skip}
    if not paths:
        return []
    anchor = MT + next(iter(paths))
    cmd = [sys.executable, "-m", "verl_npu.tools.class_check", json.dumps(paths)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this verl_npu, this cwd
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return [Problem(anchor, f"importing the classes named by {', '.join(paths.values())} did not finish within "
                                f"{TIMEOUT_S:g} s", "find the module that blocks at import (run the check again "
                                                     "with `verl-npu run`, which names it)")]
    lines = done.stdout.strip().splitlines()
    try:
        rows = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except json.JSONDecodeError:
        rows = None
    if rows is None:
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return [Problem(anchor, f"importing the classes named by {', '.join(paths.values())} ended the checking "
                                f"process ({tail[:300]})", "fix the module a class_name names")]
    return [Problem(BC + key, message, fix) for key, message, fix in rows]
