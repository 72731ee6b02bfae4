"""The GSM8K answer-check tool (verl's `Gsm8kTool` semantics; tool config class_name `gsm8k` or verl's
`verl.tools.gsm8k_tool.Gsm8kTool`).

The model submits an answer (`{"answer": "72"}`); the tool scores it against the row's ground truth
(`extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth`, written by
data_prep/gsm8k_multiturn_w_tool.py) and tells the model, as the tool turn,
`Current parsed answer='72' reward=1.0`. Scoring is GSM8K's flexible reading (the last number of
"#### <answer>"; verl_npu.rewards.gsm8k), 1.0 right, 0.0 otherwise. The step reward (`execute`'s second
value) is 0.0 when the answer scores higher than the trajectory's best so far and -0.05 otherwise (a
penalty for submitting without improving). The state lives per instance id and is dropped on `release`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from verl_npu.rewards.gsm8k import compute_score
from verl_npu.tools.base import BaseTool, ToolResponse

SCHEMA = {
    "type": "function",
    "function": {
        "name": "calc_gsm8k_reward",
        "description": "A tool for calculating the reward of gsm8k",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "The answer to the question"}},
            "required": ["answer"],
        },
    },
}
NO_IMPROVEMENT_PENALTY = -0.05


class Gsm8kTool(BaseTool):
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
        if isinstance(parameters, str):  # verl's older tools received the JSON text
            try:
                parameters = json.loads(parameters)
            except json.JSONDecodeError:
                parameters = {}
        answer = parameters.get("answer", "") if isinstance(parameters, dict) else ""
        answer = answer if isinstance(answer, str) else str(answer)
        state = self._state[instance_id]
        state["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else NO_IMPROVEMENT_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed {answer=} {reward=}"), step_reward, {}

    def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self._state[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return float(compute_score("openai/gsm8k", state["response"], state["ground_truth"], method="flexible")["score"])

    def release(self, instance_id: str, **kwargs) -> None:
        self._state.pop(instance_id, None)
