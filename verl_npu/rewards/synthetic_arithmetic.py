"""Reward of the synthetic arithmetic task: ``score = 0.9 * accuracy + 0.1 * format``.

- answer: the number after the last ``####`` if the response has one, else the first number in
  the response;
- accuracy = 1 if that answer equals the ground truth (as decimals: ``7``, ``7.0`` and ``07``
  match ``7``);
- format = 1 if the response has ``#### <number>`` (the format GSM8K asks for).

How a random-init model gets partial credit: a bare number counts as an answer, so a policy that
has not learned the ``####`` format yet (four ``#`` tokens before the number: out of reach by
chance) still earns 0.9 whenever the first number it writes is right. Single-digit answers
are single tokens of the tiny tokenizer, so a random policy hits the right one now and then and
GRPO has a difference between samples to reinforce; ``#### n`` adds the last 0.1. A bare number
earns no format credit: rewarding "write any digit" would teach a habit that is the same for
every question and drowns out the accuracy signal (the lesson of the polygon task,
``verl_npu.rewards.synthetic_geometry``).

What the numbers mean: the number in the question (1..5) is balanced, and so are the answers
(2..6, ``verl_npu.data.synthetic_arithmetic``). A policy that ignores the question answers one
fixed value, right at most 1/5 of the time: its best expected score is ``0.9 / 5 + 0.1 = 0.28``
(``BLIND_BEST_SCORE``). A mean score clearly above 0.28 means the policy reads the question.
"""

from __future__ import annotations

import re

from verl_npu.rewards.gsm8k import numbers_match

FORMAT_WEIGHT = 0.1
MAX_NUMBER = 5  # verl_npu.data.synthetic_arithmetic.MAX_NUMBER (not imported: rewards stay light to import)
BLIND_BEST_SCORE = (1 - FORMAT_WEIGHT) / MAX_NUMBER + FORMAT_WEIGHT  # 0.28
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
STRICT = re.compile(r"####\s*(-?\d[\d,]*(?:\.\d+)?)")


def strict_answer(response: str) -> str | None:
    """The number right after the last ``####`` (spaces allowed between), or None."""
    found = STRICT.findall(response)
    return found[-1] if found else None


def extract_answer(response: str) -> str | None:
    """The number after the last ``####`` if there is one, else the first number, else None."""
    strict = strict_answer(response)
    if strict is not None:
        return strict
    m = NUMBER.search(response)
    return m.group(0) if m else None


def format_reward(response: str) -> float:
    """1.0 if the response has ``#### <number>``."""
    return 1.0 if strict_answer(response) is not None else 0.0


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> dict:
    """``{"score": 0.9 * accuracy + 0.1 * format, "accuracy", "format"}``."""
    acc = 1.0 if numbers_match(extract_answer(solution_str), ground_truth) else 0.0
    fmt = format_reward(solution_str)
    return {"score": (1 - FORMAT_WEIGHT) * acc + FORMAT_WEIGHT * fmt, "accuracy": acc, "format": fmt}
