"""The custom agent loop config file (`actor_rollout_ref.rollout.agent.agent_loop_config_path`, verl 0.9.1's
format): a YAML list of `{name: <agent_name>, _target_: <class>, ...}` entries, read and checked for shape
without importing anything (the classes are imported by `verl_npu.rollout.custom_loops`, and by `verl-npu
validate --check-paths` in a process of its own: `class_check.agent_loop_class_problems`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

KEY = "actor_rollout_ref.rollout.agent.agent_loop_config_path"


@dataclass
class LoopEntry:
    """One entry of an agent loop config file, checked for shape."""

    name: str
    target: str
    kwargs: dict = field(default_factory=dict)
    where: str = ""


def read_agent_loop_config(path: str | os.PathLike) -> tuple[list[LoopEntry], list[tuple[str, str]]]:
    """(entries, problems) of an agent loop config file: a YAML list of mappings with `name` and `_target_`
    (further keys: constructor arguments); a problem is (where, what is wrong). Nothing is imported."""
    import yaml

    path = Path(os.path.expanduser(str(path)))
    if not path.is_file():
        return [], [(str(path), "the agent loop config file does not exist")]
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        return [], [(str(path), f"is not valid YAML: {str(err).splitlines()[0]}")]
    if not isinstance(data, list) or not data:
        return [], [
            (
                str(path),
                "must be a non-empty YAML list of agent loops ([{name: <agent_name>, "
                "_target_: package.module.Class or path/to/file.py:Class}, ...])",
            )
        ]
    entries, problems, seen = [], [], set()
    for i, item in enumerate(data):
        where = f"{path}: [{i}]"
        if not isinstance(item, dict):
            problems.append((where, "must be a mapping with name and _target_"))
            continue
        name, target = item.get("name"), item.get("_target_")
        if not isinstance(name, str) or not name.strip():
            problems.append((f"{where}.name", "must be the agent_name the rows use (a non-empty string)"))
        elif name in seen:
            problems.append((f"{where}.name", f"{name!r} is named twice"))
        if not isinstance(target, str) or not target.strip():
            problems.append(
                (f"{where}._target_", "must name the loop class: package.module.Class or path/to/file.py:Class")
            )
        if isinstance(name, str) and isinstance(target, str) and name.strip() and target.strip():
            seen.add(name)
            entries.append(
                LoopEntry(name, target, {k: v for k, v in item.items() if k not in ("name", "_target_")}, where)
            )
    return entries, problems


def loop_names(path) -> list[str]:
    """The agent names the file at `path` declares ([] when it cannot be read)."""
    return [e.name for e in read_agent_loop_config(path)[0]] if path else []
