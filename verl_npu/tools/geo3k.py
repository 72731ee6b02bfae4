"""The Geometry3K answer-check tool (verl's `Geo3kTool` semantics; tool config class_name `geo3k` or verl's
`verl.tools.geo3k_tool.Geo3kTool`, as verl's geo3k multi-turn example names it).

The model submits an answer (`{"answer": "24"}`); the tool grades it against the row's ground truth
(`extra_info.tools_kwargs.calc_geo3k_reward.create_kwargs.ground_truth`, written by
`data_prep/geometry3k.py --multiturn`) and tells the model, as the tool turn,
`Current parsed answer='24' reward=1.0`. Grading is verl's geo3k accuracy on the answer itself (no
`\\boxed{}` needed: mathruler's `grade_answer`, string normalisation then sympy equality; format weight 0),
1.0 right, 0.0 otherwise (`calc_reward`). The step reward (`execute`'s second value) is 0.0 when the answer
scores higher than the trajectory's best so far and -0.05 otherwise (a penalty for submitting without
improving). The state lives per instance id and is dropped on `release`.
"""

from __future__ import annotations

import uuid
from typing import Any

from verl_npu.rewards.geo3k import answer_reward
from verl_npu.tools.base import BaseTool, ToolResponse

SCHEMA = {
    "type": "function",
    "function": {
        "name": "calc_geo3k_reward",
        "description": "A tool for calculating the reward of geo3k (1.0 if the parsed answer is correct, 0.0 "
                       "if it is incorrect or cannot be parsed).",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "The answer to the geo3k problem."}},
            "required": ["answer"],
        },
    },
}
NO_IMPROVEMENT_PENALTY = -0.05


class Geo3kTool(BaseTool):
    def __init__(self, config: dict, tool_schema=None):
        super().__init__(config, tool_schema or SCHEMA)
        self._state: dict[str, dict[str, Any]] = {}

    def create(self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs):
        create_kwargs = kwargs.get("create_kwargs") or {}
        instance_id = instance_id or str(uuid.uuid4())
        truth = ground_truth if ground_truth is not None else create_kwargs.get("ground_truth")
        self._state[instance_id] = {"response": "", "ground_truth": None if truth is None else str(truth),
                                    "reward": 0.0}
        return instance_id, ToolResponse()

    def execute(self, instance_id: str, parameters: Any, **kwargs):
        answer = parameters.get("answer", "") if isinstance(parameters, dict) else ""
        answer = answer if isinstance(answer, str) else str(answer)
        state = self._state[instance_id]
        state["response"] = answer
        reward = self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else NO_IMPROVEMENT_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed {answer=} {reward=}"), step_reward, {}

    def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self._state[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return answer_reward(state["response"], state["ground_truth"])

    def release(self, instance_id: str, **kwargs) -> None:
        self._state.pop(instance_id, None)
