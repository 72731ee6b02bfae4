"""The tool demo's task (recipes/tiny_tool_demo.yaml): a lookup only the tool can answer, for SFT and for
multi-turn RL, made offline.

Each problem names a key, one capital letter (`what is the code of K?`); its answer is a code, one digit
(0..9), drawn for that problem alone, so no model can know or learn it: the only way to it is the `lookup`
tool (`verl_npu.tools.lookup`), which answers the problem's own code. A guess is right 1 time
in 10.

RL rows (verl's multi-turn format, `data_source` "tool_lookup", rewarded by `verl_npu.rewards.tool_lookup`):

    prompt        [{"role": "user", "content": "what is the code of K?"}]
    reward_model  {"style": "rule", "ground_truth": "<code>"}
    extra_info    split, index, answer, question, need_tools_kwargs: true,
                  tools_kwargs: {"lookup": {"create_kwargs": {"key": "K", "value": "<code>"}}}
    agent_name    "tool_agent"

SFT rows (verl's multi-turn SFT format: `messages`, `tools` the tool schema as JSON text): a share `call_share`
(default CALL_SHARE) of the transcripts call the tool and answer with what it says,

    user: what is the code of K?   assistant: <tool_call>{"name": "lookup", "arguments": {}}</tool_call>
    tool: <code>                    assistant: #### <code>

and the rest answer at once with one fixed guess, `#### 0` (GUESS), as a transcript set collected from a model
that uses its tool only sometimes would. The guess is fixed, not drawn, because a drawn guess is noise the SFT
loss can never fit, and that noise on the answer's digit keeps the copy from the tool's reply from being learned;
a fixed guess is right 1 time in 10 all the same. SFT on them teaches the call, the copy and the guess; which
one pays is left for RL to find.
"""

from __future__ import annotations

import json
import random
import string

import pyarrow as pa

from verl_npu.data.prep import EXTRA_INFO_TYPE, rl_schema
from verl_npu.data.split_files import write_split_files
from verl_npu.tools.lookup import SCHEMA, TOOL_NAME

DATA_SOURCE = "tool_lookup"
SFT_DATA_SOURCE = "tool_lookup_sft"
AGENT_NAME = "tool_agent"
KEYS = string.ascii_uppercase
CODES = (0, 9)
#: the share of SFT transcripts that call the tool (the rest guess)
CALL_SHARE = 0.6
#: the code every guessing SFT transcript answers
GUESS = "0"


def question(key: str) -> str:
    return f"what is the code of {key}?"


def problems(n: int, seed: int, split: str) -> list[tuple[str, str]]:
    """`n` (key, code) pairs; train and test draw from different streams of `seed`."""
    rng = random.Random(f"tool_lookup/{seed}/{split}")
    return [(rng.choice(KEYS), str(rng.randint(*CODES))) for _ in range(n)]


def rl_row(key: str, code: str, split: str, index: int) -> dict:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question(key)}],
        "ability": "lookup",
        "reward_model": {"style": "rule", "ground_truth": code},
        "extra_info": {
            "split": split,
            "index": index,
            "answer": code,
            "question": question(key),
            "need_tools_kwargs": True,
            "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"key": key, "value": code}}},
        },
        "agent_name": AGENT_NAME,
    }


def rl_schema_lookup() -> pa.Schema:
    create = pa.struct([("create_kwargs", pa.struct([("key", pa.string()), ("value", pa.string())]))])
    extra = pa.struct(
        list(EXTRA_INFO_TYPE)
        + [pa.field("need_tools_kwargs", pa.bool_()), pa.field("tools_kwargs", pa.struct([(TOOL_NAME, create)]))]
    )
    fields = [pa.field("extra_info", extra) if f.name == "extra_info" else f for f in rl_schema(with_images=False)]
    return pa.schema(fields + [pa.field("agent_name", pa.string())])


def transcript(key: str, code: str, call: bool, guess: str = GUESS) -> list[dict]:
    """The SFT conversation of one problem: the call, the tool's reply and the answer, or a guessed answer."""
    user = {"role": "user", "content": question(key)}
    if not call:
        return [user, {"role": "assistant", "content": f"#### {guess}"}]
    text = json.dumps({"name": TOOL_NAME, "arguments": {}})
    return [
        user,
        {"role": "assistant", "content": f"<tool_call>\n{text}\n</tool_call>"},
        {"role": "tool", "content": code},
        {"role": "assistant", "content": f"#### {code}"},
    ]


def sft_rows(n: int, seed: int, split: str, call_share: float = CALL_SHARE) -> list[dict]:
    rng = random.Random(f"tool_lookup_sft/{seed}/{split}")
    return [
        {
            "messages": transcript(key, code, rng.random() < call_share),
            "tools": json.dumps([SCHEMA]),
            "data_source": SFT_DATA_SOURCE,
        }
        for key, code in problems(n, seed, split)
    ]


def prepare_synthetic(save_dir, n_train: int, n_test: int, seed: int = 0, progress: bool = False) -> dict:
    """RL rows: `train.parquet` / `test.parquet` under `save_dir` (the demo-data writer's contract,
    verl_npu/demo.py)."""
    splits = [
        (split, [rl_row(key, code, split, i) for i, (key, code) in enumerate(problems(n, seed, split))])
        for split, n in (("train", n_train), ("test", n_test))
    ]
    return write_split_files(save_dir, splits, rl_schema_lookup(), progress=progress)


def prepare_sft(
    save_dir, n_train: int, n_test: int, seed: int = 0, progress: bool = False, call_share: float = CALL_SHARE
) -> dict:
    """SFT transcripts: `train.parquet` / `test.parquet` under `save_dir` (the same contract)."""
    schema = pa.Table.from_pylist(sft_rows(1, 0, "train", 1.0)).schema  # a calling row: every message field
    splits = [(split, sft_rows(n, seed, split, call_share)) for split, n in (("train", n_train), ("test", n_test))]
    return write_split_files(save_dir, splits, schema, progress=progress)
