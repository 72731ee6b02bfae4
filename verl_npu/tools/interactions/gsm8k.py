"""The GSM8K interaction (verl's `Gsm8kInteraction` semantics; interaction config class_name `gsm8k` or
verl's `verl.interactions.gsm8k_interaction.Gsm8kInteraction`).

The row's `extra_info.interaction_kwargs` carry `ground_truth` (data_prep/gsm8k_multiturn_w_tool.py writes
it). After each model turn the interaction reads the last assistant message as an answer (prefixed with
`#### ` when it does not start so) and scores it with GSM8K's flexible reading (the last number;
`verl_npu.rewards.gsm8k`), 1.0 right, 0.0 otherwise. Right: it says so and ends the trajectory. Wrong: it
asks the model to think again and the conversation goes on. The turn's score is that 0/1 score.
"""

from __future__ import annotations

import uuid

from verl_npu.rewards.gsm8k import compute_score
from verl_npu.tools.interactions.base import BaseInteraction, last_assistant_text

RIGHT = "Correct."
WRONG = "That answer is wrong. Check your reasoning and answer again."


class Gsm8kInteraction(BaseInteraction):
    def __init__(self, config: dict):
        super().__init__(config)
        self._state: dict[str, dict] = {}

    def start_interaction(self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs) -> str:
        instance_id = instance_id or str(uuid.uuid4())
        self._state[instance_id] = {"response": "", "ground_truth": None if ground_truth is None else str(ground_truth)}
        return instance_id

    def generate_response(self, instance_id: str, messages: list[dict], **kwargs) -> tuple[bool, str, float, dict]:
        answer = last_assistant_text(messages)
        self._state[instance_id]["response"] = answer if answer.startswith("#### ") else "#### " + answer
        score = self.calculate_score(instance_id)
        return score == 1.0, RIGHT if score == 1.0 else WRONG, score, {}

    def calculate_score(self, instance_id: str | None = None, **kwargs) -> float:
        state = self._state[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return float(
            compute_score("openai/gsm8k", state["response"], state["ground_truth"], method="flexible")["score"]
        )

    def finalize_interaction(self, instance_id: str | None = None, **kwargs) -> None:
        self._state.pop(instance_id, None)
