"""A synthetic arithmetic task in the GSM8K source format, made offline.

Each row is ``{"question": str, "answer": str}`` like ``openai/gsm8k``: a one-step word problem
in which a count of things grows by one, and a worked solution whose last line is ``#### <number>``::

    question  "Tom has 3 apples and gets one more. How many apples does Tom have now?"
    answer    "3 + 1 = 4\n#### 4"

so the GSM8K conversion (``verl_npu.data.gsm8k.gsm8k_row``) turns it into RL rows unchanged.

Why so easy: the CPU text demo (``recipes/tiny_gsm8k.yaml``) trains a random-init 0.4 M-parameter
model with RL for a few minutes. Every number is a single digit (one token of the tiny tokenizer)
and the question holds exactly one of them (the change is the word "one"), so the answer is a
fixed transformation of one prompt token: the digit plus one. A random policy writes the right
digit now and then, so the reward has something to reinforce from the first step; the model has
to learn to find the number in the question and to count one on.

A harder variant, where the count could also go down by one ("gives one away"), was tried: in the
demo's 300 steps the model learned to read the number but not the direction (greedy validation
accuracy 0.5, what ignoring the direction gives), so the task keeps one operation.

Balance: the number in the question (1..``max_number``) is balanced (each ``n // max_number``
times per split, the remainder spread over the first ones, shuffled), and so are the answers
(2..``max_number + 1``). A policy that ignores the question is right at most
``1 / max_number`` of the time (see ``verl_npu.rewards.synthetic_arithmetic``).
"""

from __future__ import annotations

import numpy as np

DATA_SOURCE = "synthetic_arithmetic"
MAX_NUMBER = 5  # the numbers in the questions are 1..5, the answers 2..6

NAMES: tuple[str, ...] = ("Tom", "Ann", "Sam", "Mia", "Ben", "Eva")
ITEMS: tuple[str, ...] = ("apples", "pens", "cards", "books", "coins", "eggs")
TEMPLATES: tuple[str, ...] = (
    "{name} has {a} {item} and gets one more. How many {item} does {name} have now?",
    "There are {a} {item} in a box. {name} puts in one more. How many {item} are in the box?",
)


def make_problem(a: int, rng: np.random.Generator) -> dict:
    """One source row: ``a`` things (1..8) and one more; the name, the things and the phrasing
    drawn from ``rng``."""
    if not 1 <= a <= 8:
        raise ValueError(f"a must be in 1..8 (single-digit answers), got {a}")
    question = TEMPLATES[int(rng.integers(len(TEMPLATES)))].format(
        name=NAMES[int(rng.integers(len(NAMES)))], item=ITEMS[int(rng.integers(len(ITEMS)))], a=a
    )
    return {"question": question, "answer": f"{a} + 1 = {a + 1}\n#### {a + 1}"}


def generate_rows(n: int, seed: int, split: str = "train", max_number: int = MAX_NUMBER) -> list[dict]:
    """``n`` source rows (``question``, ``answer``), a pure function of its arguments.

    The numbers 1..``max_number`` are balanced and shuffled; the random stream is seeded with
    ``(seed, split)`` so train and test rows of the same seed differ.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 2 <= max_number <= 8:
        raise ValueError(f"max_number must be in 2..8 (single-digit answers), got {max_number}")
    split_code = sum(ord(c) for c in split)  # stable across processes, unlike hash()
    rng = np.random.default_rng([seed, split_code, 8])
    numbers = [1 + i % max_number for i in range(n)]
    return [make_problem(numbers[i], rng) for i in rng.permutation(n)]
