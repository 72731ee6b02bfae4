"""The import ledger: every input key with what became of it, and the recipe it builds.

An importer reads another system's config as a flat table of leaf keys (`a.b[0].c`), then settles
each one through a `Ledger`:

    mapped      the value lands on a recipe key (1:1, renamed, or through arithmetic the note states)
    default     a key the input did not set whose default differs between the two systems: the other
                system's default is written out (the row names the input key it stands for)
    not mapped  verl-npu has no counterpart; the note says what to do instead

`Ledger.finish` adds a row for every input key nothing settled ("not mapped: the importer does not
know this key"), so no key is dropped silently. The recipe keys remember the input keys and the
arithmetic they came from; `recipe_yaml` writes them as comments beside each value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MAPPED, DEFAULT, NOT_MAPPED = "mapped", "default", "not mapped"
#: `1e-6`: YAML 1.1 (PyYAML) reads it as text, OmegaConf and YAML 1.2 as a number, as both systems do
_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


@dataclass
class Row:
    """One input key: its value, what became of it (`status`), the recipe key(s) and the note."""

    key: str
    value: Any
    status: str
    target: str = ""
    note: str = ""


def flatten_input(node: Any, prefix: str = "") -> dict[str, Any]:
    """Leaf keys of a parsed YAML tree: dict keys joined with '.', list items of dicts as `[i]`.
    A list of scalars (or an empty list / dict) is one leaf."""
    out: dict[str, Any] = {}
    if isinstance(node, dict) and node:
        for k, v in node.items():
            out.update(flatten_input(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(node, list) and node and any(isinstance(v, (dict, list)) for v in node):
        for i, v in enumerate(node):
            out.update(flatten_input(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = float(node) if isinstance(node, str) and _FLOAT.match(node) else node
    return out


@dataclass
class Ledger:
    """Input keys, their rows, and the recipe being built (`recipe`: full dotted key -> value)."""

    system: str
    flat: dict[str, Any]
    rows: dict[str, Row] = field(default_factory=dict)
    recipe: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # recipe key -> where its value came from
    notes: list[str] = field(default_factory=list)  # what the user must do next (data prep, files)
    extra_files: dict[str, Any] = field(default_factory=dict)  # suffix -> YAML tree (or text) beside the recipe
    kind: str = "rl"  # the recipe's kind: "rl" (verl-npu run) or "sft" (verl-npu sft)

    # ---- reading the input
    def has(self, key: str) -> bool:
        return key in self.flat

    def get(self, key: str, default: Any = None) -> Any:
        return self.flat.get(key, default)

    def under(self, prefix: str) -> list[str]:
        """Input keys at or below `prefix` (dots and [i] both continue a prefix)."""
        return [k for k in self.flat if k == prefix or k.startswith(prefix + ".") or k.startswith(prefix + "[")]

    def unsettled(self, prefix: str = "") -> list[str]:
        keys = self.under(prefix) if prefix else list(self.flat)
        return [k for k in keys if k not in self.rows]

    # ---- settling keys
    def set(self, target: str, value: Any, origin: str) -> None:
        """Write recipe key `target` (a full dotted key: `backend_config.x.y` or `af_output_dir`)."""
        self.recipe[target] = value
        self.origin[target] = origin

    def map(self, key: str, target: str, value: Any = None, how: str = "1:1", *, transform=None) -> Any:
        """Input `key` -> recipe `target` (short verl form: `data.x` lands under backend_config).
        `value` defaults to the input's; `transform` turns the input's value into the recipe's.
        Returns the value written. A key absent from the input is a no-op (returns None)."""
        if key not in self.flat and value is None:
            return None
        if value is None and self.flat[key] is None:
            self.accept(key, "null: unset, the recipe keeps verl-npu's default")
            return None
        value = self.flat.get(key) if value is None else value
        if transform is not None:
            value = transform(value)
        full = _full(target)
        self.set(full, value, f"{self.system}: {key}" + ("" if how == "1:1" else f" ({how})"))
        self.rows[key] = Row(key, self.flat.get(key), MAPPED, target, how)
        return value

    def map_choice(self, key: str, target: str, choices: dict[str, Any], instead: str) -> None:
        """A named choice: its value looked up in `choices` (ours for theirs); a value missing there is
        not mapped, `instead` (with `{}` for the value) saying what to do."""
        if key not in self.flat:
            return
        theirs = str(self.flat[key])
        if theirs in choices:
            self.map(
                key, target, choices[theirs], "1:1" if choices[theirs] == theirs else f"{theirs} -> {choices[theirs]}"
            )
        else:
            self.not_mapped(key, "not mapped: " + instead.format(theirs))

    def mapped_into(self, key: str, target: str, how: str) -> None:
        """Input `key` took part in the value of `target` (arithmetic written by another call)."""
        if key in self.flat:
            self.rows[key] = Row(key, self.flat[key], MAPPED, target, how)

    def default(self, key: str, target: str, value: Any, why: str) -> None:
        """`key` was not set in the input; the other system's default differs from verl's: write it."""
        self.set(_full(target), value, f"{self.system} default of {key}: {why}")
        self.rows.setdefault(key, Row(key, "(not set)", DEFAULT, target, why))

    def not_mapped(self, key: str, instead: str) -> None:
        if key in self.flat and key not in self.rows:
            self.rows[key] = Row(key, self.flat[key], NOT_MAPPED, "", instead)

    def not_mapped_under(self, prefix: str, instead: str) -> None:
        """Every still unsettled input key at or below `prefix`: not mapped, for the same reason."""
        for k in self.unsettled(prefix):
            self.rows[k] = Row(k, self.flat[k], NOT_MAPPED, "", instead)

    def accept(self, key: str, note: str) -> None:
        """`key` needs nothing in the recipe (its value is what verl-npu does anyway): mapped, with why."""
        if key in self.flat and key not in self.rows:
            self.rows[key] = Row(key, self.flat[key], MAPPED, "(nothing to write)", note)

    def accept_only(self, key: str, value: str, note: str, instead: str) -> None:
        """`key` holding `value` (what verl-npu does anyway) is accepted with `note`; any other value is not
        mapped, `instead` saying why and what to do."""
        if str(self.get(key, value)) == value:
            self.accept(key, note)
        else:
            self.not_mapped(key, instead)

    def finish(self) -> list[Row]:
        """Rows for every input key (those nothing settled: not mapped, unknown to the importer)."""
        self.not_mapped_under(
            "",
            f"unknown to the {self.system} importer: nothing in verl-npu reads it; "
            "check the key's spelling against the source system's schema",
        )
        ordered = [self.rows[k] for k in self.flat]
        return ordered + [r for k, r in self.rows.items() if k not in self.flat]


def _full(target: str) -> str:
    if target == "af_output_dir" or target.startswith(("backend_config.", "engine_kwargs.")):
        return target
    return "backend_config." + target


def nested(flat: dict[str, Any]) -> dict:
    """`{'a.b': 1}` -> `{'a': {'b': 1}}`."""
    out: dict = {}
    for key, value in flat.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def first(values: Iterable[Any]) -> Any:
    for v in values:
        if v is not None:
            return v
    return None
