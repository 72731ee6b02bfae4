"""Rollout engines: each is a `verl_npu.rollout.base.RolloutEngine` subclass, named in the one
registry `verl_npu.rollout_engines` (`actor_rollout_ref.rollout.name`) and built here."""

from __future__ import annotations

import importlib

from verl_npu.rollout_engines import rollout_spec


def rollout_class(name: str) -> type:
    module_name, _, class_name = rollout_spec(name).target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def build_rollout(name: str, module, tokenizer, processor, cfg, *, rank: int = 0, world_size: int = 1, device=None,
                  weights=None):
    """The engine `name`, built for this rank (the arguments: `RolloutEngine.from_config`)."""
    return rollout_class(name).from_config(module, tokenizer, processor, cfg, rank=rank, world_size=world_size,
                                           device=device, weights=weights)
