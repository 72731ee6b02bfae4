"""GSM8K -> RL parquet files (``train.parquet``, ``test.parquet``), text only.

Source format (Hugging Face ``openai/gsm8k``, config ``main``): columns ``question`` and
``answer``, where ``answer`` is a worked solution ending in ``#### <number>``.

Each output row (verl's RL schema without ``images``, see docs/data_formats.md)::

    data_source   "openai/gsm8k"
    prompt        [{"role": "user", "content": question + " " + INSTRUCTION}]
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": <the number after ####, commas removed>}
    extra_info    {"split", "index" (source row), "answer" (full solution), "question"}
"""

from __future__ import annotations

import argparse
import os

from verl_npu.data.geometry3k import (
    BadRow,
    convert_splits,
    hub_splits,
    local_splits,
    run_cli,
)
from verl_npu.errors import UserError

HUB_ID = "openai/gsm8k"
HUB_CONFIG = "main"
SPLITS = ("train", "test")
SOURCE_COLUMNS = ("question", "answer")
INSTRUCTION = 'Work through it step by step, then write the final numeric answer after "####".'


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


def gsm8k_row(row: dict, split: str, index: int) -> dict:
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
        "data_source": HUB_ID,
        "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": final_answer(solution)},
        "extra_info": {"split": split, "index": index, "answer": solution, "question": question},
    }


def prepare(
    save_dir: str | os.PathLike,
    local_dataset_path: str | None = None,
    skip_bad_rows: bool = False,
    progress: bool = True,
) -> dict:
    """Convert GSM8K (local copy, else the hub) to ``<save_dir>/{train,test}.parquet``.

    Returns ``{"train": path, "test": path, "paths": {split: path}, "rows": {split: n}, "images": {split: 0},
    "skipped": {split: n}}``.
    """
    if local_dataset_path:
        splits = local_splits(local_dataset_path, SOURCE_COLUMNS, SPLITS)
    else:
        splits = hub_splits(HUB_ID, SPLITS, HUB_CONFIG)
        for s in splits.values():
            absent = [c for c in SOURCE_COLUMNS if c not in s.columns]
            if absent:
                raise UserError(f"{s.where}: missing column(s) {', '.join(absent)}")
    result = convert_splits(splits, gsm8k_row, save_dir, with_images=False, skip_bad_rows=skip_bad_rows,
                            progress=progress)
    return result.as_dict()


def main(argv: list[str] | None = None) -> None:
    """CLI entry point of ``data_prep/gsm8k.py``."""
    p = argparse.ArgumentParser(prog="data_prep/gsm8k.py",
                                description="Write GSM8K as RL parquet files: train.parquet, test.parquet.")
    p.add_argument("--local-save-dir", default="~/data/gsm8k", help="output folder (default: ~/data/gsm8k)")
    p.add_argument("--local-dataset-path", default=None,
                   help="a local copy of openai/gsm8k (main): a folder of parquet files or a save_to_disk folder")
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="skip (and count) rows that cannot be converted instead of stopping at the first")
    args = p.parse_args(argv)
    run_cli(lambda: prepare(args.local_save_dir, args.local_dataset_path, args.skip_bad_rows))
