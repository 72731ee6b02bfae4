"""The recipe config system: schema, loading with overrides, validation and derived settings.

    from verl_npu.config import load_recipe
    rc = load_recipe("qwen25vl_geo3k", overrides=["data.train_batch_size=8"])
    rc.backend.data.train_batch_size   # 8
    rc.typed.data.train_batch_size     # 8, from a frozen section generated from the schema

Importing this package does not import torch, transformers or ray.

Import order (one way: a module imports only modules above it, at module level or inside a
function; tests/test_config_compat.py checks it, and imports each module fresh in a subprocess):

    schema_multiturn  the multi-turn rollout keys as plain data (imports nothing; schema reads it)
    schema        the keys verl-npu reads (defaults, types, limits)
    schema_verl   verl keys verl-npu does not implement: no-ops, refusals, aliases, refused subtrees
    tree          key spellings, the recipe file as a dict, flattening, reading one value
    modelinfo     what the checks read from a local model's config.json
    rules         per-key checks and the cross-key rule registry (RULES), trainer refusals included
    rules_roles   the worker roles' rules (every role's FSDP settings, reward_model.*, actor.policy_loss),
                  added to RULES
    rules_profiler  the profiler tools and their rule, added to RULES (torch-free device kind)
    rules_multiturn  the multi-turn rollout's rule (rule rewards, end-of-turn stops) and the tool config file's shape
    rules_dapo    DAPO's rules (filter_groups, the dapo reward manager's overlong buffer), added to RULES
    rules_reward_norm  the rules of algorithm.reward_norm (ROLL's reward normalisation) and of the
                  optimal-token-baseline estimators, added to RULES
    rules_rollout_corr  rollout correction's rules (algorithm.rollout_correction.*), added to RULES
    paths         --check-paths: data files, model folders (hub ids resolved), reward file, adapter
    derive        derived values
    recipes       finding, listing and copying shipped recipe files (uses tree only)
    sft_schema    the SFT recipe's keys (verl 0.9.1's sft_trainer_engine.yaml, the older fsdp_sft_trainer spellings)
    loader        load_recipe: read, override, classify, resolve, check, derive
    sft           load_sft_recipe: an SFT recipe read, mapped, checked and derived (`verl-npu sft`)
    stages        load_stages: a recipe naming an SFT stage then an RL stage, both checked
    typed         the typed, read-only sections generated from the schema (`rc.typed`): what the
                  training code reads, and what travels to the workers
    reference, compat  the generated docs (config_reference.md, verl_compat.md)
    memory_plan   the per-device memory formulas (weights, gradients, AdamW, activations, logits, KV cache)
    memory_recipe the memory plan of a resolved recipe: phases, host figure, verdict, knobs (`verl-npu plan`)
"""

from verl_npu.config.loader import (
    Derived, RecipeConfig, describe_key, expand_key, load_recipe, parse_override, parse_value,
)
from verl_npu.config.schema_verl import ALIASES, REFUSED_SUBTREES, VERL_ONLY
from verl_npu.config.paths import check_paths
from verl_npu.config.rules import RULES
from verl_npu.config.schema import DEPRECATED, REQUIRED, SCHEMA, UNSUPPORTED_PREFIXES, Key


def find_key(name: str) -> Key | None:
    """The schema entry for a full (`backend_config.data.x`) or short verl (`data.x`) key, else None."""
    return SCHEMA.get(name) or SCHEMA.get(expand_key(name))


__all__ = [
    "ALIASES", "DEPRECATED", "REFUSED_SUBTREES", "REQUIRED", "RULES", "VERL_ONLY", "SCHEMA", "UNSUPPORTED_PREFIXES", "Derived", "Key", "RecipeConfig",
    "check_paths", "describe_key", "expand_key", "find_key", "load_recipe", "parse_override", "parse_value",
]
