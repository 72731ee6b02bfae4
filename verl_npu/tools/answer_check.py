"""The shared part of the answer-check tools (verl's `Gsm8kTool` / `Geo3kTool` pattern): the model
submits `{"answer": ...}`; the tool grades it against the row's ground truth and answers, as the tool
turn, `Current parsed answer='...' reward=...`. The step reward (`execute`'s second value) is 0.0 when
the answer scores higher than the trajectory's best so far and -0.05 otherwise (a penalty for
submitting without improving). The state lives per instance id and is dropped on `release`.

A subclass gives its schema and `grade(submitted, ground_truth) -> float`, and may rewrite what the
model submitted before grading (`submitted`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from verl_npu.tools.base import BaseTool, ToolResponse

NO_IMPROVEMENT_PENALTY = -0.05


def answer_tool_schema(name: str, description: str, answer_description: str) -> dict:
    """The OpenAI function schema of an answer-check tool: one required string argument, `answer`."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": answer_description}},
                "required": ["answer"],
            },
        },
    }


class AnswerCheckTool(BaseTool):
    #: the tool's OpenAI function schema when the tool config gives none
    SCHEMA: dict = {}

    def __init__(self, config: dict, tool_schema=None):
        super().__init__(config, tool_schema or self.SCHEMA)
        self._state: dict[str, dict[str, Any]] = {}

    def submitted(self, answer: str) -> str:
        """What is graded for the model's answer (the answer itself by default)."""
        return answer

    def grade(self, submitted: str, ground_truth: str) -> float:
        raise NotImplementedError

    def create(self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs):
        create_kwargs = kwargs.get("create_kwargs") or {}
        instance_id = instance_id or str(uuid.uuid4())
        truth = ground_truth if ground_truth is not None else create_kwargs.get("ground_truth")
        self._state[instance_id] = {
            "response": "",
            "ground_truth": None if truth is None else str(truth),
            "reward": 0.0,
        }
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
        state["response"] = self.submitted(answer)
        reward = self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else NO_IMPROVEMENT_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed {answer=} {reward=}"), step_reward, {}

    def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self._state[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return float(self.grade(state["response"], state["ground_truth"]))

    def release(self, instance_id: str, **kwargs) -> None:
        self._state.pop(instance_id, None)
