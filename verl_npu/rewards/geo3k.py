"""Geometry3K reward: ``score = 0.9 * accuracy + 0.1 * format`` (as verl scores hiyouga/geometry3k).

- format = 1 if the whole response matches ``<think>.*</think>.*\\boxed{.*}.*`` (dot matches
  newlines): it starts with ``<think>``, closes it, and then has a ``\\boxed{...}``.
- accuracy = 1 if the content of the last ``\\boxed{...}`` (braces balanced) equals the ground
  truth under mathruler's ``grade_answer`` (string normalisation, then sympy equality), else 0;
  a response without a complete ``\\boxed{}`` has accuracy 0.

Possible scores: 0, 0.1, 0.9, 1.0.
"""

from __future__ import annotations

import re
from typing import Any

from mathruler.grader import extract_boxed_content, grade_answer

FORMAT_PATTERN = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)
FORMAT_WEIGHT = 0.1


def boxed_answer(response: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` in ``response``, or None if there is none."""
    if "\\boxed{" not in response:
        return None
    content = extract_boxed_content(response)
    return None if content == "None" and "\\boxed{None}" not in response else content


def format_reward(response: str) -> float:
    """1.0 if the response is ``<think>...</think>...\\boxed{...}...``, else 0.0."""
    return 1.0 if FORMAT_PATTERN.fullmatch(response) else 0.0


def accuracy_reward(response: str, ground_truth: Any) -> float:
    """1.0 if the last boxed answer grades equal to ``ground_truth`` (mathruler; a number is read as its text),
    else 0.0."""
    answer = boxed_answer(response)
    return 1.0 if answer is not None and grade_answer(answer, str(ground_truth)) else 0.0


def answer_reward(answer: str, ground_truth: str) -> float:
    """1.0 if ``answer`` itself (no ``\\boxed{}`` needed) grades equal to ``ground_truth`` (mathruler), else 0.0:
    verl's geo3k accuracy with ``use_boxed=False``, as its Geo3kTool scores a submitted answer."""
    return 1.0 if grade_answer(str(answer).strip(), str(ground_truth)) else 0.0


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    format_weight: float = FORMAT_WEIGHT,
) -> dict:
    """``{"score": (1 - w) * accuracy + w * format, "accuracy", "format"}`` with ``w = format_weight``."""
    acc = accuracy_reward(solution_str, ground_truth)
    fmt = format_reward(solution_str)
    return {"score": (1.0 - format_weight) * acc + format_weight * fmt, "accuracy": acc, "format": fmt}
