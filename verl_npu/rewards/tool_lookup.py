"""Reward of the tool demo's lookup task (`verl_npu.data.tool_lookup`): 1.0 when the answer written as
``#### <code>`` (the last one in the conversation) is the problem's code, else 0.0.

Nothing is paid or taken for calling the tool: the score is the answer's alone. The code exists only
behind the tool (drawn per problem, 0..9), so a policy that does not call it is right 1 time in 10
(``BLIND_BEST_SCORE``); a policy that calls it and copies the reply is always right.
"""

from __future__ import annotations

import re
from typing import Any

STRICT = re.compile(r"####\s*(\d+)")
N_CODES = 10  # verl_npu.data.tool_lookup.CODES (not imported: rewards stay light to import)
BLIND_BEST_SCORE = 1.0 / N_CODES


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    """``{"score": accuracy, "accuracy", "format"}``: accuracy 1.0 when the last ``#### n`` is the code."""
    found = STRICT.findall(solution_str)
    right = bool(found) and found[-1] == str(ground_truth).strip()
    return {"score": float(right), "accuracy": float(right), "format": float(bool(found))}
