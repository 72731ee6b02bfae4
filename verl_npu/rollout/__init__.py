"""Rollout engines: each is a `verl_npu.rollout.base.RolloutEngine` subclass declared with
`@ROLLOUT_ENGINES.register(...)` (`verl_npu.registry`, `actor_rollout_ref.rollout.name`) and built here."""

from __future__ import annotations

from verl_npu.registry import ROLLOUT_ENGINES


def rollout_class(name: str) -> type:
    return ROLLOUT_ENGINES.load(name)


def build_rollout(
    name: str, module, tokenizer, processor, cfg, *, rank: int = 0, world_size: int = 1, device=None, weights=None
):
    """The engine `name`, built for this rank (the arguments: `RolloutEngine.from_config`)."""
    return rollout_class(name).from_config(
        module, tokenizer, processor, cfg, rank=rank, world_size=world_size, device=device, weights=weights
    )
