"""Command-line overrides as verl / Hydra users write them: `key=value` with the value parsed as YAML (no
aliases), Hydra's `+key=value`, `++key=value` and `~key` (the key back to its default: `DELETE`)."""

from __future__ import annotations

import re
from typing import Any

import yaml

from verl_npu.config.tree import expand_key
from verl_npu.errors import UserError

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+)*$")


class _Delete:
    """The value of a Hydra `~key` override: remove the key, so its default applies."""

    def __repr__(self) -> str:
        return "<delete>"


DELETE = _Delete()


class _NoAliasLoader(yaml.SafeLoader):
    """YAML without anchors' aliases: a value on the command line is never expanded from a `*ref`
    (a "billion laughs" override of a few hundred characters would otherwise grow to gigabytes)."""

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's own signature
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("YAML aliases (*name) are not accepted in a command-line value")
        return super().compose_node(parent, index)


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
        value = yaml.load(s, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader without aliases
    except yaml.YAMLError:
        return s
    if isinstance(value, dict) and not s.startswith("{"):
        return s  # 'EDIT_ME: x' or 'a: b' on a command line is text, not a mapping
    return value


def parse_override(text: str) -> tuple[str, Any]:
    """`key=value` -> (full dotted key, parsed value), with Hydra's prefixes: `+key=value` (add) and
    `++key=value` (add or override) set the key like `key=value`; `~key` (or `~key=value`) deletes
    it, so the schema default applies again: its value is `DELETE`."""
    body = text.strip()
    delete = body.startswith("~")
    if delete:
        body = body[1:]
    elif "=" not in body:
        raise UserError(
            f"override '{text}' is not key=value (example: data.train_batch_size=64; "
            "~key puts a key back to its default)"
        )
    key, _, value = body.partition("=")
    key = key.strip()
    if not delete:
        key = key[2:] if key.startswith("++") else key[1:] if key.startswith("+") else key
    if not _KEY_RE.match(key):
        raise UserError(f"override '{text}': '{key}' is not a dotted key (example: data.train_batch_size=64)")
    return expand_key(key), DELETE if delete else parse_value(value)


def added_with_plus(text: str) -> bool:
    """True for Hydra's `+key=value` / `++key=value`: a key the user adds, which verl itself lets through."""
    return text.strip().startswith("+")
