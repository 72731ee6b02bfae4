"""Typed, read-only config sections, generated from the one schema (`verl_npu.config.schema.SCHEMA`).

Every section of the schema (a strict prefix of its keys: `backend_config.data`,
`backend_config.actor_rollout_ref.actor.optim`, ...) is a frozen dataclass built here at import time, one
field per child: a key (its value) or a sub-section. Nothing lists a key or a default a second time: the
fields, their types and their defaults are the schema's. verl's keys that verl-npu supports only at their
default (`schema_verl.VERL_ONLY`, `off_only`: the reference model's `fsdp_config.reshard_after_forward`, ...)
are fields too, always at that default; verl's no-op keys are not (nothing may read them).

    from verl_npu.config.typed import section
    cfg = section("backend_config", rc.cfg.backend_config)   # or rc.typed
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size            # an int; the schema's default when absent
    section("algorithm.kl_ctrl", {"type": "adaptive"})        # a section of its own, other keys at default

- Values are the validated ones, with only what the type implies: a whole number of a `float` key is a
  float, lists are tuples, free-form dicts are read-only dicts (`FrozenDict`, a `dict`).
- Reading a key the schema does not have fails at once, naming it (`ConfigKeyError`, an `AttributeError`
  and a `KeyError`), for attribute access, `section["key"]` and `section.get("key")` alike.
- Sections pickle (their classes are module attributes here), so they travel to Ray workers as they are.
- Mapping access (`s["key"]`, `s.get("key", default)`, `"key" in s`, `keys()`, `items()`) reads the same
  fields, for code written against a dict-like config (a tool's or a user's function).
  `get` never needs its default for a schema key (the section always has it; a null value is returned
  as null, as a dict's or OmegaConf's `get` does); for a key the schema lacks it raises, like the rest.

Imports only the schema modules and omegaconf: nothing heavy (the config layer stays instant).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, cast

from verl_npu.config import section_base
from verl_npu.config import sections as generated  # the section classes, generated from the schema
from verl_npu.config.key import BOOL, DICT, FLOAT, FLOAT_LIST, INT, INT_LIST, STR, STR_LIST, STR_OR_LIST, Key
from verl_npu.config.schema import SCHEMA, VERL_SECTIONS
from verl_npu.config.schema_verl import REFUSED_SUBTREES, VERL_ONLY
from verl_npu.config.section_base import ROOT, SECTIONS, ConfigKeyError, FrozenDict, Section, _short, _unknown, plain  # noqa: F401 - the sections' face

# ------------------------------------------------------------------ generation
_PY_TYPES = {
    INT: int,
    FLOAT: float,
    BOOL: bool,
    STR: str,
    DICT: FrozenDict,
    STR_LIST: tuple,
    INT_LIST: tuple,
    FLOAT_LIST: tuple,
    STR_OR_LIST: Any,
}

#: full section path -> {leaf name: full key path}; its sub-sections' names
_LEAVES: dict[str, dict[str, str]] = {}
_CHILDREN: dict[str, list[str]] = {}


def _key(path: str) -> Key:
    """The schema's entry for a full key path, read when a section is built (never copied here)."""
    return SCHEMA[path] if path in SCHEMA else VERL_ONLY[path]


def _class_name(path: str) -> str:
    parts = _short(path).split(".") if path != ROOT else ["backend_config"]
    return "_".join("".join(w.capitalize() for w in p.split("_")) for p in parts) + "Section"


def _read_keys() -> list[Key]:
    """The schema's keys, and verl's keys that verl-npu supports only at their default (in verl's sections)."""
    fixed = [
        k
        for k in VERL_ONLY.values()
        if k.off_only
        and k.path.split(".")[1] in VERL_SECTIONS
        and not any(k.path.startswith(r + ".") for r in REFUSED_SUBTREES)
    ]
    return list(SCHEMA.values()) + fixed


def _generate() -> None:
    for key in _read_keys():
        parts = key.path.split(".")
        parent = ".".join(parts[:-1])
        if not parent:
            continue  # top-level keys (af_output_dir) are not in a section
        _LEAVES.setdefault(parent, {})[parts[-1]] = key.path
        for i in range(len(parts) - 1, 1, -1):  # every ancestor section lists its child sections
            above, child = ".".join(parts[: i - 1]), parts[i - 1]
            children = _CHILDREN.setdefault(above, [])
            if child not in children:
                children.append(child)
    for path in section_paths():
        fields = section_fields(path)
        cls: Any = getattr(generated, _class_name(path), None)
        if cls is None or [(f.name, f.type) for f in dataclasses.fields(cls)] != [
            (name, text) for name, _, text in fields
        ]:
            # the generated module is stale (a schema key added or changed without running
            # `python -m verl_npu.config.sections_gen`; tests/config/test_config_typed.py fails on it): built here
            cls = dataclasses.make_dataclass(
                _class_name(path),
                [(n, t) for n, t, _ in fields],
                bases=(Section,),
                frozen=True,
                namespace={"__module__": generated.__name__},
            )
            setattr(generated, cls.__name__, cls)
        cls._path_ = path
        cls._keys_ = tuple(name for name, _, _ in fields)
        SECTIONS[path] = cls


