"""Load a recipe: read YAML, apply `key=value` overrides, merge over the defaults, validate, derive.

Merge order: schema defaults <- recipe file <- command-line overrides (Hydra's `+key`, `++key`
and `~key` included). Every user-set key is classified (schema key, free-form entry, verl alias,
verl key without effect here, deprecated (mapped with a warning, or refused), refused verl feature,
unknown) so that no key is silently ignored: an unknown key added with `+` is ignored with a warning
and listed in `RecipeConfig.ignored` (and at the end of `to_yaml`). verl's short-form
interpolations (`${data.max_response_length}`) resolve against `backend_config`. Nothing here
imports torch, transformers or ray.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from verl_npu.config import derive as _derive
from verl_npu.config import key_checks
from verl_npu.config import paths as _paths
from verl_npu.config import rules as _rules
from verl_npu.config.overrides import DELETE, added_with_plus, parse_override
from verl_npu.config.schema import DICT, SCHEMA, STR_LIST, TOP_LEVEL, VERL_SECTIONS, Key, defaults_tree, free_form_owner
from verl_npu.config.schema_deprecated import (
    DEPRECATED,
    DEPRECATED_CKPT,
    DEPRECATED_MICRO,
    DEPRECATED_RENAMED,
    UNSUPPORTED_PREFIXES,
)
from verl_npu.config.schema_verl import (
    ALIASES,
    EXTRA_VERL_SECTIONS,
    TARGET_NOOP,
    VERL_ONLY,
    WARN_ALIASES,
    is_target,
    refused_subtree,
)
from verl_npu.config.sections import BackendConfigSection
from verl_npu.config.tree import BC, expand_key, flatten, known_section, read_yaml_file, scalar, set_path
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
    user_keys: frozenset[str] = frozenset()  # full keys set by the recipe or the overrides
    warnings: list[str] = field(default_factory=list)
    noop: list[Derived] = field(default_factory=list)  # verl keys the user set that change nothing here, and why
    ignored: dict[str, Any] = field(default_factory=dict)  # keys added with `+` that nothing reads: full key -> value

    @property
    def backend(self) -> DictConfig:
        return self.cfg.backend_config

    _typed: BackendConfigSection | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def typed(self) -> BackendConfigSection:
        """The backend config as typed, read-only sections generated from the schema
        (`verl_npu.config.typed`): what the training code reads, and what travels to the workers.
        Built on first use (about 2 ms) and kept; `set_derived` (check_paths' hub ids) drops it."""
        if self._typed is None:
            from verl_npu.config.typed import section

            self._typed = cast(BackendConfigSection, section("backend_config", self.cfg.backend_config))
        return self._typed

    @property
    def world_size(self) -> int:
        """Data-parallel size: trainer.nnodes * trainer.n_gpus_per_node."""
        t = self.cfg.backend_config.trainer
        return int(t.nnodes) * int(t.n_gpus_per_node)

    def set_derived(self, key: str, value: Any, reason: str) -> None:
        """Set full dotted `key` to `value` in `cfg` and record it, with `reason`, in `derived`."""
        OmegaConf.update(self.cfg, key, value, merge=False)
        self._typed = None  # built again from the changed tree
        self.derived.append(Derived(key, value, reason))

    def to_yaml(self) -> str:
        """The resolved recipe as YAML; each derived value carries a `# derived: <reason>` comment."""
        notes = {d.key: d.reason for d in self.derived}
        data = cast(dict, OmegaConf.to_container(self.cfg, resolve=True))
        lines = [
            f"# resolved by verl-npu from {self.source}",
            "# values marked 'derived' were filled in by verl-npu; set them to override",
        ]
        _emit(data, 0, "", notes, lines)
        if self.ignored:  # comments: the file stays a recipe verl-npu loads
            lines.append(
                "# ignored: added with + on the command line, read by nothing here (neither verl nor verl-npu)"
            )
            lines += [f"#   {k.removeprefix(BC)}={scalar(v)}" for k, v in self.ignored.items()]
        return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ YAML text helpers
def _emit(node: dict, indent: int, prefix: str, notes: dict[str, str], lines: list[str]) -> None:
    pad = " " * indent
    for k, v in node.items():
        path = f"{prefix}{k}"
        note = f"  # derived: {notes[path]}" if path in notes else ""
        if isinstance(v, dict) and v:
            lines.append(f"{pad}{scalar(k)}:{note}")
            _emit(v, indent + 2, path + ".", notes, lines)
        else:
            lines.append(f"{pad}{scalar(k)}: {scalar(v)}{note}")


# ------------------------------------------------------------------ interpolations
_SECTIONS = VERL_SECTIONS + EXTRA_VERL_SECTIONS
_SHORT_REF = re.compile(r"\$\{(\s*(?:oc\.select:\s*)?)(" + "|".join(_SECTIONS) + r")(?=[.}:,\s])")


def expand_interpolations(value: Any) -> Any:
    """`${data.x}` (verl's spelling, relative to the verl config) -> `${backend_config.data.x}`, in
    every string of `value` (lists and dicts too); `${oc.select:data.x,1}` likewise. Full keys,
    relative `${.x}` references and other resolvers are left as they are."""
    if isinstance(value, str):
        return _SHORT_REF.sub(lambda m: "${" + m.group(1) + "backend_config." + m.group(2), value)
    if isinstance(value, list):
        return [expand_interpolations(v) for v in value]
    if isinstance(value, dict):
        return {k: expand_interpolations(v) for k, v in value.items()}
    return value


def _has_interpolation(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, list):
        return any(_has_interpolation(v) for v in value)
    if isinstance(value, dict):
        return any(_has_interpolation(v) for v in value.values())
    return False


_MISSING_REF = re.compile(r"Interpolation key '([^']+)' not found|Key '([^']+)' not in")


def _interpolation_problem(path: str, raw: Any, exc: Exception) -> Problem:
    """A clean error for a `${...}` that does not resolve, naming the key it refers to."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    found = _MISSING_REF.search(text)
    if found:
        ref = (found.group(1) or found.group(2)).removeprefix("backend_config.")
        return Problem(
            path,
            f"refers to {ref!r}, which is not a key of the recipe (value {raw!r})",
            "refer to an existing key, e.g. ${data.max_response_length} (verl's short form) "
            "or ${backend_config.data.max_response_length}",
        )
    return Problem(
        path,
        f"the reference in {raw!r} cannot be resolved ({text})",
        "write ${section.key}, e.g. ${data.max_response_length}",
    )


def _suggest(path: str) -> str:
    """A 'did you mean' hint: closest full key, else a key in another section with a close leaf name."""
    keys = list(SCHEMA)
    leaf = path.rsplit(".", 1)[-1]
    by_leaf: dict[str, str] = {}
    for k in keys:
        by_leaf.setdefault(k.rsplit(".", 1)[-1], k)
    close = [by_leaf[leaf]] if leaf in by_leaf else []  # the right name in the wrong section
    close = close or difflib.get_close_matches(path, keys, n=1, cutoff=0.8)
    if not close:
        hit = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75)
        close = [by_leaf[hit[0]]] if hit else []
    return f"did you mean {close[0]}?" if close else "see `verl-npu explain <section>` or docs/config_reference.md"


def _harmless(value: Any) -> bool:
    return value is None or value is False or value == {} or value == []


@dataclass
class _Sorted:
    """User keys sorted by what verl-npu does with them."""

    accepted: dict[str, Any] = field(default_factory=dict)  # schema keys (aliases already renamed)
    verl_only: dict[str, Any] = field(default_factory=dict)  # VERL_ONLY keys / _target_ (checked, no effect)
    alias_of: dict[str, str] = field(default_factory=dict)  # schema key -> the verl alias that set it
    deprecated: dict[str, Any] = field(default_factory=dict)  # verl's deprecated keys verl-npu maps (mapped later)
    ignored: dict[str, Any] = field(default_factory=dict)  # unknown keys added with `+`: ignored, with a warning
    problems: list[Problem] = field(default_factory=list)

    def update(self, other: _Sorted) -> None:
        for target in other.accepted:  # a later source replaces an earlier one, alias or not
            self.alias_of.pop(target, None)
        self.accepted.update(other.accepted)
        self.verl_only.update(other.verl_only)
        self.alias_of.update(other.alias_of)
        self.deprecated.update(other.deprecated)
        self.ignored.update(other.ignored)
        self.problems += other.problems


def classify(user: dict[str, Any], origin: str, added: Iterable[str] = ()) -> _Sorted:
    """Sort user leaves {full key: value} (from the recipe file or the command line, named by
    `origin`) into schema keys, verl keys without effect here, verl's deprecated keys, and problems.
    An unknown key at or under one of `added` (overrides written `+key=...`) is ignored with a warning
    instead of refused. Every key ends in exactly one place: nothing is dropped silently."""
    out = _Sorted()
    added = tuple(added)
    for path, value in user.items():
        top = path.split(".", 1)[0]
        plus = any(path == a or path.startswith(a + ".") for a in added)
        if path in SCHEMA or free_form_owner(path):
            key = SCHEMA.get(path)
            if key is not None and key.type == STR_LIST and isinstance(value, str):
                value = [value]  # verl accepts one name for a list of names (trainer.logger=console)
            out.accepted[path] = value
        elif path in ALIASES:
            target = ALIASES[path]
            if target in out.accepted and out.accepted[target] != value:
                out.problems.append(
                    Problem(
                        path,
                        f"is {value!r} but {target.removeprefix(BC)} (the key it "
                        f"stands for) is {out.accepted[target]!r} ({origin})",
                        "set only one of them",
                    )
                )
            else:
                out.accepted[target] = value
                out.alias_of[target] = path
        elif path in VERL_ONLY:
            out.verl_only[path] = value  # checked once resolved (_check_verl_only)
        elif is_target(path) and top == "backend_config" and isinstance(value, str):
            out.verl_only[path] = value
        elif path in DEPRECATED_MICRO or path in DEPRECATED_RENAMED or path == DEPRECATED_CKPT[0]:
            out.deprecated[path] = value  # mapped to the new key once the config is resolved (_map_deprecated)
        elif path in DEPRECATED:
            out.problems.append(
                Problem(path, f"is a deprecated verl key ({origin})", f"use {DEPRECATED[path]} instead")
            )
        elif refused_subtree(path) or any(path == p or path.startswith(p + ".") for p in UNSUPPORTED_PREFIXES):
            hit = refused_subtree(path)
            if hit:
                what, instead = hit[1]
            else:
                prefix = next(p for p in UNSUPPORTED_PREFIXES if path == p or path.startswith(p + "."))
                what, instead = UNSUPPORTED_PREFIXES[prefix], "remove this key"
            if _harmless(value):
                out.verl_only[path] = value
            else:
                out.problems.append(
                    Problem(path, f"verl-npu does not support {what} yet (a verl feature; {origin})", instead)
                )
        elif known_section(path):
            inside = next((k for k in list(SCHEMA) + list(VERL_ONLY) if k.startswith(path + ".")), path)
            out.problems.append(
                Problem(
                    path,
                    f"is a section, not a value ({origin})",
                    f"set the keys inside it, e.g. {inside.removeprefix(BC)}=...",
                )
            )
        elif plus:
            out.ignored[path] = value
        elif top not in TOP_LEVEL:
            out.problems.append(
                Problem(
                    path,
                    f"unknown top-level key ({origin}); a recipe has af_output_dir, backend_config and engine_kwargs",
                    _suggest(expand_key(path)),
                )
            )
        else:
            out.problems.append(Problem(path, f"unknown key ({origin}): not a verl-npu or verl key", _suggest(path)))
    return out


def _into_aliased_dict(key: str) -> str:
    """A key inside a verl alias of a free-form dict (verl 0.9.1's `reward.custom_reward_function.reward_kwargs.x`)
    spelled inside the dict verl-npu reads (`custom_reward_function.reward_kwargs.x`); any other key as it is."""
    for alias, target in ALIASES.items():
        if key.startswith(alias + ".") and target in SCHEMA and SCHEMA[target].type == DICT:
            return target + key[len(alias) :]
    return key


def _apply_overrides(
    parsed: list[tuple[str, Any]], base: _Sorted, raw_flat: dict[str, Any], added: Iterable[str] = ()
) -> _Sorted:
    """Command-line overrides, in order, as a `_Sorted` of their own; `~key` deletions remove the
    key from `base` (the recipe file's keys) and from earlier overrides. `added`: the keys written `+key=...`."""
    over_flat: dict[str, Any] = {}
    for key, value in parsed:
        key = _into_aliased_dict(key)
        owner = free_form_owner(key)
        if value is DELETE:
            if owner and owner != key:  # one entry of a free-form dict
                current = dict(over_flat.get(owner, base.accepted.get(owner, SCHEMA[owner].default)) or {})
                node: dict = current
                *heads, leaf = key[len(owner) + 1 :].split(".")
                for h in heads:
                    child = node.get(h)
                    node = child if isinstance(child, dict) else {}
                node.pop(leaf, None)
                over_flat[owner] = current
                continue
            for store in (over_flat, base.accepted, base.verl_only, base.deprecated, base.ignored, raw_flat):
                for k in [k for k in store if k == key or k.startswith(key + ".")]:
                    del store[k]
            target = ALIASES.get(key)
            if target:
                over_flat.pop(target, None)
                base.accepted.pop(target, None)
            continue
        if owner and owner != key:  # one entry inside a free-form dict: merge into that dict
            current = dict(over_flat.get(owner, base.accepted.get(owner, SCHEMA[owner].default)) or {})
            set_path(current, key[len(owner) + 1 :], value)
            over_flat[owner] = current
        elif isinstance(value, dict) and key not in SCHEMA and key not in VERL_ONLY and known_section(key):
            flatten(value, key, over_flat)
        else:
            over_flat[key] = value
    return classify(over_flat, "command line", added)


def _resolve(cfg: DictConfig, sorted_: _Sorted) -> list[Problem]:
    """Resolve every `${...}` in place; a reference that does not resolve is reported on the key
    that holds it (and that key goes back to its default so the other checks still run)."""
    problems: list[Problem] = []
    holders = {**sorted_.accepted, **sorted_.verl_only}
    for path, raw in holders.items():
        if not _has_interpolation(raw):
            continue
        try:
            node = OmegaConf.select(cfg, path, throw_on_missing=True)
            if OmegaConf.is_config(node):
                OmegaConf.to_container(node, resolve=True)
        except Exception as exc:  # omegaconf's InterpolationKeyError, GrammarParseError, ...
            problems.append(_interpolation_problem(path, raw, exc))
            default = SCHEMA[path].default if path in SCHEMA else None
            OmegaConf.update(cfg, path, default, merge=False)
    try:
        OmegaConf.resolve(cfg)
    except Exception as exc:  # a reference in a schema default or in an unexpected place
        problems.append(_interpolation_problem("(interpolation)", "", exc))
    return problems


def _check_verl_only(cfg: DictConfig, sorted_: _Sorted, earlier: list[Problem]) -> list[Problem]:
    """Value checks of the VERL_ONLY keys the user set (after `${...}` resolution); a refused one
    leaves the no-op list."""
    done = {p.key for p in earlier}
    found: list[Problem] = []
    for path in [p for p in sorted_.verl_only if p in VERL_ONLY and p not in done]:
        bad = key_checks.check_key(VERL_ONLY[path], _rules.get(cfg, path))
        if bad:
            found += bad
            del sorted_.verl_only[path]
    return found


def _noop_reason(path: str) -> str:
    """Why a verl key the user set changes nothing here."""
    key = VERL_ONLY.get(path)
    if key is not None:
        return key.noop or f"left off: verl-npu does not support {key.off_only} yet"
    if is_target(path):
        return TARGET_NOOP
    hit = refused_subtree(path)
    what = (
        hit[1][0]
        if hit
        else next(
            (w for p, w in UNSUPPORTED_PREFIXES.items() if path.startswith(p + ".") or path == p), "this verl feature"
        )
    )
    return f"left off: verl-npu does not support {what} yet"


def _short(path: str) -> str:
    return path.removeprefix(BC)


def _map_deprecated(cfg: DictConfig, sorted_: _Sorted, bad: set[str]) -> tuple[list[Derived], list[Problem], list[str]]:
    """verl's deprecated keys that verl 0.9.1 still reads, mapped as verl maps them onto the new keys
    (in `cfg`, in place): (the values set, problems, one warning per key naming both). A new key
    whose old key is refused joins `bad`, so that the rules do not report it a second time."""
    done: list[Derived] = []
    problems: list[Problem] = []
    warnings: list[str] = []
    trainer = BC + "trainer."
    for old, value in sorted_.deprecated.items():
        if value is None:  # verl's own default: the same as not setting it
            continue
        if old == DEPRECATED_CKPT[0]:
            if not isinstance(value, bool):
                problems.append(
                    Problem(
                        old,
                        f"must be a bool, got {value!r}",
                        "set true or false (or remove it: "
                        "it is verl's deprecated key; write trainer.max_actor_ckpt_to_keep=1)",
                    )
                )
                continue
            if not value:
                continue
            clash = [k for k in DEPRECATED_CKPT[1] if sorted_.accepted.get(k) not in (None, 1)]
            if clash:
                problems.append(
                    Problem(
                        old,
                        f"is true (keep one checkpoint) but {_short(clash[0])} is {sorted_.accepted[clash[0]]}",
                        f"remove {_short(old)} (verl's deprecated "
                        f"key) and keep {_short(clash[0])}, or set {_short(clash[0])}=1",
                    )
                )
                continue
            for new in DEPRECATED_CKPT[1]:
                OmegaConf.update(cfg, new, 1, merge=False)
                done.append(Derived(new, 1, f"from verl's deprecated {_short(old)}=true"))
            warnings.append(
                f"{_short(old)}=true is verl's deprecated key: mapped to "
                + " and ".join(f"{_short(k)}=1" for k in DEPRECATED_CKPT[1])
                + "; write those instead"
            )
            continue
        if old in DEPRECATED_RENAMED:
            new = DEPRECATED_RENAMED[old]
            bad_value = [replace(p, key=old) for p in key_checks.check_key(SCHEMA[new], value)]
            if bad_value:
                problems += bad_value
                continue
            user = sorted_.accepted.get(new)
            if user is not None and user != value:
                problems.append(
                    Problem(
                        old,
                        f"is {value} but {_short(sorted_.alias_of.get(new, new))} is {user}; "
                        f"{_short(old)} is verl's deprecated key",
                        f"remove {_short(old)} and keep {_short(sorted_.alias_of.get(new, new))}",
                    )
                )
                continue
            if user is None:
                OmegaConf.update(cfg, new, value, merge=False)
                done.append(Derived(new, value, f"from verl's deprecated {_short(old)}={value}"))
            warnings.append(
                f"{_short(old)}={value} is verl's deprecated key: mapped to {_short(new)}={value} "
                f"(verl: optim.clip_grad); write {_short(new)}={value} instead"
            )
            continue
        new, sp_key = DEPRECATED_MICRO[old]
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(
                Problem(
                    old,
                    f"must be an int, got {value!r} ({type(value).__name__})",
                    f"set {_short(new)} instead (responses per device)",
                )
            )
            bad.add(new)
            continue
        if sorted_.accepted.get(new) is not None:
            critic = new.startswith(BC + "critic.")
            dyn = _rules.get(cfg, BC + "critic.use_dynamic_bsz") if critic else None
            dyn = _rules.get(cfg, BC + "actor_rollout_ref.actor.use_dynamic_bsz") if dyn is None else dyn
            if dyn:  # verl reads neither with dynamic batch sizes, and lets both through
                warnings.append(
                    f"{_short(old)} (verl's deprecated key) is not read: {_short(new)} is set too, "
                    "and use_dynamic_bsz packs micro batches by token count"
                )
                continue
            problems.append(
                Problem(
                    old,
                    f"and {_short(new)} are both set ({value} and {sorted_.accepted[new]}); "
                    f"{_short(old)} is verl's deprecated key",
                    f"remove {_short(old)} and keep {_short(new)} (responses per device)",
                )
            )
            continue
        needed = (trainer + "nnodes", trainer + "n_gpus_per_node", sp_key)
        if any(k in bad for k in needed):
            continue  # already reported
        world = int(_rules.get(cfg, needed[0])) * int(_rules.get(cfg, needed[1]))
        sp = int(_rules.get(cfg, sp_key) or 1)
        ranks = max(world // sp, 1)
        per = value // ranks
        how = f"{value} // {ranks} data-parallel ranks: {world} devices / {_short(sp_key)} {sp}"
        if per < 1:
            problems.append(
                Problem(
                    old,
                    f"is {value}, {per} responses per device ({how}); verl refuses below one too",
                    f"write {_short(new)}=<responses per device>, e.g. {_short(new)}=1",
                )
            )
            bad.add(new)
            continue
        OmegaConf.update(cfg, new, per, merge=False)
        done.append(Derived(new, per, f"from verl's deprecated {_short(old)}={value}: {how}"))
        warnings.append(
            f"{_short(old)}={value} is verl's deprecated key: mapped to {_short(new)}={per} "
            f"({how}); write {_short(new)}={per} instead"
        )
    return done, problems, warnings


def _ignored_warning(ignored: dict[str, Any]) -> str:
    """The one warning that lists the keys added with `+` that nothing reads."""
    items = []
    for path, value in ignored.items():
        hint = _suggest(path)
        hint = f" ({hint.replace(BC, '')})" if hint.startswith("did you mean") else ""
        items.append(f"{_short(path)}={scalar(value)}{hint}")
    return "added with +, read by nothing here: ignored: " + "; ".join(items)


# ------------------------------------------------------------------ load
def load_recipe(name_or_path: str | Path, overrides: Iterable[str] = (), *, check_paths: bool = False) -> RecipeConfig:
    """Load, merge, validate and derive a recipe (a shipped name or a YAML path).

    Raises `ConfigErrors` listing every problem, or `UserError` for an unreadable file or a
    malformed override. File existence is checked only with `check_paths=True`.
    """
    from verl_npu.config.recipes import find_recipe

    source = find_recipe(name_or_path)
    raw = read_yaml_file(source)
    from verl_npu.config.sft_schema import is_sft_tree

    if "stages" in raw:
        raise UserError(
            f"{source} names stages (SFT, then RL): `verl-npu run {name_or_path}` runs them, "
            f"`verl-npu validate {name_or_path}` checks them (docs/sft.md)"
        )
    if is_sft_tree(raw):
        raise UserError(
            f"{source} is an SFT recipe (verl's SFT sections model/engine/optim, no actor_rollout_ref): "
            f"run it with `verl-npu sft {name_or_path}` (docs/sft.md)"
        )
    flat: dict[str, Any] = {}
    flatten(raw, "", flat)
    sorted_ = classify(flat, source.name)
    overrides = list(overrides)
    parsed = [parse_override(o) for o in overrides]
    added = [key for (key, _), text in zip(parsed, overrides) if added_with_plus(text)]
    sorted_.update(_apply_overrides(parsed, sorted_, flat, added))
    problems = sorted_.problems

    tree = defaults_tree()
    for path, value in {**sorted_.verl_only, **sorted_.accepted}.items():
        set_path(tree, path, expand_interpolations(value))
    cfg = OmegaConf.create(tree)
    problems += _resolve(cfg, sorted_)
    user_keys = frozenset(sorted_.accepted)
    key_problems = key_checks.check_keys(cfg, user_keys) + _check_verl_only(cfg, sorted_, problems)
    # the rules skip every key in error under its schema name (a key set through its verl alias too)
    bad = {p.key for p in key_problems} | {p.key for p in problems}
    # an error on a key set through its verl alias names the alias the user wrote
    key_problems = [replace(p, key=sorted_.alias_of[p.key]) if p.key in sorted_.alias_of else p for p in key_problems]
    bad |= {p.key for p in key_problems}
    problems += key_problems
    derived_raw, derive_problems = _derive.derive(cfg, user_keys, bad)
    problems += derive_problems
    bad |= {p.key for p in derive_problems}
    mapped, map_problems, warnings = _map_deprecated(cfg, sorted_, bad)
    problems += map_problems
    user_keys |= {d.key for d in mapped}  # the rules read them as set by the user
    rel_problems, rel_warnings = _rules.check_relations(cfg, user_keys, bad)
    problems += rel_problems
    if sorted_.ignored:
        warnings.insert(0, _ignored_warning(sorted_.ignored))
    noop = [Derived(k, _rules.get(cfg, k), _noop_reason(k)) for k in sorted_.verl_only]
    rel_warnings += [
        f"{alias.removeprefix(BC)} is the DAPO recipe's older spelling of {target.removeprefix(BC)}: "
        "read as that key (write the new one)"
        for target, alias in sorted_.alias_of.items()
        if alias in WARN_ALIASES
    ]
    rc = RecipeConfig(
        cfg=cfg,
        derived=[Derived(*d) for d in derived_raw] + mapped,
        source=source,
        user_keys=user_keys,
        warnings=warnings + rel_warnings,
        noop=noop,
        ignored=dict(sorted_.ignored),
    )
    if check_paths and not problems:
        problems += _paths.check_paths(rc)
    if problems:
        raise ConfigErrors(problems, source=str(source))
    return rc


def describe_key(key: Key) -> str:
    """Meaning, type, default, choices/range and the rules that involve the key (for `explain`)."""
    lines = [
        key.path,
        f"  {key.doc}",
        f"  type: {key.type}{' | null' if key.allows_null else ''}",
        f"  default: {scalar(key.default)}",
    ]
    if key.required:
        lines.append("  required: yes (shipped recipes hold an EDIT_ME placeholder here)")
    if key.choices:
        lines.append(f"  choices: {', '.join(map(str, key.choices))}")
    if key.unsupported:
        lines.append(f"  known to verl but not supported by verl-npu yet: {', '.join(key.unsupported)}")
    if key.renamed:
        lines.append(
            "  verl's deprecated names (refused): " + ", ".join(f"{old} -> write {new}" for old, new in key.renamed)
        )
    rng = key_checks.range_text(key)
    if rng:
        lines.append(f"  range: {rng}")
    if key.off_only:
        lines.append(f"  verl-npu does not support {key.off_only} yet: only the default is accepted")
    if key.instead:
        lines.append(f"  instead: {key.instead}")
    if key.noop:
        lines.append(f"  no effect in verl-npu: {key.noop}")
    if key.derived:
        lines.append(f"  derived when not set: {key.derived}")
    if key.path != key.short:
        lines.append(f"  short form on the command line: {key.short}=...")
    # rules that name the key come first (stable otherwise): a rule that reaches it only through
    # other keys (the critic's batch rules read data.* lengths) matters less to someone reading it
    name = key.path.rsplit(".", 1)[-1]
    involved = sorted((r for r in _rules.RULES if key.path in r.keys), key=lambda r: name not in r.text)
    if involved:
        lines.append("  rules:")
        lines += [f"    - {r.text}" for r in involved]
    return "\n".join(lines)
