"""Synthetic tool-call transcripts for SFT, made offline: the arithmetic word problems of the text demo
(`synthetic_arithmetic`) answered through the GSM8K answer-check tool, in verl's SFT parquet format.

Each row (`messages` is what verl's multi-turn SFT dataset reads; `tools` the tool schemas as JSON text):

    messages  [system: the tool demo's system prompt (gsm8k_multiturn.SYSTEM),
               user: the question and the synthetic RL rows' instruction (gsm8k.SYNTHETIC_INSTRUCTION: the
                     same prompt as the RL demo's rows, which a tiny model needs word for word),
               assistant: <tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "<n>"}}</tool_call>,
               tool: Current parsed answer='<n>' reward=1.0,
               assistant: #### <n>]
    tools     [the calc_gsm8k_reward function schema] (a list of OpenAI function schemas, as verl's dataset reads it)
    data_source "synthetic_tool_sft"

The tool turn is what `verl_npu.tools.gsm8k` answers; the assistant turns are what the multi-turn RL demo's
agent loop parses (Hermes tool calls), so a model fine-tuned on these starts RL already calling its tool.
"""

from __future__ import annotations

import json

import pyarrow as pa

from verl_npu.data import gsm8k
from verl_npu.data.gsm8k_multiturn import SYSTEM, TOOL_NAME
from verl_npu.data.split_files import write_split_files
from verl_npu.data.synthetic_arithmetic import generate_rows
from verl_npu.tools.answer_check import answer_tool_schema

DATA_SOURCE = "synthetic_tool_sft"
TOOLS = [answer_tool_schema(TOOL_NAME, "A tool for calculating the reward of gsm8k", "The answer to the question")]


def transcript(question: str, answer: str) -> list[dict]:
    """The five-message conversation of one problem whose final answer is `answer`."""
    call = json.dumps({"name": TOOL_NAME, "arguments": {"answer": answer}})
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{question} {gsm8k.SYNTHETIC_INSTRUCTION}"},
        {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
        {"role": "tool", "content": f"Current parsed answer='{answer}' reward=1.0"},
        {"role": "assistant", "content": f"#### {answer}"},
    ]


def schema() -> pa.Schema:
    """The Arrow schema of a row (the tool schemas' nested struct as Arrow infers it from one row)."""
    return pa.Table.from_pylist(rows(1, 0, "train")).schema


def rows(n: int, seed: int, split: str) -> list[dict]:
    out = []
    for row in generate_rows(n, seed, split):
        answer = row["answer"].rsplit("####", 1)[1].strip()
        out.append({"messages": transcript(row["question"], answer), "tools": TOOLS, "data_source": DATA_SOURCE})
    return out


def prepare_synthetic(save_dir, n_train: int, n_test: int, seed: int = 0, progress: bool = False) -> dict:
    """`train.parquet` and `test.parquet` of `n_train` / `n_test` transcripts under `save_dir` (the demo-data
    writer's contract, verl_npu/demo.py)."""
    return write_split_files(
        save_dir,
        (("train", rows(n_train, seed, "train")), ("test", rows(n_test, seed, "test"))),
        schema(),
        progress=progress,
    )
