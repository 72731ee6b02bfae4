"""Plain-tree helpers shared by every config module: key spellings, the recipe file as a dict,
flattening to full dotted keys, reading one value, and YAML text for one value.

Imports only `schema` (and omegaconf/yaml): every other config module may import this one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import DictConfig, OmegaConf

from verl_npu.config.schema import PLACEHOLDER, SCHEMA, VERL_SECTIONS, free_form_owner, is_section
from verl_npu.config.schema_verl import ALIASES, EXTRA_VERL_SECTIONS, VERL_ONLY
from verl_npu.errors import UserError

#: full-path prefixes of the sections the rules and derivations read.
BC = "backend_config."
DATA, ACTOR, ROLL, REF = (BC + "data.", BC + "actor_rollout_ref.actor.", BC + "actor_rollout_ref.rollout.",
                          BC + "actor_rollout_ref.ref.")
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


def read_yaml_file(path: Path) -> dict:
    """The recipe file as a plain dict (interpolations kept as text). UserError on bad YAML."""
    if not path.is_file():
        raise UserError(f"recipe file not found: {path}")
    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {exc}".rstrip()) from None
    except Exception as exc:  # omegaconf wraps some parse errors in its own types
        raise UserError(f"{path}: cannot read the recipe: {exc}") from None
    if not isinstance(loaded, DictConfig):
        raise UserError(f"{path}: a recipe must be a YAML mapping with af_output_dir, backend_config "
                        f"and engine_kwargs, not a {type(loaded).__name__}")
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
