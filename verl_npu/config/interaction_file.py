"""verl's interaction config file read without importing any interaction (config layer: standard library
and PyYAML only).

The file is verl's YAML (`actor_rollout_ref.rollout.multi_turn.interaction_config_path`)::

    interaction:
      - name: gsm8k                                       # optional; rows choose it by extra_info.interaction_kwargs.name
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction   # or gsm8k, my.py:Cls, pkg.mod.Cls
        config: {}                                        # handed to the constructor (with name added)

`name` defaults as in verl: the class's own name, less a trailing `Interaction`, lower-cased
(`Gsm8kInteraction` -> `gsm8k`). `class_name` is a built-in interaction (`BUILTIN_INTERACTIONS`: `gsm8k`,
`grid_env`), verl's class path of one (`VERL_CLASS_PATHS`), `path/to/file.py:ClassName` (relative to the
folder the run starts in) or `package.module.ClassName`.

The built-in `grid_env` interaction (ROLL-style environments) has its `config` keys checked here too:
`GRID_ENV_KEYS` are read; ROLL's environment-manager keys that mean something else in verl's language are
refused by name with where they go (`ROLL_KEYS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl_npu import tool_registry

KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"

#: built-in interactions: name -> "module:Class" (imported only when a run builds them)
BUILTIN_INTERACTIONS = {
    "gsm8k": "verl_npu.tools.interactions.gsm8k:Gsm8kInteraction",
    "grid_env": "verl_npu.tools.interactions.grid_env:GridEnvInteraction",
}
#: verl's class paths of interactions verl-npu ships: a verl interaction config names them unchanged
VERL_CLASS_PATHS = {"verl.interactions.gsm8k_interaction.Gsm8kInteraction": "gsm8k"}
#: the built-in environments of the grid_env interaction (verl_npu.tools.envs.ENVS)
GRID_ENVS = ("frozen_lake", "sokoban")
#: grid_env's config keys: meaning
GRID_ENV_KEYS = {
    "name": "the interaction's name (set by the entry's name)",
    "env": "default environment of rows whose interaction_kwargs have no env: frozen_lake or sokoban",
    "env_config": "default environment options (size, hole_ratio, ...); a row's interaction_kwargs override them",
    "max_steps": "most environment steps per episode (ROLL's max_steps of an environment); default 8",
    "format_penalty": "added to a turn's score when the turn is not one move (ROLL's format_penalty); default -0.1",
    "max_tokens_per_step": "most tokens of one model turn (ROLL's max_tokens_per_step); a longer turn is cut "
    "there and read as it is; null: only the response budget",
}
#: ROLL environment-manager keys that a grid_env config may not carry: what to do instead
ROLL_KEYS = {
    "group_size": "the samples per environment seed are actor_rollout_ref.rollout.n (each row's environment seed is "
    "shared by its n samples: GRPO's group)",
    "env_groups": "the environments per step are the prompt rows per step: data.train_batch_size",
    "n_groups": "the environments per step are the prompt rows per step: data.train_batch_size",
    "tags": "a row chooses its environment with extra_info.interaction_kwargs.env (frozen_lake or sokoban)",
    "max_traj_per_env": "not built: each row's environment runs exactly actor_rollout_ref.rollout.n trajectories",
    "worker_cls": "not built: write an interaction class (docs/agents.md, 'Writing an interaction') and name it "
    "in class_name",
    "is_slippery": "not built: the FrozenLake grid is not slippery; remove it",
}


@dataclass
class InteractionEntry:
    """One `interaction:` entry, checked for shape."""

    index: int
    name: str
    class_name: str
    config: dict = field(default_factory=dict)
    where: str = ""  # "<file>: interaction[i]"

    @property
    def builtin(self) -> str | None:
        if self.class_name in BUILTIN_INTERACTIONS:
            return self.class_name
        return VERL_CLASS_PATHS.get(self.class_name)


def class_target(class_name: str) -> tuple[str, str, str]:
    """(kind, where, class) of an interaction's class_name (`verl_npu.tool_registry.class_target`'s rules)."""
    return tool_registry.class_target(class_name, BUILTIN_INTERACTIONS, VERL_CLASS_PATHS)


def default_name(class_name: str) -> str:
    """verl's default interaction name: the class name less a trailing 'Interaction', lower-cased."""
    if class_name in BUILTIN_INTERACTIONS:
        return class_name
    simple = class_name.replace(":", ".").split(".")[-1]
    return (simple[: -len("Interaction")] if simple.endswith("Interaction") else simple).lower()


