"""Load a recipe: read YAML, apply `key=value` overrides, merge over the defaults, validate, derive.

Merge order: schema defaults <- recipe file <- command-line overrides. Every user-set key is
classified (known, free-form, deprecated, unsupported, unknown) so that no key is silently
ignored. Nothing here imports torch, transformers or ray.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml
from omegaconf import DictConfig, OmegaConf

from verl_npu.config import derive as _derive
from verl_npu.config import rules as _rules
from verl_npu.config.schema import (
    DEPRECATED, SCHEMA, TOP_LEVEL, UNSUPPORTED_PREFIXES, VERL_SECTIONS, Key,
    defaults_tree, free_form_owner, is_section,
)
from verl_npu.errors import ConfigErrors, Problem, UserError


@dataclass(frozen=True)
class Derived:
    """A setting verl-npu filled in: full dotted key, the value, and why."""

    key: str
    value: Any
    reason: str


@dataclass
class RecipeConfig:
    """A loaded, validated recipe. `cfg` holds the whole recipe with every default and derived value."""

    cfg: DictConfig
    derived: list[Derived]
    source: Path
    user_keys: frozenset[str] = frozenset()      # full keys set by the recipe or the overrides
    warnings: list[str] = field(default_factory=list)

    @property
    def backend(self) -> DictConfig:
        return self.cfg.backend_config

    @property
    def world_size(self) -> int:
        """Data-parallel size: trainer.nnodes * trainer.n_gpus_per_node."""
        t = self.cfg.backend_config.trainer
        return int(t.nnodes) * int(t.n_gpus_per_node)

    def to_yaml(self) -> str:
        """The resolved recipe as YAML; each derived value carries a `# derived: <reason>` comment."""
        notes = {d.key: d.reason for d in self.derived}
        data = OmegaConf.to_container(self.cfg, resolve=True)
        lines = [f"# resolved by verl-npu from {self.source}",
                 "# values marked 'derived' were filled in by verl-npu; set them to override"]
        _emit(data, 0, "", notes, lines)
        return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ YAML text helpers
def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True).strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")]
    elif text.endswith("..."):
        text = text[:-3].strip()
    return text


def _emit(node: dict, indent: int, prefix: str, notes: dict[str, str], lines: list[str]) -> None:
    pad = " " * indent
    for k, v in node.items():
        path = f"{prefix}{k}"
        note = f"  # derived: {notes[path]}" if path in notes else ""
        if isinstance(v, dict) and v:
            lines.append(f"{pad}{_scalar(k)}:{note}")
            _emit(v, indent + 2, path + ".", notes, lines)
        else:
            lines.append(f"{pad}{_scalar(k)}: {_scalar(v)}{note}")


# ------------------------------------------------------------------ reading
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
    return OmegaConf.to_container(loaded, resolve=False)


def expand_key(key: str) -> str:
    """Full dotted key from the recipe root; verl's short form `data.x` means `backend_config.data.x`."""
    first = key.split(".", 1)[0]
    if first in VERL_SECTIONS:
        return f"backend_config.{key}"
    return key


_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+)*$")


def parse_value(text: str) -> Any:
    """A command-line value parsed as verl/Hydra users expect: ints, floats (1e-6), true/false,
    null, [a,b] lists and {k: v} dicts; anything else stays a string."""
    s = text.strip()
    if s == "":
        return ""
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    try:
        value = yaml.safe_load(s)
    except yaml.YAMLError:
        return s
    if isinstance(value, dict) and not s.startswith("{"):
        return s    # 'EDIT_ME: x' or 'a: b' on a command line is text, not a mapping
    return value


def parse_override(text: str) -> tuple[str, Any]:
    """`key=value` -> (full dotted key, parsed value). Hydra's `+`/`++` prefixes are accepted."""
    if "=" not in text:
        raise UserError(f"override '{text}' is not key=value (example: data.train_batch_size=64)")
    key, value = text.split("=", 1)
    key = key.strip().lstrip("+")
    if key.startswith("~"):
        raise UserError(f"override '{text}': deleting keys with '~' is not supported; set the key to null")
    if not _KEY_RE.match(key):
        raise UserError(f"override '{text}': '{key}' is not a dotted key (example: data.train_batch_size=64)")
    return expand_key(key), parse_value(value)


def _flatten(node: Any, prefix: str, out: dict[str, Any]) -> None:
    """Leaves of a user tree as {full key: value}; free-form dicts and unknown subtrees stay whole."""
    if not isinstance(node, dict):
        out[prefix] = node
        return
    if prefix and (prefix in SCHEMA or free_form_owner(prefix) == prefix):
        out[prefix] = node
        return
    if prefix and not is_section(prefix) and prefix not in ("", "backend_config"):
        out[prefix] = node          # an unknown / unsupported subtree: reported once, at its top
        return
    for k, v in node.items():
        _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)


def _set_path(tree: dict, path: str, value: Any) -> None:
    *heads, leaf = path.split(".")
    node = tree
    for h in heads:
        nxt = node.get(h)
        if not isinstance(nxt, dict):
            nxt = node[h] = {}
        node = nxt
    node[leaf] = value


def _suggest(path: str) -> str:
    """A 'did you mean' hint: closest full key, else a key in another section with a close leaf name."""
    keys = list(SCHEMA)
    leaf = path.rsplit(".", 1)[-1]
    by_leaf: dict[str, str] = {}
    for k in keys:
        by_leaf.setdefault(k.rsplit(".", 1)[-1], k)
    close = [by_leaf[leaf]] if leaf in by_leaf else []          # the right name in the wrong section
    close = close or difflib.get_close_matches(path, keys, n=1, cutoff=0.8)
    if not close:
        hit = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75)
        close = [by_leaf[hit[0]]] if hit else []
    return f"did you mean {close[0]}?" if close else "see `verl-npu explain <section>` or docs/config_reference.md"


