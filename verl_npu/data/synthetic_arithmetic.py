"""A synthetic arithmetic task in the GSM8K source format, made offline.

Each row is ``{"question": str, "answer": str}`` like ``openai/gsm8k``: a one-step word problem
in which a count of things goes up or down by one, and a worked solution whose last line is
``#### <number>``::

    question  "Tom has 3 apples and gets one more. How many apples does Tom have now?"
    answer    "3 + 1 = 4\\n#### 4"

so the GSM8K conversion (``verl_npu.data.gsm8k.gsm8k_row``) turns it into RL rows unchanged.

Why so easy: the CPU text demo (``recipes/tiny_gsm8k.yaml``) trains a random-init 0.4 M-parameter
model with RL for a few minutes. Every number is a single digit (one token of the tiny tokenizer)
and the question holds exactly one of them (the change is the word "one"), so the answer is a
transformation of one prompt token: the digit plus or minus one, depending on the words
("gets one more", "puts in one more" / "gives one away", "takes one of them"). A random policy
writes the right digit now and then, so the reward has something to reinforce from the first
step; the model has to learn to find the digit and to read the direction.

Balance: the number in the question (1..``max_number``) and the direction are balanced and
independent (each of the ``2 * max_number`` pairs occurs ``n // (2 * max_number)`` times, the
remainder spread over the first ones, shuffled), so answers run from 0 to ``max_number + 1``. A
policy that ignores the question is right at most ``1 / max_number`` of the time, one that reads
the number but not the direction half the time (see ``verl_npu.rewards.synthetic_arithmetic``).
"""

from __future__ import annotations

import numpy as np

DATA_SOURCE = "synthetic_arithmetic"
MAX_NUMBER = 5  # the numbers in the questions are 1..5, the answers 0..6

NAMES: tuple[str, ...] = ("Tom", "Ann", "Sam", "Mia", "Ben", "Eva")
ITEMS: tuple[str, ...] = ("apples", "pens", "cards", "books", "coins", "eggs")

# question templates by operation: the answer is a + 1 or a - 1
TEMPLATES: dict[str, tuple[str, ...]] = {
    "+": ("{name} has {a} {item} and gets one more. How many {item} does {name} have now?",
          "There are {a} {item} in a box. {name} puts in one more. How many {item} are in the box?"),
    "-": ("{name} has {a} {item} and gives one away. How many {item} does {name} have left?",
          "There are {a} {item} on the table. {name} takes one of them. How many {item} are left?"),
}


def make_problem(a: int, op: str, rng: np.random.Generator) -> dict:
    """One source row: ``a`` things, one more (``op`` "+") or one less ("-"); names, items and the
    phrasing drawn from ``rng``."""
    if op not in TEMPLATES or not 1 <= a <= 8:
        raise ValueError(f"need op '+' or '-' and a in 1..8, got {op!r}, {a}")
    answer = a + 1 if op == "+" else a - 1
    templates = TEMPLATES[op]
    question = templates[int(rng.integers(len(templates)))].format(
        name=NAMES[int(rng.integers(len(NAMES)))], item=ITEMS[int(rng.integers(len(ITEMS)))], a=a)
    return {"question": question, "answer": f"{a} {op} 1 = {answer}\n#### {answer}"}


def generate_rows(n: int, seed: int, split: str = "train", max_number: int = MAX_NUMBER) -> list[dict]:
    """``n`` source rows (``question``, ``answer``), a pure function of its arguments.

    The (number, direction) pairs are balanced and shuffled; the random stream is seeded with
    ``(seed, split)`` so train and test rows of the same seed differ.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 2 <= max_number <= 8:
        raise ValueError(f"max_number must be in 2..8 (single-digit answers), got {max_number}")
    split_code = sum(ord(c) for c in split)  # stable across processes, unlike hash()
    rng = np.random.default_rng([seed, split_code, 8])
    pairs = [(a, op) for a in range(1, max_number + 1) for op in ("+", "-")]
    chosen = [pairs[i % len(pairs)] for i in range(n)]
    return [make_problem(*chosen[i], rng) for i in rng.permutation(n)]
