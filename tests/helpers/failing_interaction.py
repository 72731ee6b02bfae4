"""A grid_env interaction that fails on purpose (tests/rollout/test_vllm_interactions.py): its second reply of a run
raises (`fail: raise` in its config) or never returns (`fail: hang`). An interaction's error is not the
model's to read, so it is an error of the agent loop itself: the run must stop, on every rank, in bounded
time. Named in an interaction config as `<this file>:FailingGridEnv`."""

from __future__ import annotations

import time

from verl_npu.tools.interactions.grid_env import GridEnvInteraction

INJECTED = "injected failure in the interaction's reply"


class FailingGridEnv(GridEnvInteraction):
    def __init__(self, config: dict):
        config = dict(config)
        self.fail = config.pop("fail", "raise")
        super().__init__(config)
        self.replies = 0

    def generate_response(self, instance_id, messages, **kwargs):
        self.replies += 1
        if self.replies == 2:
            if self.fail == "hang":
                time.sleep(3600)
            raise ValueError(INJECTED)
        return super().generate_response(instance_id, messages, **kwargs)
