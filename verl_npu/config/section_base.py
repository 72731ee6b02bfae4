"""The base of the typed config sections (`verl_npu.config.typed`, whose classes are generated into
`verl_npu.config.sections`): read-only, keyed by the schema, mapping access too. Imports nothing heavy."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

ROOT = "backend_config"
#: full section path -> its class (filled by verl_npu.config.typed)
SECTIONS: dict[str, type[Section]] = {}
#: builds a section from a path and a tree (verl_npu.config.typed.section, set when that module is imported)
BUILD: Callable[[str, Any], Any] | None = None


def _short(path: str) -> str:
    return path[len(ROOT) + 1 :] if path.startswith(ROOT + ".") else path


class ConfigKeyError(AttributeError, KeyError):
    """A key that is not in the schema was read (or given to `section`)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class FrozenDict(dict):
    """A free-form dict value (`override_config`, `engine_kwargs.vllm`, ...): a `dict` that refuses changes."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("config values are read-only: build a new dict (dict(value)) to change one")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __reduce__(self):
        return (FrozenDict, (dict(self),))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return FrozenDict(copy.deepcopy(dict(self), memo))


class Section:
    """Base of the generated section classes (see the module docstring)."""

    _path_: ClassVar[str] = ""
    _keys_: ClassVar[tuple[str, ...]] = ()

    def __getattr__(self, name: str) -> Any:  # only reached for a name that is not a field
        if name.startswith("__") or name in ("_path_", "_keys_"):
            raise AttributeError(name)
        raise ConfigKeyError(_unknown(self._path_, name))

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys_:
            raise ConfigKeyError(_unknown(self._path_, key))
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of `key` (a key or sub-section of this section; `default` is never needed: every
        schema key is present). A key the schema does not have raises `ConfigKeyError`, as attribute
        access does."""
        return self[key]

    def __contains__(self, key: object) -> bool:
        return key in self._keys_

    def __iter__(self):
        return iter(self._keys_)

    def __len__(self) -> int:
        return len(self._keys_)

    def keys(self):
        return self._keys_

    def values(self):
        return tuple(getattr(self, k) for k in self._keys_)

    def items(self):
        return tuple((k, getattr(self, k)) for k in self._keys_)

    def to_dict(self) -> dict:
        """Plain nested dicts and lists (what a YAML or JSON writer, or `OmegaConf.create`, takes)."""
        return {k: plain(v) for k, v in self.items()}

    def replace(self, **changes: Any) -> Section:
        """A copy with `changes` (keys of this section), checked and converted as `section` does."""
        tree = self.to_dict()
        tree.update(changes)
        assert BUILD is not None, "verl_npu.config.typed is not imported"
        return BUILD(self._path_, tree)


Mapping.register(Section)


def plain(value: Any) -> Any:
    """`value` with every section and read-only dict turned into plain dicts and lists (for code outside
    verl-npu, such as vLLM's engine arguments, that may change what it is given)."""
    if isinstance(value, Section):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _unknown(path: str, name: str) -> str:
    full = f"{path}.{name}" if path else name
    known = ", ".join(SECTIONS[path]._keys_) if path in SECTIONS else ""
    return f"{_short(full)} is not a config key verl-npu reads (the schema's keys of {_short(path)}: {known})"
