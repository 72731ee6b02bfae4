"""GSM8K for multi-turn rollout with the GSM8K tool, in verl's multi-turn parquet format
(`data_prep/gsm8k_multiturn_w_tool.py`; same sources and options as data_prep/gsm8k.py, `--synthetic N` too).

Each row is a `verl_npu.data.gsm8k` row with:

    prompt        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question + instruction}]
    agent_name    "tool_agent"   (verl's name of its tool-calling agent loop)
    extra_info    + need_tools_kwargs: true,
                    tools_kwargs: {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": <answer>}}},
                    interaction_kwargs: {"name": "gsm8k", "query": question, "ground_truth": <answer>}

`tools_kwargs[<tool name>].create_kwargs` is what the rollout passes to that tool's `create` for this row
(the GSM8K tool checks submitted answers against its ground_truth; verl_npu/tools/gsm8k.py).
"""

from __future__ import annotations

import pyarrow as pa

from verl_npu.data import gsm8k
from verl_npu.data.prep import EXTRA_INFO_TYPE, prep_parser, rl_schema

TOOL_NAME = "calc_gsm8k_reward"
AGENT_NAME = "tool_agent"
SYSTEM = (
    "You solve math word problems. Think step by step first. Then check your answer with the "
    f"`{TOOL_NAME}` tool at least once, and correct it if the tool says it is wrong. End with the final "
    "answer written as `#### <answer>`."
)


def multiturn_row(
    row: dict, split: str, index: int, data_source: str = gsm8k.HUB_ID, instruction: str = gsm8k.INSTRUCTION
) -> dict:
    """A GSM8K source row as a multi-turn tool row (format in the module doc)."""
    out = gsm8k.gsm8k_row(row, split, index, data_source, instruction)
    truth = out["reward_model"]["ground_truth"]
    out["prompt"] = [{"role": "system", "content": SYSTEM}] + out["prompt"]
    out["agent_name"] = AGENT_NAME
    out["extra_info"] = {
        **out["extra_info"],
        "need_tools_kwargs": True,
        "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"ground_truth": truth}}},
        # name: the GSM8K interaction (examples/interaction_config/gsm8k_interaction_config.yaml), as verl's
        # interaction data names it; read only when multi_turn.interaction_config_path is set
        "interaction_kwargs": {"name": "gsm8k", "query": out["extra_info"]["question"], "ground_truth": truth},
    }
    return out


def multiturn_schema() -> pa.Schema:
    """The Arrow schema of a multi-turn row: the RL schema, extra_info's tool fields, agent_name."""
    create = pa.struct([("create_kwargs", pa.struct([("ground_truth", pa.string())]))])
    extra = pa.struct(
        list(EXTRA_INFO_TYPE)
        + [
            pa.field("need_tools_kwargs", pa.bool_()),
            pa.field("tools_kwargs", pa.struct([(TOOL_NAME, create)])),
            pa.field(
                "interaction_kwargs",
                pa.struct([("name", pa.string()), ("query", pa.string()), ("ground_truth", pa.string())]),
            ),
        ]
    )
    base = rl_schema(with_images=False)
    fields = [pa.field("extra_info", extra) if f.name == "extra_info" else f for f in base]
    return pa.schema(fields + [pa.field("agent_name", pa.string())])


def prepare_synthetic(save_dir, n_train: int, n_test: int, seed: int = 0, progress: bool = False) -> dict:
    """The synthetic arithmetic task (`gsm8k.prepare_synthetic`) as multi-turn tool rows."""
    return gsm8k.prepare_synthetic(
        save_dir, n_train, n_test, seed=seed, progress=progress, to_row=multiturn_row, schema=multiturn_schema()
    )


def build_parser():
    return prep_parser(
        "data_prep/gsm8k_multiturn_w_tool.py",
        "GSM8K (or the synthetic arithmetic task) for multi-turn rollout with the GSM8K tool, in verl's multi-turn "
        "format (a system prompt, extra_info.tools_kwargs),",
        default_dir="~/data/gsm8k_multiturn_w_tool",
        dataset_help="a local copy of openai/gsm8k (main): a folder of parquet files or a save_to_disk folder",
        synthetic_help="write N synthetic train rows (one-step word problems: a count of 1-5 things grows by "
        "one; no network) instead of GSM8K",
    )


def main(argv: list[str] | None = None) -> None:
    """CLI entry point of ``data_prep/gsm8k_multiturn_w_tool.py``."""
    gsm8k.main(argv, parser=build_parser(), to_row=multiturn_row, schema=multiturn_schema())
