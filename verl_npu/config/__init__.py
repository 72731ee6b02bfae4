"""The recipe config system: schema, loading with overrides, validation and derived settings.

    from verl_npu.config import load_recipe
    rc = load_recipe("qwen25vl_geo3k", overrides=["data.train_batch_size=8"])
    rc.backend.data.train_batch_size   # 8

Importing this package does not import torch, transformers or ray.
"""

from verl_npu.config.loader import (
    Derived, RecipeConfig, describe_key, expand_key, load_recipe, parse_override, parse_value,
)
from verl_npu.config.rules import RULES, check_paths
from verl_npu.config.schema import DEPRECATED, REQUIRED, SCHEMA, UNSUPPORTED_PREFIXES, Key


def find_key(name: str) -> Key | None:
    """The schema entry for a full (`backend_config.data.x`) or short verl (`data.x`) key, else None."""
    return SCHEMA.get(name) or SCHEMA.get(expand_key(name))


__all__ = [
    "DEPRECATED", "REQUIRED", "RULES", "SCHEMA", "UNSUPPORTED_PREFIXES", "Derived", "Key", "RecipeConfig",
    "check_paths", "describe_key", "expand_key", "find_key", "load_recipe", "parse_override", "parse_value",
]
