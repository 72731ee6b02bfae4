"""Reward of the synthetic polygon task: ``score = 0.9 * accuracy + 0.1 * format``.

- answer: the content of the last ``\\boxed{...}`` if the response has one, else the first
  number in the response;
- accuracy = 1 if that answer equals the ground truth under mathruler's ``grade_answer``;
- format = 1 if the response has a complete ``\\boxed{...}`` (the format geometry3k asks for).

Why a bare number earns no format credit: a policy trained from scratch would otherwise learn
"start with any digit" first, for every picture alike, and that image-blind habit (worth 0.1 on
every sample) drowns out the accuracy signal it has to learn from. Bare numbers still count as
answers for accuracy.

The task's answers are balanced over 3, 4, 5 and 6 (see ``verl_npu.data.synthetic_geometry``),
so a policy that ignores the image is right at most 25% of the time in expectation and its best
expected score is ``0.9 * 0.25 + 0.1 = 0.325``; a mean score clearly above 0.325 means the
policy reads the picture.
"""

from __future__ import annotations

import re

from mathruler.grader import grade_answer

from verl_npu.rewards.geo3k import boxed_answer

FORMAT_WEIGHT = 0.1
BLIND_BEST_SCORE = (1 - FORMAT_WEIGHT) * 0.25 + FORMAT_WEIGHT  # 0.325
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract_answer(response: str) -> str | None:
    """The last boxed answer if there is one, else the first number in the response, else None."""
    boxed = boxed_answer(response)
    if boxed is not None:
        return boxed
    m = NUMBER.search(response)
    return m.group(0) if m else None


def format_reward(response: str) -> float:
    """1.0 if the response has a complete ``\\boxed{...}``."""
    return 1.0 if boxed_answer(response) is not None else 0.0


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> dict:
    """``{"score": 0.9 * accuracy + 0.1 * format, "accuracy", "format"}``."""
    answer = extract_answer(solution_str)
    acc = 1.0 if answer is not None and grade_answer(answer, ground_truth) else 0.0
    fmt = format_reward(solution_str)
    return {"score": (1 - FORMAT_WEIGHT) * acc + FORMAT_WEIGHT * fmt, "accuracy": acc, "format": fmt}
