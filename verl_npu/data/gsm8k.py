"""GSM8K -> RL parquet files (``train.parquet``, ``test.parquet``), text only.

Source format (Hugging Face ``openai/gsm8k``, config ``main``): columns ``question`` and
``answer``, where ``answer`` is a worked solution ending in ``#### <number>``.

``--synthetic N`` writes offline word problems in the same source format instead
(``verl_npu.data.synthetic_arithmetic``: a count of 1-5 things grows by one), converted
by the same code with data_source ``synthetic_arithmetic`` and a shorter instruction.

Each output row (verl's RL schema without ``images``, see docs/data_formats.md)::

    data_source   "openai/gsm8k" (or "synthetic_arithmetic" with --synthetic)
    prompt        [{"role": "user", "content": question + " " + INSTRUCTION}]
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": <the number after ####, commas removed>}
    extra_info    {"split", "index" (source row), "answer" (full solution), "question"}
"""

from __future__ import annotations

import argparse
import os

from verl_npu.data import synthetic_arithmetic
from verl_npu.data.prep import BadRow, convert_splits, prep_main, prep_parser, source_splits, synthetic_splits

HUB_ID = "openai/gsm8k"
HUB_CONFIG = "main"
SPLITS = ("train", "test")
SOURCE_COLUMNS = ("question", "answer")
INSTRUCTION = 'Work through it step by step, then write the final numeric answer after "####".'
# The synthetic task is for tiny models trained from scratch on a CPU: every prompt token costs compute
# on every step, so its instruction is short (its reward also accepts a bare number, see
# verl_npu.rewards.synthetic_arithmetic).
SYNTHETIC_INSTRUCTION = 'Write the answer after "####".'


def final_answer(solution: str) -> str:
    """The number after the last ``####`` of a GSM8K solution, with thousands commas removed.

    Raises:
        BadRow: the solution has no ``####`` or nothing after it.
    """
    if "####" not in solution:
        raise BadRow("'answer' has no '####' followed by the final number")
    answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not answer:
        raise BadRow("'answer' has nothing after '####'")
    return answer


def gsm8k_row(row: dict, split: str, index: int, data_source: str = HUB_ID, instruction: str = INSTRUCTION) -> dict:
    """One source row (``question``, ``answer``) as an RL row (schema in the module doc).

    Raises:
        BadRow: the question is empty or the answer has no final ``#### n``.
    """
    question, solution = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise BadRow(f"'question' is empty or not a string ({question!r})")
    if not isinstance(solution, str):
        raise BadRow(f"'answer' is not a string ({solution!r})")
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question + " " + instruction}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": final_answer(solution)},
        "extra_info": {"split": split, "index": index, "answer": solution, "question": question},
    }


def prepare(
    save_dir: str | os.PathLike,
    local_dataset_path: str | None = None,
    skip_bad_rows: bool = False,
    progress: bool = True,
    to_row=None,
    schema=None,
) -> dict:
    """Convert GSM8K (local copy, else the hub) to ``<save_dir>/{train,test}.parquet`` (rows made by ``to_row``,
    default ``gsm8k_row``, written with ``schema``, default the RL schema: the multi-turn variant passes both).

    Returns ``{"train": path, "test": path, "paths": {split: path}, "rows": {split: n}, "images": {split: 0},
    "skipped": {split: n}}``.
    """
    splits = source_splits(local_dataset_path, SOURCE_COLUMNS, SPLITS, HUB_ID, HUB_CONFIG)
    result = convert_splits(
        splits,
        to_row or gsm8k_row,
        save_dir,
        with_images=False,
        skip_bad_rows=skip_bad_rows,
        progress=progress,
        schema=schema,
    )
    return result.as_dict()


def prepare_synthetic(
    save_dir: str | os.PathLike,
    n_train: int,
    n_test: int,
    seed: int = 0,
    progress: bool = False,
    max_number: int = synthetic_arithmetic.MAX_NUMBER,
    to_row=None,
    schema=None,
) -> dict:
    """Write the synthetic arithmetic task to ``<save_dir>/{train,test}.parquet`` (data_source
    ``synthetic_arithmetic``), through the same conversion as GSM8K.

    Returns the same dict as ``prepare`` (``"images"`` are 0).
    """
    result = convert_splits(
        synthetic_splits(
            n_train, n_test, lambda n, split: synthetic_arithmetic.generate_rows(n, seed, split, max_number)
        ),
        lambda row, split, i: (to_row or gsm8k_row)(
            row, split, i, synthetic_arithmetic.DATA_SOURCE, SYNTHETIC_INSTRUCTION
        ),
        save_dir,
        with_images=False,
        progress=progress,
        schema=schema,
    )
    return result.as_dict()


def build_parser() -> argparse.ArgumentParser:
    return prep_parser(
        "data_prep/gsm8k.py",
        "GSM8K (or a synthetic arithmetic task)",
        default_dir="~/data/gsm8k",
        dataset_help="a local copy of openai/gsm8k (main): a folder of parquet files or a save_to_disk folder",
        synthetic_help="write N synthetic train rows (one-step word problems: a count of 1-5 things grows by "
        "one; no network) instead of GSM8K",
    )


def main(
    argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None, to_row=None, schema=None
) -> None:
    """CLI entry point of ``data_prep/gsm8k.py`` (and, with its parser, row function and schema, of
    ``data_prep/gsm8k_multiturn_w_tool.py``)."""
    args = (parser or build_parser()).parse_args(argv)
    prep_main(
        args,
        synthetic_rows=f"synthetic arithmetic rows (seed {args.seed})",
        synthetic=lambda n_test: prepare_synthetic(
            args.local_save_dir, args.synthetic, n_test, args.seed, progress=True, to_row=to_row, schema=schema
        ),
        hub=f"{HUB_ID} ({HUB_CONFIG})",
        prepare_rows=lambda: prepare(
            args.local_save_dir, args.local_dataset_path, args.skip_bad_rows, to_row=to_row, schema=schema
        ),
    )
