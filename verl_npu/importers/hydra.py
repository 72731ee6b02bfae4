"""Reading a Hydra config as ROLL does before it maps anything: the `defaults:` list composed (files read
from beside the config), then every `${...}` interpolation resolved; and ROLL's `device_mapping` strings
(`list(range(0,16))`) evaluated without `eval`.

Composition follows Hydra 1.1+: the entries of `defaults:` are merged in order, the file itself at its
`_self_` entry (at the end when the list has none), so the file overrides what it includes. An entry
`path@_here_` merges `path.yaml` at the root; `path@a.b` under key `a.b`; `group: option` reads
`group/option.yaml` under key `group`; `optional` / `override` prefixes are read the same way.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import yaml

from verl_npu.errors import UserError


def read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({exc})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: a config file must hold a mapping at the top, not {type(data).__name__}")
    return data


def merge(base: dict, over: dict) -> dict:
    """Deep merge: `over`'s leaves win; dicts merge key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def _place(tree: dict, package: str) -> dict:
    if package in ("", "_here_", "_global_"):
        return tree
    for part in reversed(package.split(".")):
        tree = {part: tree}
    return tree


def compose(path: Path, *, _seen: tuple[Path, ...] = ()) -> tuple[dict, list[Path]]:
    """The config at `path` with its `defaults:` composed in; also the files read (the config first)."""
    path = path.resolve()
    if path in _seen:
        raise UserError(f"{path}: its defaults list includes itself (through {' -> '.join(map(str, _seen))})")
    raw = read_yaml(path)
    defaults = raw.pop("defaults", None) or []
    if not isinstance(defaults, list):
        raise UserError(f"{path}: defaults must be a list of includes, not {type(defaults).__name__}")
    entries = list(defaults) if "_self_" in defaults else [*defaults, "_self_"]
    merged: dict = {}
    files = [path]
    for entry in entries:
        if entry == "_self_":
            merged = merge(merged, raw)
            continue
        name, package = _entry(entry, path)
        if name is None:
            continue
        target = path.parent / name
        target = target if target.suffix in (".yaml", ".yml") else target.with_suffix(".yaml")
        if not target.exists():
            raise UserError(
                f"{path}: defaults entry {entry!r} names {target}, which does not exist; put the "
                "included file beside the config (as in ROLL's examples/config/) or remove the entry"
            )
        sub, sub_files = compose(target, _seen=(*_seen, path))
        files += sub_files
        merged = merge(merged, _place(sub, package))
    return merged, files


def _entry(entry: Any, path: Path) -> tuple[str | None, str]:
    """(file name relative to the config's folder, package) of one defaults entry."""
    if isinstance(entry, str):
        name, _, package = entry.partition("@")
        return name.strip(), package.strip() or "_here_"
    if isinstance(entry, dict) and len(entry) == 1:
        ((key, option),) = entry.items()
        key = str(key).removeprefix("optional ").removeprefix("override ").strip()
        group, _, package = key.partition("@")
        if option is None:
            return None, ""
        return f"{group}/{option}", package or group.replace("/", ".")
    raise UserError(f"{path}: defaults entry {entry!r} is neither 'path[@package]' nor 'group: option'")


def resolve(tree: dict, source: Path) -> dict:
    """Every `${...}` interpolation resolved (OmegaConf's rules; `${oc.env:VAR}` reads the environment)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(OmegaConf.create(tree), resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or "?"
        raise UserError(
            f"{source}: interpolation at {key} cannot be resolved ({exc.msg if hasattr(exc, 'msg') else exc}); "
            "set the key it refers to, or the environment variable"
        ) from None


def device_list(text: Any, key: str) -> list[int]:
    """ROLL's device_mapping (a list, or a string such as 'list(range(0,16))' / '[0,1]') as device ids."""
    if isinstance(text, list):
        return [int(v) for v in text]
    try:
        value = _eval(ast.parse(str(text), mode="eval").body)
    except (ValueError, SyntaxError, TypeError) as exc:
        raise UserError(
            f"{key}: {text!r} is not a device list (write e.g. list(range(0,8)) or [0,1,2,3]): {exc}"
        ) from None
    if isinstance(value, range):
        value = list(value)
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        raise UserError(f"{key}: {text!r} is not a list of device ids")
    return value


def _eval(node: ast.AST) -> Any:
    """The value of list/range/int literal arithmetic, and nothing else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_eval(e) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        a, b = _eval(node.left), _eval(node.right)
        a = list(a) if isinstance(a, range) else a
        b = list(b) if isinstance(b, range) else b
        return a + b if isinstance(node.op, ast.Add) else (a - b if isinstance(node.op, ast.Sub) else a * b)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        args = [_eval(a) for a in node.args]
        if node.func.id == "range":
            return range(*args)
        if node.func.id == "list" and len(args) == 1:
            return list(args[0])
    raise ValueError(f"only list(), range(), integers and + are allowed, not {ast.dump(node)[:60]}")
