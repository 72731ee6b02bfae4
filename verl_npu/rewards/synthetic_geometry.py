"""Reward of the synthetic polygon task: ``score = accuracy * (0.8 + 0.2 * clean)``.

- answer: the content of the last ``\\boxed{...}`` if the response has one, else the first
  number in the response;
- accuracy = 1 if that answer equals the ground truth under mathruler's ``grade_answer``;
- clean = 1 if the response is nothing but the answer: after stripping white space it is a bare
  number (``4``) or one ``\\boxed{...}`` around a number (``\\boxed{4}``). The response text
  is decoded without special tokens, so ``4`` followed by the end-of-turn token is clean, and
  ``4Find4`` (the answer, then whatever came next until the token budget ran out) is not.

Possible scores: 0 (wrong or no answer), 0.8 (right answer with trailing text), 1.0 (right and
clean). ``docs/demo.md`` says why the reward has this shape; in short:

- The clean-ending credit is given only to right answers. A format term paid on every response
  (``0.9 * accuracy + 0.1 * format``) is worth the same for every picture, so a policy trained
  from scratch learns that image-blind habit first and the accuracy signal drowns in it. Paid
  only on right answers, ending cleanly is a refinement of reading the picture, never a rival.
- Without any credit for ending, nothing teaches the policy to stop after the answer: its later
  tokens drift to whatever it sampled most (``3Find3``), and a person reading the validation
  generations cannot tell learning from noise.

The task's answers are balanced over 3, 4, 5 and 6 (see ``verl_npu.data.synthetic_geometry``),
so a policy that ignores the image is right at most 25% of the time in expectation and its best
expected score is ``0.25 * 1.0 = 0.25`` (``BLIND_BEST_SCORE``); a mean score clearly above 0.25
means the policy reads the picture.
"""

from __future__ import annotations

import re
from typing import Any

from mathruler.grader import grade_answer

from verl_npu.rewards.geo3k import boxed_answer

#: share of a right answer's score that depends on the response being clean
CLEAN_WEIGHT = 0.2
#: best expected score of a policy that ignores the image: right 1 time in 4, always clean
BLIND_BEST_SCORE = 0.25
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
CLEAN = re.compile(r"\s*(?:-?\d+(?:\.\d+)?|\\boxed\{\s*-?\d+(?:\.\d+)?\s*\})\s*")


def answer_or_first_number(marked: str | None, response: str, number: re.Pattern = NUMBER) -> str | None:
    """``marked`` (the answer the task's marker holds) if there is one, else the first match of ``number``
    in ``response``, else None. Both demo rewards read answers this way: a random-init policy rarely writes
    the marker, and a bare number must count for it to get any signal."""
    if marked is not None:
        return marked
    m = number.search(response)
    return m.group(0) if m else None


def extract_answer(response: str) -> str | None:
    """The last boxed answer if there is one, else the first number in the response, else None."""
    return answer_or_first_number(boxed_answer(response), response)


def clean_reward(response: str) -> float:
    """1.0 if the whole response (white space aside) is a number or ``\\boxed{number}``, else 0.0."""
    return 1.0 if CLEAN.fullmatch(response) else 0.0


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    """``{"score": accuracy * (0.8 + 0.2 * clean), "accuracy", "clean"}``."""
    answer = extract_answer(solution_str)
    acc = 1.0 if answer is not None and grade_answer(answer, str(ground_truth)) else 0.0
    clean = clean_reward(solution_str)
    return {"score": acc * ((1 - CLEAN_WEIGHT) + CLEAN_WEIGHT * clean), "accuracy": acc, "clean": clean}
