"""What one config key is (`Key`) and the type names the schema uses: the bottom of the schema modules,
which `schema`, `schema_algorithm` and `schema_verl*` all build on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Type names (what `explain` prints and `rules.check_type` accepts).
INT, FLOAT, BOOL, STR, DICT = "int", "float", "bool", "str", "dict"
STR_LIST, STR_OR_LIST, FLOAT_LIST, INT_LIST = "list[str]", "str | list[str]", "list[float]", "list[int]"
FLOAT_OR_STR = "float | str"  # a number, or a string spelling one or more (rollout correction's thresholds)


@dataclass(frozen=True)
class Key:
    """One config key: full dotted path, default, type name, one-line meaning and limits."""

    path: str
    default: Any
    type: str
    doc: str
    choices: tuple = ()  # supported values (empty: any value of the type)
    unsupported: tuple = ()  # values verl knows but verl-npu does not support yet
    renamed: tuple = ()  # (old, new) value pairs verl deprecated: refused, naming the new value
    min: float | None = None  # inclusive lower bound
    max: float | None = None  # inclusive upper bound
    gt: float | None = None  # exclusive lower bound
    nullable: bool = False  # null allowed (implied by a null default)
    required: bool = False  # must be set by the user (placeholders refused)
    off_only: str = ""  # non-empty: only the default is supported; text says what is missing
    instead: str = ""  # with off_only / unsupported: what to do instead
    noop: str = ""  # non-empty: accepted, but has no effect in verl-npu; text says why
    derived: str = ""  # non-empty: filled in by verl_npu.config.derive when not set; says how
    user_files: bool = False  # a user's `path/file.py:function` is a value too (checked by its registry)

    @property
    def short(self) -> str:
        """The key without the `backend_config.` prefix (verl's own spelling)."""
        return self.path[len("backend_config.") :] if self.path.startswith("backend_config.") else self.path

    @property
    def allows_null(self) -> bool:
        return self.nullable or self.default is None
