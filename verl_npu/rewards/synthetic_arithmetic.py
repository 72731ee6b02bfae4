"""Reward of the synthetic arithmetic task: ``score = accuracy * (0.8 + 0.2 * clean)``.

- answer: the number after the last ``####`` if the response has one, else the first number in
  the response;
- accuracy = 1 if that answer equals the ground truth (as decimals: ``7``, ``7.0`` and ``07``
  match ``7``);
- clean = 1 if the response is nothing but the answer: after stripping white space it is a bare
  number (``4``) or GSM8K's ``#### 4``. The response is decoded without special tokens, so ``4``
  followed by the end-of-turn token is clean, and ``44`` or ``4 +`` (the answer, then whatever came
  next until the token budget ran out) is not. ``format`` (logged, not scored) says whether the
  response has GSM8K's ``#### <number>``.

Possible scores: 0 (wrong or no answer), 0.8 (right answer with trailing text), 1.0 (right and
clean). The shape is the picture demo's (``verl_npu.rewards.synthetic_geometry``, docs/demo.md):

- Credit for form is paid only on right answers. A format term paid on every response (the old
  ``0.9 * accuracy + 0.1 * format``) is worth the same for every question, so a policy trained from
  scratch learns that question-blind habit first and the accuracy signal drowns in it.
- Without credit for ending, nothing teaches the policy to stop after the answer: it used the whole
  token budget on 99% of its responses and its later tokens drifted (validation answers ``444``).

How a random-init model gets a signal: a bare number counts as an answer, and single-digit answers
are single tokens of the tiny tokenizer, so a random policy hits the right one now and then and
GRPO has a difference between samples to reinforce.

What the numbers mean: the number in the question (1..5) is balanced, and so are the answers
(2..6, ``verl_npu.data.synthetic_arithmetic``). A policy that ignores the question answers one
fixed value, right at most 1/5 of the time: its best expected score is ``1.0 / 5 = 0.2``
(``BLIND_BEST_SCORE``). A mean score clearly above 0.2 means the policy reads the question.
"""

from __future__ import annotations

import re
from typing import Any

from verl_npu.rewards.gsm8k import numbers_match
from verl_npu.rewards.synthetic_geometry import answer_or_first_number

#: share of a right answer's score that depends on the response being clean
CLEAN_WEIGHT = 0.2
MAX_NUMBER = 5  # verl_npu.data.synthetic_arithmetic.MAX_NUMBER (not imported: rewards stay light to import)
BLIND_BEST_SCORE = 1.0 / MAX_NUMBER  # 0.2: right 1 time in 5, always clean
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
STRICT = re.compile(r"####\s*(-?\d[\d,]*(?:\.\d+)?)")
CLEAN = re.compile(r"\s*(?:####\s*)?-?\d[\d,]*(?:\.\d+)?\s*")


def strict_answer(response: str) -> str | None:
    """The number right after the last ``####`` (spaces allowed between), or None."""
    found = STRICT.findall(response)
    return found[-1] if found else None


def extract_answer(response: str) -> str | None:
    """The number after the last ``####`` if there is one, else the first number, else None."""
    return answer_or_first_number(strict_answer(response), response, NUMBER)


def format_reward(response: str) -> float:
    """1.0 if the response has ``#### <number>``."""
    return 1.0 if strict_answer(response) is not None else 0.0


def clean_reward(response: str) -> float:
    """1.0 if the whole response (white space aside) is a number or ``#### number``, else 0.0."""
    return 1.0 if CLEAN.fullmatch(response) else 0.0


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    """``{"score": accuracy * (0.8 + 0.2 * clean), "accuracy", "clean", "format"}``."""
    acc = 1.0 if numbers_match(extract_answer(solution_str), ground_truth) else 0.0
    clean = clean_reward(solution_str)
    return {
        "score": acc * ((1 - CLEAN_WEIGHT) + CLEAN_WEIGHT * clean),
        "accuracy": acc,
        "clean": clean,
        "format": format_reward(solution_str),
    }
