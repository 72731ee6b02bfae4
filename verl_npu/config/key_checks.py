"""Per-key validation: one key's value against its schema entry on its own (required, placeholder, type,
verl features not supported yet, renamed and unsupported values, choices, user files, finite numbers, 64-bit
integers, range); the cross-key rules are in `rules.py`."""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig

from verl_npu.config.schema import (
    BOOL,
    DICT,
    FLOAT,
    FLOAT_LIST,
    FLOAT_OR_STR,
    INT,
    INT_LIST,
    SCHEMA,
    STR,
    STR_LIST,
    STR_OR_LIST,
    Key,
)
from verl_npu.config.tree import get_many, is_placeholder, scalar
from verl_npu.errors import Problem
from verl_npu.registry import registry_of


def _a(type_name: str) -> str:
    """The type's name with its article: "an int", "a float"."""
    return f"{'an' if type_name[:1] in 'aeiou' else 'a'} {type_name}"


def _type_ok(type_: str, value: Any) -> bool:
    if type_ == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if type_ == FLOAT:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if type_ == BOOL:
        return isinstance(value, bool)
    if type_ == STR:
        return isinstance(value, str)
    if type_ == DICT:
        return isinstance(value, dict)
    if type_ == STR_LIST:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if type_ == FLOAT_OR_STR:
        return isinstance(value, (int, float, str)) and not isinstance(value, bool)
    if type_ == STR_OR_LIST:
        return isinstance(value, str) or (
            isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)
        )
    if type_ == FLOAT_LIST:
        return isinstance(value, list) and all(_type_ok(FLOAT, v) for v in value)
    if type_ == INT_LIST:
        return isinstance(value, list) and all(_type_ok(INT, v) for v in value)
    raise AssertionError(f"unknown schema type {type_}")


def range_text(key: Key) -> str:
    """The numeric limits of a key in words ('' when none)."""
    parts = []
    if key.gt is not None:
        parts.append(f"> {key.gt:g}")
    if key.min is not None:
        parts.append(f">= {key.min:g}")
    if key.max is not None:
        parts.append(f"<= {key.max:g}")
    return " and ".join(parts)


_INT64_MAX = 2**63 - 1  # what torch and numpy hold; a larger count or length is a typo
_show = scalar  # a value as the user writes it in YAML (true, null, [a, b])
_is_placeholder = is_placeholder


def _limits_and_default(key: Key) -> str:
    """What a fix of a number adds: the key's limits in brackets, and its default as an example."""
    return (f" ({range_text(key)})" if range_text(key) else "") + (
        f", e.g. the default {_show(key.default)}" if key.default is not None else ""
    )


def check_key(key: Key, value: Any) -> list[Problem]:
    """Problems of one key's value on its own (no other keys involved)."""
    p = key.path
    if key.required and (value is None or value == "" or value == []):
        return [Problem(p, "is required but not set", f"set it in the recipe or pass {key.short}=VALUE")]
    if _is_placeholder(value):
        return [
            Problem(
                p,
                f"still holds the placeholder {value!r}",
                f"edit it in the recipe, or pass {key.short}=<your value> ({key.doc.rstrip('.')})",
            )
        ]
    if value is None:
        if key.allows_null:
            return []
        return [Problem(p, "must not be null", f"set {_a(key.type)} (default: {_show(key.default)})")]
    if not _type_ok(key.type, value):
        return [
            Problem(
                p,
                f"must be {_a(key.type)}, got {value!r} ({type(value).__name__})",
                f"set {_a(key.type)} value"
                + (
                    f" (verl's default, used when the key is unset, is {_show(key.default)})"
                    if key.default is not None
                    else ""
                ),
            )
        ]
    is_off = value == key.default or (key.default is None and value is False)
    if key.off_only and not is_off:
        return [
            Problem(
                p,
                f"verl-npu does not support {key.off_only} yet (a verl feature; got {_show(value)})",
                key.instead or f"remove it or set it to {_show(key.default)}",
            )
        ]
    values = value if isinstance(value, list) and key.type in (STR_LIST, STR_OR_LIST) else [value]
    for v in values:
        for old, new in key.renamed:
            if v == old:
                return [Problem(p, f"{old!r} is verl's deprecated name for {new!r}", f"write {new} instead of {old}")]
        if v in key.unsupported:
            return [
                Problem(
                    p,
                    f"verl-npu does not support {key.short.rsplit('.', 1)[-1]}={v} yet",
                    key.instead or f"use one of: {', '.join(map(str, key.choices))}",
                )
            ]
        if key.user_files and registry_of(key.short).user_files_allowed(v):
            problem = registry_of(key.short).file_problem(v)
            return [Problem(p, problem, "fix the file or the name after the colon")] if problem else []
        if key.choices and v not in key.choices:
            return [
                Problem(
                    p,
                    f"{v!r} is not one of {', '.join(map(str, key.choices))}",
                    f"pick one of: {', '.join(map(str, key.choices))}"
                    + ("; or your own function as path/to/file.py:function" if key.user_files else ""),
                )
            ]
    numbers = value if key.type == FLOAT_LIST else [value] if key.type == FLOAT else []
    if any(not math.isfinite(v) for v in numbers):
        return [Problem(p, f"{_show(value)} is not a finite number", "set a finite value" + _limits_and_default(key))]
    if key.type == INT and abs(value) > _INT64_MAX:
        return [
            Problem(p, f"{value!r} does not fit a 64-bit integer", "set a value below 2**63" + _limits_and_default(key))
        ]
    if key.type in (INT, FLOAT):
        bad = (
            (key.gt is not None and not value > key.gt)
            or (key.min is not None and value < key.min)
            or (key.max is not None and value > key.max)
        )
        if bad:
            return [
                Problem(p, f"{value!r} is out of range (must be {range_text(key)})", f"set a value {range_text(key)}")
            ]
    return []


def check_keys(cfg: DictConfig, user_keys: frozenset[str]) -> list[Problem]:
    """Per-key problems for every schema key (defaults included, so required keys are caught)."""
    problems: list[Problem] = []
    values = get_many(cfg, SCHEMA)
    for key in SCHEMA.values():
        problems += check_key(key, values[key.path])
    return problems
