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
import sys

from verl_npu.data import synthetic_arithmetic
from verl_npu.data.geometry3k import (
    BadRow,
    convert_splits,
    dry_run_plan,
    hub_splits,
    local_splits,
    memory_splits,
    run_cli,
)
from verl_npu.errors import UserError

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
    result = convert_splits(splits, to_row or gsm8k_row, save_dir, with_images=False, skip_bad_rows=skip_bad_rows,
                            progress=progress, schema=schema)
    return result.as_dict()


def prepare_synthetic(
    save_dir: str | os.PathLike, n_train: int, n_test: int, seed: int = 0, progress: bool = False,
    max_number: int = synthetic_arithmetic.MAX_NUMBER, to_row=None, schema=None,
) -> dict:
    """Write the synthetic arithmetic task to ``<save_dir>/{train,test}.parquet`` (data_source
    ``synthetic_arithmetic``), through the same conversion as GSM8K.

    Returns the same dict as ``prepare`` (``"images"`` are 0).
    """
    if n_train < 1 or n_test < 1:
        raise UserError(f"--synthetic needs at least 1 train and 1 test row (got train={n_train}, test={n_test})")
    rows = {
        "train": synthetic_arithmetic.generate_rows(n_train, seed, "train", max_number),
        "test": synthetic_arithmetic.generate_rows(n_test, seed, "test", max_number),
    }
    result = convert_splits(
        memory_splits(rows, "synthetic"),
        lambda row, split, i: (to_row or gsm8k_row)(row, split, i, synthetic_arithmetic.DATA_SOURCE,
                                                    SYNTHETIC_INSTRUCTION),
        save_dir,
        with_images=False,
        progress=progress,
        schema=schema,
    )
    return result.as_dict()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="data_prep/gsm8k.py",
        description="Write GSM8K (or a synthetic arithmetic task) as RL parquet files: train.parquet, test.parquet. "
                    "verl's underscore spellings of the options are accepted too (--local_save_dir, "
                    "--local_dir, --local_dataset_path).")
    p.add_argument("--local-save-dir", "--local_save_dir", "--local_dir", dest="local_save_dir",
                   default="~/data/gsm8k", help="output folder (default: ~/data/gsm8k)")
    p.add_argument("--local-dataset-path", "--local_dataset_path", dest="local_dataset_path", default=None,
                   help="a local copy of openai/gsm8k (main): a folder of parquet files or a save_to_disk folder")
    p.add_argument("--synthetic", type=int, default=None, metavar="N",
                   help="write N synthetic train rows (one-step word problems: a count of 1-5 things grows by "
                        "one; no network) instead of GSM8K")
    p.add_argument("--synthetic-test", "--synthetic_test", dest="synthetic_test", type=int, default=None,
                   metavar="N", help="synthetic test rows (default: N // 4, at least 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic generator (default 0)")
    p.add_argument("--skip-bad-rows", "--skip_bad_rows", dest="skip_bad_rows", action="store_true",
                   help="skip (and count) rows that cannot be converted instead of stopping at the first")
    p.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                   help="check the options and say what would be read and written, without reading or writing")
    p.add_argument("--overwrite", action="store_true",
                   help="replace train.parquet / test.parquet if they exist (without it an existing file stops the run)")
    return p


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None, to_row=None,
         schema=None) -> None:
    """CLI entry point of ``data_prep/gsm8k.py`` (and, with its parser and row function, of
    ``data_prep/gsm8k_multiturn_w_tool.py``)."""
    args = (parser or build_parser()).parse_args(argv)
    if args.synthetic is not None:
        if args.local_dataset_path:
            print("error: --synthetic and --local-dataset-path exclude each other; pass one", file=sys.stderr)
            raise SystemExit(1)
        n_test = args.synthetic_test if args.synthetic_test is not None else max(1, args.synthetic // 4)
        if args.dry_run:
            print(dry_run_plan(f"generate {args.synthetic} train / {n_test} test synthetic arithmetic rows "
                               f"(seed {args.seed})", args.local_save_dir))
            return
        run_cli(lambda: prepare_synthetic(args.local_save_dir, args.synthetic, n_test, args.seed, progress=True,
                                          to_row=to_row, schema=schema),
                args.local_save_dir, args.overwrite)
    elif args.dry_run:
        source = (f"convert the local copy {args.local_dataset_path}" if args.local_dataset_path
                  else f"download {HUB_ID} ({HUB_CONFIG}) from the Hugging Face hub "
                       "(needs the network and the 'datasets' package)")
        print(dry_run_plan(source, args.local_save_dir))
    else:
        run_cli(lambda: prepare(args.local_save_dir, args.local_dataset_path, args.skip_bad_rows, to_row=to_row,
                        schema=schema),
                args.local_save_dir, args.overwrite)
