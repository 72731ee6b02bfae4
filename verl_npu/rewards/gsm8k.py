"""GSM8K reward: is the response's final number the ground truth?

Two readings of the response (only its last 300 characters, where the answer is; this also
bounds the regex work on long responses):

- strict: the number after the last ``#### `` (``#### 1,234`` -> ``1234``);
- flexible: the last number anywhere in that tail.

A number matches the ground truth when both parse to the same decimal value after removing
thousands commas, ``$`` and a trailing ``.`` (``72``, ``72.0`` and ``$72`` all match ``72``).

``compute_score`` returns ``{"score", "strict_accuracy", "flexible_accuracy"}``: ``score`` is
the strict accuracy unless ``method="flexible"``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

TAIL_CHARS = 300
STRICT_PATTERN = re.compile(r"#### *(-?[0-9.,$]+)")
NUMBER_PATTERN = re.compile(r"-?\$?[0-9][0-9,]*(?:\.[0-9]+)?")


def _to_decimal(text: str) -> Decimal | None:
    cleaned = text.replace(",", "").replace("$", "").rstrip(".")
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        return None


def strict_answer(response: str) -> str | None:
    """The number after the last ``####`` in the response's tail, or None."""
    found = STRICT_PATTERN.findall(response[-TAIL_CHARS:])
    return found[-1] if found else None


def flexible_answer(response: str) -> str | None:
    """The last number in the response's tail, or None."""
    found = NUMBER_PATTERN.findall(response[-TAIL_CHARS:])
    return found[-1] if found else None


def numbers_match(answer: str | None, ground_truth: Any) -> bool:
    """True when both parse to the same decimal value (commas, ``$`` and a trailing ``.`` ignored); a ground
    truth the parquet stores as a number is read as its text."""
    if answer is None:
        return False
    a, b = _to_decimal(answer), _to_decimal(str(ground_truth))
    return a is not None and b is not None and a == b


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, method: str = "strict"
) -> dict:
    """``{"score", "strict_accuracy", "flexible_accuracy"}`` (1.0 / 0.0 each); ``score`` follows ``method``."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    strict = 1.0 if numbers_match(strict_answer(solution_str), ground_truth) else 0.0
    flexible = 1.0 if numbers_match(flexible_answer(solution_str), ground_truth) else 0.0
    return {
        "score": strict if method == "strict" else flexible,
        "strict_accuracy": strict,
        "flexible_accuracy": flexible,
    }
