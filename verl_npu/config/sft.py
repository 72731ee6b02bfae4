"""Load an SFT recipe: defaults (`sft_schema`) <- recipe <- `key=value` overrides, every problem found at once.

`load_sft_recipe(name_or_path, overrides) -> SFTRecipe` reads the YAML, maps verl's older `fsdp_sft_trainer`
spellings onto verl 0.9.1's keys (a warning naming both), refuses unknown keys (with the closest known one),
checks types, choices and limits, refuses keys verl-npu does not build unless at their off value, checks how the
keys relate, and derives the settings left unset (`derived`). `is_sft_recipe` tells an SFT recipe from an RL one:
its backend_config has verl's SFT sections (model / engine / optim / checkpoint) and no actor_rollout_ref.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_npu.config.key import BOOL, DICT, FLOAT, FLOAT_LIST, INT, STR, STR_LIST, STR_OR_LIST, Key
from verl_npu.config.overrides import DELETE, parse_value
from verl_npu.config.sft_schema import (  # noqa: F401 - is_sft_tree: this module's face too
    BC,
    EPOCH_FREQ,
    EPOCH_FREQ_KEYS,
    KEYS,
    LEGACY,
    LEGACY_REFUSED,
    NOOP_SECTIONS,
    SECTIONS,
    defaults_tree,
    is_sft_tree,
)
from verl_npu.config.tree import is_placeholder, read_yaml_file, set_path
from verl_npu.errors import ConfigErrors, Problem, UserError

_TOP_LEGACY = ("use_remove_padding", "ulysses_sequence_parallel_size")
#: verl's Hydra config groups of the SFT config and the one choice of each that verl-npu builds
HYDRA_GROUPS = {"engine": "fsdp", "optim": "fsdp", "model": "hf_model"}


def is_sft_recipe(name_or_path: str | Path) -> bool:
    """Whether the recipe (a shipped name or a path) is an SFT recipe (`is_sft_tree`)."""
    from verl_npu.config.recipes import find_recipe

    return is_sft_tree(read_yaml_file(find_recipe(name_or_path)))


class Node:
    """A read-only section of the resolved SFT config: attributes by key name (`cfg.data.max_length`); an unknown
    name fails naming it. Pickles (it travels to the worker processes)."""

    def __init__(self, path: str, tree: dict):
        object.__setattr__(self, "_path_", path)
        for name, value in tree.items():
            object.__setattr__(
                self,
                name,
                Node(f"{path}.{name}", value) if isinstance(value, dict) and f"{path}.{name}" not in KEYS else value,
            )

    def __setattr__(self, name, value):
        raise AttributeError(f"{self._path_} is read-only")

    def __getattr__(self, name):
        raise AttributeError(f"{self._path_.removeprefix(BC)} has no key {name!r}")

    def __reduce__(self):
        return (Node, (self._path_, self.as_dict()))

    def as_dict(self) -> dict:
        return {k: (v.as_dict() if isinstance(v, Node) else v) for k, v in vars(self).items() if k != "_path_"}


@dataclass
class SFTRecipe:
    """A loaded, validated SFT recipe: `typed` (the backend config as read-only `Node`s: what the SFT loop reads),
    `tree` (the whole recipe, plain), `derived` [(key, value, reason)], `warnings` (older spellings mapped),
    `source` (the file), `world_size` (trainer.nnodes x trainer.n_gpus_per_node)."""

    tree: dict
    source: Path
    derived: list[tuple[str, Any, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def typed(self) -> Node:
        return Node("backend_config", self.tree["backend_config"])

    @property
    def out_dir(self) -> Path:
        return Path(os.path.expanduser(str(self.tree["af_output_dir"])))

    @property
    def world_size(self) -> int:
        t = self.tree["backend_config"]["trainer"]
        return int(t["nnodes"]) * int(t["n_gpus_per_node"])

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.tree, sort_keys=False)


def _full(key: str) -> str:
    head = key.split(".")[0]
    if head in SECTIONS or key in _TOP_LEGACY:
        return BC + key
    return key


def _flatten(node: Any, prefix: str, out: dict[str, Any]) -> None:
    """Leaves of the user's tree as {full key: value}; a dict-typed key or a no-op section stays whole."""
    if isinstance(node, dict) and not node and prefix not in KEYS:
        return  # an empty section
    if isinstance(node, dict) and prefix not in KEYS and prefix not in NOOP_SECTIONS and node:
        for k, v in node.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = node