def section_paths() -> list[str]:
    """Every section path, deepest first (a section's class is built after its sub-sections')."""
    return sorted(set(_LEAVES) | set(_CHILDREN), key=lambda p: (-p.count("."), p))


def section_fields(path: str) -> list[tuple[str, Any, str]]:
    """(name, Python type, the type as the generated module spells it) of each field of a section."""
    fields: list[tuple[str, Any, str]] = []
    for name, key_path in _LEAVES.get(path, {}).items():
        key = _key(key_path)
        py = _PY_TYPES.get(key.type, Any)
        nullable = key.allows_null and py is not Any
        text = {Any: "Any", FrozenDict: "FrozenDict"}.get(py, getattr(py, "__name__", "Any"))
        fields.append((name, py | None if nullable else py, f"{text} | None" if nullable else text))
    for name in _CHILDREN.get(path, []):
        fields.append((name, _class_name(f"{path}.{name}"), _class_name(f"{path}.{name}")))
    return fields


def _ignored(path: str) -> bool:
    """A key that may sit in a resolved config although the schema does not read it: verl's keys that
    verl-npu accepts and ignores (`schema_verl.VERL_ONLY`) and what lies under them."""
    return (
        path in VERL_ONLY
        or any(v.startswith(path + ".") or path.startswith(v + ".") for v in VERL_ONLY)
        or any(path == r or path.startswith(r + ".") for r in REFUSED_SUBTREES)
    )


def _value(key: Key, value: Any) -> Any:
    if value is None:
        return None
    if key.type == FLOAT and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if key.type == FLOAT_LIST and isinstance(value, (list, tuple)):
        return tuple(float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value)
    if isinstance(value, Mapping):
        return _freeze(value)
    if isinstance(value, list):
        return tuple(value)
    return value


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping) and not isinstance(value, Section):
        return FrozenDict({k: _freeze(v) for k, v in value.items()})
    return value


def _build(path: str, tree: Mapping) -> Section:
    cls = SECTIONS[path]
    leaves, children = _LEAVES.get(path, {}), _CHILDREN.get(path, [])
    for name in tree:
        if name not in cls._keys_ and not _ignored(f"{path}.{name}"):
            raise ConfigKeyError(f"{_unknown(path, name)}; given to section({_short(path)!r})")
    values = {}
    for name, key_path in leaves.items():
        key = _key(key_path)
        values[name] = _value(key, tree[name] if name in tree else copy.deepcopy(key.default))
    for name in children:
        sub = tree.get(name)
        values[name] = _build(f"{path}.{name}", _as_tree(sub, f"{path}.{name}"))
    return cls(**values)


def _as_tree(node: Any, path: str) -> Mapping:
    if node is None:
        return {}
    if isinstance(node, Section):
        return node.to_dict()
    if not isinstance(node, Mapping):
        from omegaconf import OmegaConf

        if OmegaConf.is_config(node):
            return cast(Mapping, OmegaConf.to_container(node, resolve=True))
        raise TypeError(f"{_short(path)}: a config section is a mapping, not {type(node).__name__}")
    if type(node).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return cast(Mapping, OmegaConf.to_container(node, resolve=True))
    return node


def section(path: str, tree: Any = None) -> Section:
    """The typed section at `path` (full, `backend_config.algorithm`, or verl's short `algorithm`;
    `backend_config` for the whole backend config) from `tree`: a dict, an OmegaConf node or a section
    of that path (returned as it is). Keys `tree` lacks get the schema's default; a key the schema does
    not have (other than verl's ignored ones) raises `ConfigKeyError`."""
    full = path if path == ROOT or path.startswith(ROOT + ".") else f"{ROOT}.{path}"
    if full not in SECTIONS:
        raise ConfigKeyError(f"{path} is not a config section (sections: {', '.join(map(_short, SECTIONS))})")
    if isinstance(tree, SECTIONS[full]):
        return tree
    return _build(full, _as_tree(tree, full))


def defaults(path: str) -> Section:
    """The section at `path` with every key at the schema's default."""
    return section(path, {})


_generate()
section_base.BUILD = section  # Section.replace builds through it
