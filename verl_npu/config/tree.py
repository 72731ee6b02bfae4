"""Plain-tree helpers shared by every config module: key spellings, the recipe file as a dict,
flattening to full dotted keys, reading one value (or many at once), and YAML text for one value.

Imports only `schema` (and omegaconf/yaml): every other config module may import this one.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import DictConfig, OmegaConf

from verl_npu.config.schema import PLACEHOLDER, SCHEMA, VERL_SECTIONS, free_form_owner, is_section
from verl_npu.config.schema_verl import ALIASES, EXTRA_VERL_SECTIONS, VERL_ONLY
from verl_npu.errors import UserError

#: full-path prefixes of the sections the rules and derivations read.
BC = "backend_config."
DATA, ACTOR, ROLL, REF = (
    BC + "data.",
    BC + "actor_rollout_ref.actor.",
    BC + "actor_rollout_ref.rollout.",
    BC + "actor_rollout_ref.ref.",
)
TRAINER, ALGO = BC + "trainer.", BC + "algorithm."


class SkipRule(Exception):
    """An input of a cross-key rule or a derivation already has a problem: it does not apply."""


def get_unless_bad(cfg: DictConfig, path: str, bad: set[str]) -> Any:
    """`get(cfg, path)`, or `SkipRule` when `path` is among the keys already in error (`bad`)."""
    if path in bad:
        raise SkipRule(path)
    return get(cfg, path)


def get(cfg: DictConfig, path: str) -> Any:
    """The plain value at a full dotted key (containers converted to Python lists/dicts)."""
    value = OmegaConf.select(cfg, path, throw_on_missing=False)
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    return value


_MISSING = object()


def get_many(cfg: DictConfig, paths: Iterable[str]) -> dict[str, Any]:
    """`get(cfg, path)` of every path, read from one plain copy of the tree (one conversion instead of a
    lookup per key: the per-key checks read every schema key of every load). A tree that does not convert
    plainly (an interpolation that does not resolve, a missing value) is read key by key with `get`."""
    paths = list(paths)
    try:
        plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except Exception:  # noqa: BLE001 - `get` then says what it says about each key
        return {path: get(cfg, path) for path in paths}
    values: dict[str, Any] = {}
    for path in paths:
        node: Any = plain
        for part in path.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
            if node is _MISSING:
                break
        values[path] = get(cfg, path) if node is _MISSING else node
    return values


def expand_key(key: str) -> str:
    """Full dotted key from the recipe root; verl's short form `data.x` means `backend_config.data.x`."""
    first = key.split(".", 1)[0]
    if first in VERL_SECTIONS or first in EXTRA_VERL_SECTIONS:
        return f"backend_config.{key}"
    return key


def scalar(value: Any) -> str:
    """One value as YAML flow text (true, null, [a, b])."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True).strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")]
    elif text.endswith("..."):
        text = text[:-3].strip()
    return text


def is_placeholder(value: Any) -> bool:
    """True for an EDIT_ME placeholder (or a list holding one)."""
    if isinstance(value, str):
        return value.strip().startswith(PLACEHOLDER)
    if isinstance(value, list):
        return any(is_placeholder(v) for v in value)
    return False


#: (path, the file's bytes) -> its parse: a process loads the same recipe many times (the tests: ~1000 loads)
_PARSED: dict[tuple[str, bytes], dict] = {}


def read_yaml_file(path: Path) -> dict:
    """The recipe file as a plain dict (interpolations kept as text). UserError on bad YAML.

    A file read before with the same bytes is not parsed again: the caller gets a fresh copy of that parse."""
    if not path.is_file():
        raise UserError(f"recipe file not found: {path}")
    key = (str(path), path.read_bytes())
    if key not in _PARSED:
        if len(_PARSED) > 64:
            _PARSED.clear()
        _PARSED[key] = _parse_yaml_file(path)
    return copy.deepcopy(_PARSED[key])


def _parse_yaml_file(path: Path) -> dict:
    """`read_yaml_file`'s parse of the file (it exists)."""
    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {exc}".rstrip()) from None
    except Exception as exc:  # omegaconf wraps some parse errors in its own types
        raise UserError(f"{path}: cannot read the recipe: {exc}") from None
    try:  # OmegaConf reads a lone sentence as a mapping with one key: YAML itself says what the file holds
        plain = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        plain = {}
    if not isinstance(loaded, DictConfig) or not isinstance(plain, dict):
        what = (
            "an empty file"
            if plain is None
            else f"a {type(plain).__name__} ({str(plain)[:60]!r})"
            if not isinstance(plain, dict)
            else f"a {type(loaded).__name__}"
        )
        raise UserError(
            f"{path}: not a YAML mapping: a recipe must be a YAML mapping with af_output_dir, "
            f"backend_config and engine_kwargs, not {what}"
        )
    return cast(dict, OmegaConf.to_container(loaded, resolve=False))


def known_section(path: str) -> bool:
    """True when `path` is a strict prefix of a schema key, a verl-only key or a verl alias."""
    if is_section(path):
        return True
    prefix = path + "."
    return any(p.startswith(prefix) for p in VERL_ONLY) or any(p.startswith(prefix) for p in ALIASES)


def flatten(node: Any, prefix: str, out: dict[str, Any]) -> None:
    """Leaves of a user tree as {full key: value}; free-form dicts and subtrees that are not
    schema sections (unknown or verl-only) stay whole, to be classified at their top."""
    if not isinstance(node, dict):
        out[prefix] = node
        return
    if prefix and (prefix in SCHEMA or prefix in VERL_ONLY or free_form_owner(prefix) == prefix):
        out[prefix] = node
        return
    if prefix and not known_section(prefix) and prefix not in ("", "backend_config"):
        out[prefix] = node
        return
    for k, v in node.items():
        flatten(v, f"{prefix}.{k}" if prefix else str(k), out)


def set_path(tree: dict, path: str, value: Any) -> None:
    """Set `tree[a][b][c] = value` for path `a.b.c`, creating dicts on the way."""
    *heads, leaf = path.split(".")
    node = tree
    for h in heads:
        nxt = node.get(h)
        if not isinstance(nxt, dict):
            nxt = node[h] = {}
        node = nxt
    node[leaf] = value