_PY = {INT: (int,), FLOAT: (int, float), BOOL: (bool,), STR: (str,), DICT: (dict,)}


def _type_problem(key: Key, value: Any) -> str | None:
    """What is wrong with `value`'s type for `key`, or None."""
    if value is None:
        return None if key.allows_null else "must be set (null is not allowed)"
    if key.type in (STR_LIST, FLOAT_LIST):
        inner = (str,) if key.type == STR_LIST else (int, float)
        ok = isinstance(value, list) and all(isinstance(v, inner) and not isinstance(v, bool) for v in value)
    elif key.type == STR_OR_LIST:
        ok = isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    else:
        ok = isinstance(value, _PY[key.type]) and (key.type == BOOL or not isinstance(value, bool))
    return None if ok else f"must be {key.type}, got {value!r}"


def _value_problems(key: Key, value: Any, user_set: bool) -> list[Problem]:
    short = key.short
    if key.required and (value is None or is_placeholder(value)):
        return [Problem(key.path, "is required" + (" (it still holds a placeholder)" if value else ""), f"set {short}")]
    if is_placeholder(value):  # an optional key too: a placeholder is never a value (it would be read as a path)
        return [
            Problem(
                key.path,
                f"still holds the placeholder {value!r}",
                f"edit it in the recipe, pass {short}=<your value>, or {short}=null to leave it unset",
            )
        ]
    if key.path in EPOCH_FREQ_KEYS and value == EPOCH_FREQ:
        return []
    bad = _type_problem(key, value)
    if bad:
        return [Problem(key.path, bad, f"see {short} in docs/sft.md")]
    if value is None:
        return []
    if key.off_only and value != key.default:
        return [
            Problem(
                key.path,
                f"{key.off_only} is not supported yet in verl-npu's SFT (got {value!r})",
                key.instead or f"leave it {key.default!r}",
            )
        ]
    items = value if isinstance(value, list) and key.type == STR_LIST else [value]
    for item in items:
        if item in key.unsupported:
            return [Problem(key.path, f"{item!r} is not supported in verl-npu", key.instead)]
        if key.choices and item not in key.choices:
            return [
                Problem(
                    key.path,
                    f"{item!r} is not one of {', '.join(map(str, key.choices))}",
                    key.instead or f"use one of {', '.join(map(str, key.choices))}",
                )
            ]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if key.min is not None and value < key.min:
            return [Problem(key.path, f"must be >= {key.min}, got {value}")]
        if key.max is not None and value > key.max:
            return [Problem(key.path, f"must be <= {key.max}, got {value}")]
        if key.gt is not None and value <= key.gt:
            return [Problem(key.path, f"must be > {key.gt}, got {value}")]
    return []


def _unknown(path: str) -> Problem:
    close = difflib.get_close_matches(path, list(KEYS), n=1)
    hint = f"did you mean {close[0].removeprefix(BC)}?" if close else "see docs/sft.md for the keys of an SFT recipe"
    return Problem(path, "unknown SFT key", hint)


def _map_legacy(flat: dict[str, Any], problems: list[Problem], warnings: list[str]) -> dict[str, Any]:
    """The user's keys with verl's older spellings mapped onto 0.9.1's (a warning naming both), or refused; a
    0.9.1 key the user also set wins (a different value under both spellings is a problem)."""
    mapped: dict[str, Any] = {}
    direct: dict[str, Any] = {}
    for path, value in flat.items():
        short = path.removeprefix(BC)
        if short in LEGACY:
            new = LEGACY[short]
            warnings.append(
                f"{short} is verl's older fsdp_sft_trainer spelling of {new}: read as that key (write the new one)"
            )
            if BC + new in flat and flat[BC + new] != value:
                problems.append(
                    Problem(
                        path,
                        f"is the older spelling of {new}, which is also set to another value ({flat[BC + new]!r})",
                        f"keep only {new}",
                    )
                )
            elif short == "optim.lr_scheduler" and value == "wsd":
                problems.append(Problem(path, "the wsd schedule is not built", "use constant or cosine"))
            else:
                mapped[BC + new] = value
        elif short in LEGACY_REFUSED:
            accepted, fix = LEGACY_REFUSED[short]
            if accepted is not None and value == accepted:
                warnings.append(f"{short}={value} is verl's older fsdp_sft_trainer setting: ignored ({fix})")
            else:
                problems.append(
                    Problem(path, "is verl's older fsdp_sft_trainer key, which verl 0.9.1 no longer reads", fix)
                )
        else:
            direct[path] = value
    return {**mapped, **direct}


