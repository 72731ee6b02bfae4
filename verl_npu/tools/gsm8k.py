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

from verl_npu.registry import TOOLS
from verl_npu.rewards.gsm8k import compute_score
from verl_npu.tools.answer_check import AnswerCheckTool, answer_tool_schema

SCHEMA = answer_tool_schema(
    "calc_gsm8k_reward", "A tool for calculating the reward of gsm8k", "The answer to the question"
)


@TOOLS.register(
    "gsm8k",
    function_name="calc_gsm8k_reward",
    verl_class_paths=("verl.tools.gsm8k_tool.Gsm8kTool",),
    doc="the GSM8K answer check: scores a submitted answer against the row's ground truth",
)
class Gsm8kTool(AnswerCheckTool):
    SCHEMA = SCHEMA

    def submitted(self, answer: str) -> str:
        return answer if answer.startswith("#### ") else "#### " + answer

    def grade(self, submitted: str, ground_truth: str) -> float:
        return float(compute_score("openai/gsm8k", submitted, ground_truth, method="flexible")["score"])