def _harmless(value: Any) -> bool:
    return value is None or value is False or value == {} or value == []


def classify(user: dict[str, Any], origin: str) -> tuple[dict[str, Any], list[Problem], list[str]]:
    """Split user leaves into accepted {key: value}, problems and warnings. `origin` names where
    the keys came from (the recipe file or 'command line')."""
    accepted: dict[str, Any] = {}
    problems: list[Problem] = []
    warnings: list[str] = []
    for path, value in user.items():
        top = path.split(".", 1)[0]
        if path in SCHEMA or free_form_owner(path):
            accepted[path] = value
        elif path in DEPRECATED:
            problems.append(Problem(path, f"is a deprecated verl key ({origin})",
                                    f"use {DEPRECATED[path]} instead"))
        elif any(path == p or path.startswith(p + ".") for p in UNSUPPORTED_PREFIXES):
            prefix = next(p for p in UNSUPPORTED_PREFIXES if path == p or path.startswith(p + "."))
            if not _harmless(value):
                problems.append(Problem(path, f"verl-npu does not support {UNSUPPORTED_PREFIXES[prefix]} yet",
                                        "remove this key"))
        elif is_section(path):
            problems.append(Problem(path, f"is a section, not a value ({origin})",
                                    f"set the keys inside it, e.g. {next(k for k in SCHEMA if k.startswith(path + '.'))}=..."))
        elif top not in TOP_LEVEL:
            problems.append(Problem(path, f"unknown top-level key ({origin}); a recipe has af_output_dir, "
                                    "backend_config and engine_kwargs", _suggest(expand_key(path))))
        else:
            problems.append(Problem(path, f"unknown key ({origin})", _suggest(path)))
    return accepted, problems, warnings


# ------------------------------------------------------------------ load
def load_recipe(name_or_path: str | Path, overrides: Iterable[str] = (), *, check_paths: bool = False
                ) -> RecipeConfig:
    """Load, merge, validate and derive a recipe (a shipped name or a YAML path).

    Raises `ConfigErrors` listing every problem, or `UserError` for an unreadable file or a
    malformed override. File existence is checked only with `check_paths=True`.
    """
    from verl_npu.recipes import find_recipe

    source = find_recipe(name_or_path)
    raw = read_yaml_file(source)
    flat: dict[str, Any] = {}
    _flatten(raw, "", flat)
    accepted, problems, warnings = classify(flat, source.name)

    parsed = [parse_override(o) for o in overrides]
    over_flat: dict[str, Any] = {}
    for key, value in parsed:
        owner = free_form_owner(key)
        if owner and owner != key:   # one entry inside a free-form dict: merge into that dict
            base = dict(over_flat.get(owner, accepted.get(owner, SCHEMA[owner].default)) or {})
            _set_path(base, key[len(owner) + 1:], value)
            over_flat[owner] = base
        elif isinstance(value, dict) and key not in SCHEMA and is_section(key):
            _flatten(value, key, over_flat)
        else:
            over_flat[key] = value
    acc2, probs2, warns2 = classify(over_flat, "command line")
    accepted.update(acc2)
    problems += probs2
    warnings += warns2

    tree = defaults_tree()
    for path, value in accepted.items():
        _set_path(tree, path, value)
    cfg = OmegaConf.create(tree)
    try:
        OmegaConf.resolve(cfg)
    except Exception as exc:
        problems.append(Problem("(interpolation)", f"a ${{...}} reference cannot be resolved: {exc}",
                                "interpolations use full keys, e.g. ${backend_config.data.max_response_length}"))
    user_keys = frozenset(accepted)
    key_problems = _rules.check_keys(cfg, user_keys)
    bad = {p.key for p in key_problems} | {p.key for p in problems}
    problems += key_problems
    derived_raw, derive_problems = _derive.derive(cfg, user_keys, bad)
    problems += derive_problems
    bad |= {p.key for p in derive_problems}
    rel_problems, rel_warnings = _rules.check_relations(cfg, user_keys, bad)
    problems += rel_problems
    warnings += rel_warnings
    rc = RecipeConfig(cfg=cfg, derived=[Derived(*d) for d in derived_raw], source=source,
                      user_keys=user_keys, warnings=warnings)
    if check_paths and not problems:
        problems += _rules.check_paths(rc)
    if problems:
        raise ConfigErrors(problems, source=str(source))
    return rc


def describe_key(key: Key) -> str:
    """Meaning, type, default, choices/range and the rules that involve the key (for `explain`)."""
    lines = [key.path, f"  {key.doc}", f"  type: {key.type}{' | null' if key.allows_null else ''}",
             f"  default: {_scalar(key.default)}"]
    if key.required:
        lines.append("  required: yes (shipped recipes hold an EDIT_ME placeholder here)")
    if key.choices:
        lines.append(f"  choices: {', '.join(map(str, key.choices))}")
    if key.unsupported:
        lines.append(f"  known to verl but not supported by verl-npu yet: {', '.join(key.unsupported)}")
    rng = _rules.range_text(key)
    if rng:
        lines.append(f"  range: {rng}")
    if key.off_only:
        lines.append(f"  verl-npu does not support {key.off_only} yet: only the default is accepted")
    if key.derived:
        lines.append(f"  derived when not set: {key.derived}")
    if key.path != key.short:
        lines.append(f"  short form on the command line: {key.short}=...")
    involved = [r for r in _rules.RULES if key.path in r.keys]
    if involved:
        lines.append("  rules:")
        lines += [f"    - {r.text}" for r in involved]
    return "\n".join(lines)