def _relations(b: dict, problems: list[Problem], warnings: list[str]) -> None:
    """Checks between keys (problems, and warnings for what runs but not as the keys suggest)."""
    d, t, o = b["data"], b["trainer"], b["optim"]
    world = int(t["nnodes"]) * int(t["n_gpus_per_node"])
    if isinstance(d["train_batch_size"], int) and d["train_batch_size"] % world:
        problems.append(
            Problem(
                BC + "data.train_batch_size",
                f"{d['train_batch_size']} does not divide over {world} workers (trainer.n_gpus_per_node x nnodes)",
                f"use a multiple of {world}",
            )
        )
    if (
        d["use_dynamic_bsz"]
        and isinstance(d["max_token_len_per_gpu"], int)
        and isinstance(d["max_length"], int)
        and d["max_token_len_per_gpu"] < d["max_length"]
    ):
        warnings.append(
            f"data.max_token_len_per_gpu={d['max_token_len_per_gpu']} is below data.max_length="
            f"{d['max_length']}: a conversation longer than the budget gets a micro-batch of its own, "
            "over the budget (raise max_token_len_per_gpu to at least max_length to keep to it)"
        )
    if d["use_dynamic_bsz"] is True and world > 1:
        problems.append(
            Problem(
                BC + "data.use_dynamic_bsz",
                f"token-budget micro-batches over {world} workers are not "
                "built yet (their micro-batch counts could differ, and FSDP2 needs the same forwards on "
                "every rank)",
                "set data.use_dynamic_bsz=false (micro-batches of data.micro_batch_size_per_gpu rows)",
            )
        )
    if t["resume_mode"] == "resume_path" and not t["resume_from_path"]:
        problems.append(
            Problem(
                BC + "trainer.resume_from_path",
                "is required with trainer.resume_mode=resume_path",
                "set it to a global_step_N folder",
            )
        )
    if t["resume_from_path"] and "global_step_" not in str(t["resume_from_path"]):
        problems.append(Problem(BC + "trainer.resume_from_path", "must name a global_step_N folder, as in verl"))
    if (
        o["warmup_style"] is not None
        and o["lr_scheduler_type"] != "constant"
        and o["warmup_style"] != o["lr_scheduler_type"]
    ):
        problems.append(
            Problem(
                BC + "optim.warmup_style", "disagrees with optim.lr_scheduler_type", "set only optim.lr_scheduler_type"
            )
        )
    for name in ("save_contents", "load_contents"):
        value = b["checkpoint"][name]
        if name == "load_contents" and isinstance(value, list) and "hf_model" in value:
            problems.append(
                Problem(
                    BC + "checkpoint.load_contents",
                    "hf_model is written, never loaded back",
                    "list model, optimizer, extra",
                )
            )


def _derive(tree: dict, user: set[str]) -> list[tuple[str, Any, str]]:
    b, out = tree["backend_config"], []

    def put(path: str, value: Any, why: str) -> None:
        node = b
        *heads, leaf = path.split(".")
        for h in heads:
            node = node[h]
        node[leaf] = value
        out.append((path, value, why))

    base = str(tree["af_output_dir"])
    if b["trainer"]["default_local_dir"] is None:
        put("trainer.default_local_dir", f"{base}/checkpoints", "<af_output_dir>/checkpoints")
    if b["trainer"]["tensorboard_dir"] is None:
        put(
            "trainer.tensorboard_dir",
            os.environ.get("TENSORBOARD_DIR") or f"{base}/tensorboard",
            "$TENSORBOARD_DIR, else <af_output_dir>/tensorboard",
        )
    if b["checkpoint"]["load_contents"] is None:
        # hf_model is an export (full weights for the RL stage), never read back by a resume
        put(
            "checkpoint.load_contents",
            [c for c in b["checkpoint"]["save_contents"] if c != "hf_model"],
            "checkpoint.save_contents without hf_model",
        )
    if b["optim"]["warmup_style"] is not None and BC + "optim.lr_scheduler_type" not in user:
        put("optim.lr_scheduler_type", b["optim"]["warmup_style"], "optim.warmup_style (verl's older spelling)")
    return out


