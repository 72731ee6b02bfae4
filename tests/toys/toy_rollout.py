"""A newcomer's rollout engine, in one file: the hf engine, noting each call in $TOY_LOG. Registered by
naming this file in $VERL_NPU_PLUGINS; picked with actor_rollout_ref.rollout.name=toy_hf."""

import os

from verl_npu.registry import ROLLOUT_ENGINES
from verl_npu.rollout.hf import HFRollout


@ROLLOUT_ENGINES.register(
    "toy_hf",
    on_actor_module=True,
    tensor_parallel=False,
    images_in_multiturn=False,
    memory="actor_module",
    doc="the hf engine, logging its calls (a test's toy)",
)
class ToyRollout(HFRollout):
    def generate(self, prompts, params):
        out = super().generate(prompts, params)
        with open(os.environ["TOY_LOG"], "a") as log:
            log.write(f"generate {len(prompts)} prompts -> {len(out)} rows\n")
        return out
