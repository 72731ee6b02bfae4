"""A newcomer's worker role, in one file: built on every rank of every run, it notes what it was built
with in $TOY_LOG. Registered by naming this file in $VERL_NPU_PLUGINS."""

import os

from verl_npu.registry import ROLES


@ROLES.register(
    "toy_role",
    needed_when=("always",),
    checkpointed=False,
    metrics="toy_role",
    doc="a worker that only reports it was built (a test's toy)",
)
class ToyRole:
    def __init__(self, cfg, total_training_steps, device, rank=0, world_size=1):
        self.steps, self.rank, self.world_size = total_training_steps, rank, world_size

    def init_model(self) -> dict:
        with open(os.environ["TOY_LOG"], "a") as log:
            log.write(f"role built: rank {self.rank} of {self.world_size}, {self.steps} steps\n")
        return {"num_params": 0}