def load_sft_recipe(name_or_path: str | Path, overrides: Iterable[str] = (), *, check_paths: bool = False) -> SFTRecipe:
    """Load, map, validate and derive an SFT recipe; `ConfigErrors` lists every problem at once. With
    `check_paths` the training / validation files must exist."""
    from verl_npu.config.recipes import find_recipe

    source = find_recipe(name_or_path)
    raw = read_yaml_file(source)
    if not is_sft_tree(raw):
        raise UserError(
            f"{source} is not an SFT recipe (it has no model / engine / optim / checkpoint section of "
            f"verl's SFT config{', and names actor_rollout_ref' if 'actor_rollout_ref' in str(raw) else ''}"
            f"): run an RL recipe with `verl-npu run {name_or_path}`; an SFT recipe is described in "
            "docs/sft.md"
        )
    problems: list[Problem] = []
    warnings: list[str] = []
    for top in raw:
        if top not in ("af_output_dir", "backend_config", "engine_kwargs"):
            problems.append(
                Problem(str(top), "unknown top-level key of a recipe", "a recipe has af_output_dir and backend_config")
            )
    if raw.get("engine_kwargs"):
        problems.append(Problem("engine_kwargs", "an SFT run has no rollout engine", "remove engine_kwargs"))
    flat: dict[str, Any] = {}
    _flatten({k: v for k, v in raw.items() if k in ("af_output_dir", "backend_config")}, "", flat)
    for text in overrides:
        body = text.strip()
        if body.startswith("~"):
            flat[_full(body[1:].split("=")[0].strip())] = DELETE
            continue
        if "=" not in body:
            raise UserError(f"override '{text}' is not key=value (example: data.max_length=2048)")
        key, _, value = body.partition("=")
        key = key.strip().lstrip("+")
        parsed = parse_value(value)
        if key in HYDRA_GROUPS:  # verl's Hydra config-group choice (`engine=fsdp optim=fsdp`)
            if parsed != HYDRA_GROUPS[key]:
                problems.append(
                    Problem(
                        key,
                        f"{key}={parsed} picks verl's {parsed} {key} config, which verl-npu does not build",
                        f"use {key}={HYDRA_GROUPS[key]} (or leave it out)",
                    )
                )
            continue
        # a dict value of a section spreads into its keys; of a dict-typed key it stays whole
        sub: dict[str, Any] = {}
        _flatten(parsed, _full(key), sub) if isinstance(parsed, dict) and _full(key) not in KEYS else sub.update(
            {_full(key): parsed}
        )
        flat.update(sub)
    flat = {k: v for k, v in flat.items() if v is not DELETE}
    flat = _map_legacy(flat, problems, warnings)
    tree: dict[str, Any] = {"af_output_dir": None, "backend_config": defaults_tree()}
    user: set[str] = set()
    for path, flat_value in flat.items():
        if any(path == s or path.startswith(s + ".") for s in NOOP_SECTIONS):
            continue
        if path not in KEYS:
            problems.append(_unknown(path))
            continue
        given: Any = flat_value
        if KEYS[path].type == STR_LIST and isinstance(given, str):
            given = [given]  # `trainer.logger=console`, as verl's scripts write it
        user.add(path)
        set_path(tree, path, given)
    for spec in KEYS.values():
        node: Any = tree
        for part in spec.path.split("."):
            node = node[part]
        problems += _value_problems(spec, node, spec.path in user)
    if not problems:
        _relations(tree["backend_config"], problems, warnings)
    if problems:
        raise ConfigErrors(problems, source=str(source))
    derived = _derive(tree, user)
    rc = SFTRecipe(tree=tree, source=source, derived=derived, warnings=warnings)
    if check_paths:
        missing = [
            Problem(BC + f"data.{name}", f"file not found: {f}", "make the data first (see docs/sft.md)")
            for name in ("train_files", "val_files")
            for f in _as_list(tree["backend_config"]["data"][name])
            if not Path(os.path.expanduser(f)).is_file()
        ]
        if missing:
            raise ConfigErrors(missing, source=str(source))
    return rc


def _as_list(files: Any) -> list[str]:
    if files is None:
        return []
    return [str(f) for f in files] if isinstance(files, list) else [str(files)]
