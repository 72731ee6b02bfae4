"""Which data_prep command turns another system's dataset into verl parquet, and the parquet path the
recipe names for it.

verl (and verl-npu) train from parquet rows with a `prompt` column holding a chat-message list and
`reward_model.ground_truth` (docs/data_formats.md). Trinity-RFT tasksets name a folder / hub dataset
with a split and per-taskset column names; ROLL names JSON / JSONL files with a `prompt` or `messages`
column. `data_prep/foreign_json.py` (verl_npu/data/foreign_json.py) converts both.
"""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath

PREP = "python data_prep/foreign_json.py"


def _q(text: str) -> str:
    return shlex.quote(str(text))


def trinity_parquet(path: str, split: str | None, subset: str | None = None) -> str:
    """The parquet file the recipe names for a Trinity taskset: `<path>[/<subset>]/<split>.parquet`
    (the verl command in Trinity's own guide names `$HOME/data/gsm8k/train.parquet` for the taskset
    `path: $HOME/data/gsm8k, split: train`)."""
    base = PurePosixPath(str(path))
    if base.suffix in (".parquet",):
        return str(base)
    if base.suffix in (".json", ".jsonl"):
        return str(base.with_suffix(".parquet"))
    if subset:
        base = base / str(subset)
    return str(base / f"{split or 'train'}.parquet")


def trinity_prep(
    path: str,
    split: str | None,
    subset: str | None,
    prompt_key: str | None,
    response_key: str | None,
    system_prompt: str | None,
    out: str,
    name: str | None = None,
) -> str:
    """The command that writes `out` from a Trinity taskset (a JSON/JSONL file, a folder of them, or a
    local Hugging Face `datasets` folder with that split)."""
    cmd = [PREP, "trinity", "--input", _q(path), "--split", _q(split or "train")]
    if subset:
        cmd += ["--subset", _q(subset)]
    if prompt_key:
        cmd += ["--prompt-key", _q(prompt_key)]
    if response_key:
        cmd += ["--response-key", _q(response_key)]
    if system_prompt:
        cmd += ["--system-prompt", _q(system_prompt)]
    if name:
        cmd += ["--data-source", _q(name)]
    return " ".join(cmd + ["--output", _q(out)])


def roll_parquet(file_name: str) -> str:
    """The parquet file the recipe names for a ROLL data file (`x.jsonl` -> `x.parquet`)."""
    p = PurePosixPath(str(file_name))
    return str(p.with_suffix(".parquet")) if p.suffix in (".json", ".jsonl", ".csv") else str(p)


def roll_prep(file_name: str, prompt_key: str | None, messages_key: str | None, out: str) -> str:
    cmd = [PREP, "roll", "--input", _q(file_name)]
    if messages_key:
        cmd += ["--messages-key", _q(messages_key)]
    elif prompt_key:
        cmd += ["--prompt-key", _q(prompt_key)]
    return " ".join(cmd + ["--output", _q(out)])


def sft_prep(system: str, path: str, split: str | None, subset: str | None, messages_key: str | None, out: str) -> str:
    """The command that writes the SFT parquet `out` (verl's `messages` rows) from a Trinity experience buffer
    or a ROLL SFT data file of conversations."""
    flags = {"--split": split, "--subset": subset, "--messages-key": messages_key}
    cmd = [PREP, system, "--sft", "--input", _q(path), *(f"{k} {_q(v)}" for k, v in flags.items() if v)]
    return " ".join(cmd + ["--output", _q(out)])
