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

from verl_npu.registry import TOOLS
from verl_npu.rewards.geo3k import answer_reward
from verl_npu.tools.answer_check import AnswerCheckTool, answer_tool_schema

SCHEMA = answer_tool_schema(
    "calc_geo3k_reward",
    "A tool for calculating the reward of geo3k (1.0 if the parsed answer is correct, 0.0 if it "
    "is incorrect or cannot be parsed).",
    "The answer to the geo3k problem.",
)


@TOOLS.register(
    "geo3k",
    function_name="calc_geo3k_reward",
    verl_class_paths=("verl.tools.geo3k_tool.Geo3kTool",),
    doc="the Geometry3K answer check: grades a submitted answer against the row's ground truth",
)
class Geo3kTool(AnswerCheckTool):
    SCHEMA = SCHEMA

    def grade(self, submitted: str, ground_truth: str) -> float:
        return answer_reward(submitted, ground_truth)
