"""Search-R1's exact-match reward (verl's `search_r1_like_qa_em`, for the `searchR1_*` data sources).

The answer is the text inside the response's last `<answer>...</answer>`. It scores 1.0 when, normalised,
it equals one of the targets normalised (lower case, punctuation and the articles a / an / the removed,
whitespace collapsed), a quarter of that when the response writes more than 10 `<answer>` or `</answer>`
tags (a guard against spraying answers), and 0.0 otherwise, with no answer tag at all too.

`ground_truth` is the row's `reward_model.ground_truth` as the parquet stores it: verl's `{"target":
[answers]}`, that mapping as text (data that stores it as a string; earlier verl-npu versions also handed a
non-text ground truth to the reward as its text), a list of answers or one answer.
"""

from __future__ import annotations

import ast
import json
import re
import string
from typing import Any

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCTUATION = set(string.punctuation)
#: more answer tags than this and a right answer scores a quarter (verl's guard)
MAX_TAGS = 10
#: verl's Search-R1 data sources (examples/data_preprocess/preprocess_search_r1_dataset.py prefixes
#: `searchR1_`), and the synthetic set of data_prep/search_r1.py
DATA_SOURCES = (
    "searchR1_nq",
    "searchR1_triviaqa",
    "searchR1_popqa",
    "searchR1_hotpotqa",
    "searchR1_2wikimultihopqa",
    "searchR1_musique",
    "searchR1_bamboogle",
    "searchR1_synthetic",
)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def extract_answer(solution_str: str) -> str | None:
    """The stripped text of the last <answer>...</answer>, or None."""
    found = ANSWER.findall(solution_str)
    return found[-1].strip() if found else None


def targets(ground_truth: Any) -> list[str]:
    """The answers a ground truth names (see the module docstring for the shapes read)."""
    if isinstance(ground_truth, str):
        text = ground_truth.strip()
        if text[:1] in "{[":
            for parse in (json.loads, ast.literal_eval):
                try:
                    return targets(parse(text))
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    continue
        return [ground_truth]
    if isinstance(ground_truth, dict):
        return targets(ground_truth.get("target", []))
    if hasattr(ground_truth, "tolist"):  # a numpy array (a parquet list column read by pandas)
        ground_truth = ground_truth.tolist()
    if isinstance(ground_truth, (list, tuple)):
        return [str(t) for t in ground_truth]
    return [] if ground_truth is None else [str(ground_truth)]


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    score: float = 1.0,
    format_score: float = 0.0,
) -> float:
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    normalized = normalize_answer(answer)
    if not any(normalize_answer(t) == normalized for t in targets(ground_truth)):
        return float(format_score)
    tags = max(solution_str.count("<answer>"), solution_str.count("</answer>"))
    return float(score / 4 if tags > MAX_TAGS else score)