def grid_env_problems(config: dict, key: str) -> list[tuple[str, str]]:
    """Problems of a grid_env interaction's config: ROLL keys by name, unknown keys, bad values."""
    out = []
    for k in config:
        if k in ROLL_KEYS:
            out.append((f"{key}.{k}", f"is ROLL's environment-manager key: {ROLL_KEYS[k]}"))
        elif k not in GRID_ENV_KEYS:
            out.append((f"{key}.{k}", f"is not a grid_env key; its keys: {', '.join(GRID_ENV_KEYS)}"))
    env = config.get("env")
    if env is not None and env not in GRID_ENVS:
        out.append((f"{key}.env", f"is {env!r}; the environments: {', '.join(GRID_ENVS)}"))
    for k, low in (("max_steps", 1), ("max_tokens_per_step", 1)):
        v = config.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < low):
            out.append((f"{key}.{k}", f"is {v!r}; it must be an integer >= {low}"))
    fp = config.get("format_penalty")
    if fp is not None and (not isinstance(fp, (int, float)) or isinstance(fp, bool) or fp > 0):
        out.append((f"{key}.format_penalty", f"is {fp!r}; it must be a number <= 0 (a penalty)"))
    if config.get("env_config") is not None and not isinstance(config.get("env_config"), dict):
        out.append((f"{key}.env_config", "must be a mapping of environment options (size: 3, ...)"))
    return out


def read_interaction_config(path) -> tuple[list[InteractionEntry], list[tuple[str, str]]]:
    """(entries, problems) of an interaction config file; a problem is (where, what is wrong), `where`
    naming the file and the entry's key. Nothing is imported (module classes are only looked up)."""
    path, items, problems = tool_registry.listed_mappings(
        path, "interaction", ("name", "class_name", "config"), "interaction", non_empty=True
    )
    entries, names = [], {}  # type: list, dict[str, int]
    for i, key, item in items:
        class_problems = tool_registry.class_name_problems(
            item.get("class_name"),
            f"{key}.class_name",
            what="interaction",
            builtins=BUILTIN_INTERACTIONS,
            verl_paths=VERL_CLASS_PATHS,
            verl_hint=f"the built-in interactions are {', '.join(BUILTIN_INTERACTIONS)} (and "
            f"{', '.join(VERL_CLASS_PATHS)}); for your own, change its import to `from "
            "verl_npu.tools.interactions import BaseInteraction` and name it path/to/file.py:ClassName",
        )
        problems += class_problems
        config = item.get("config") or {}
        if not isinstance(config, dict):
            problems.append((f"{key}.config", "must be a mapping"))
            config = {}
        class_name = str(item.get("class_name"))
        name = item.get("name")
        if name is None:
            name = default_name(class_name)
        if not isinstance(name, str) or not name.strip():
            problems.append((f"{key}.name", f"is {name!r}; it must be a non-empty string"))
            name = str(name)
        if name in names:
            problems.append(
                (f"{key}.name", f"{name!r} is also the name of interaction[{names[name]}]; names must be unique")
            )
        names.setdefault(name, i)
        entry = InteractionEntry(i, name, class_name, dict(config), key)
        if entry.builtin == "grid_env":
            problems += grid_env_problems(config, f"{key}.config")
        entries.append(entry)
    return entries, problems


def row_interaction_problem(kwargs: Any, names: list[str]) -> str | None:
    """What is wrong with a row's extra_info.interaction_kwargs when an interaction config is set, or None."""
    if not isinstance(kwargs, dict) or not kwargs.get("name"):
        return (
            f"extra_info.interaction_kwargs has no name; with {KEY} set, every multi-turn row names its "
            f"interaction ({', '.join(names)}) in extra_info.interaction_kwargs.name"
        )
    if kwargs["name"] not in names:
        return (
            f"extra_info.interaction_kwargs.name is {kwargs['name']!r}, which the interaction config does not "
            f"define (its interactions: {', '.join(names)}); fix the row or add the interaction"
        )
    return None
