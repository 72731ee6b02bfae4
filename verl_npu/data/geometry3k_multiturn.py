"""Geometry3K for multi-turn rollout with tools, in verl's multi-turn parquet format
(`data_prep/geometry3k.py --multiturn [geo3k|zoom|both]`, `verl_npu.data.geometry3k.row_format`; the same
sources and options as the single-turn rows, `--synthetic N` too).

Each row is a `verl_npu.data.geometry3k` row (its `images` and `<image>` placeholder included) with:

    prompt        [{"role": "system", "content": <how to use the tools>}, {"role": "user", "content": problem + instruction}]
    agent_name    "tool_agent"   (verl's name of its tool-calling agent loop)
    extra_info    + need_tools_kwargs: true,
                    tools_kwargs: {"calc_geo3k_reward": {"create_kwargs": {"ground_truth": <answer>}}}

`tools_kwargs[<tool name>].create_kwargs` is what the rollout passes to that tool's `create` for this row: the
geo3k tool grades submitted answers against its ground_truth (verl_npu/tools/geo3k.py). The zoom-in tool
needs no entry: it crops the row's own image, which the agent loop hands it (verl_npu/tools/image_zoom.py).
The system prompt names the tools of the chosen mode: verl's geo3k answer check (`geo3k`, verl's example),
the zoom-in tool (`zoom`), or both.
"""

from __future__ import annotations

import pyarrow as pa

GEO3K_TOOL = "calc_geo3k_reward"
ZOOM_TOOL = "image_zoom_in_tool"
AGENT_NAME = "tool_agent"
DEFAULT_DIR = "~/data/geo3k_multiturn_w_tool"
#: what the system prompt says about each tool
TOOL_LINES = {
    "geo3k": f"Check your answer with the `{GEO3K_TOOL}` tool at least once before the final answer, and correct "
    "it if the tool says it is wrong.",
    "zoom": f"To look at a part of the picture more closely, call the `{ZOOM_TOOL}` tool with the region's "
    "bounding box [x1, y1, x2, y2] in the picture's pixels; it replies with that region enlarged.",
}
#: --multiturn mode -> the tools its system prompt names
MODES = {"geo3k": ("geo3k",), "zoom": ("zoom",), "both": ("zoom", "geo3k")}


def system_prompt(mode: str) -> str:
    """The system message of `mode`'s rows: reason step by step, then the lines of its tools."""
    if mode not in MODES:
        raise ValueError(f"unknown multi-turn mode {mode!r}; one of {', '.join(MODES)}")
    lines = ["You are a math expert. Solve the question step by step, reasoning before any tool call."]
    return " ".join(lines + [TOOL_LINES[t] for t in MODES[mode]])


def to_multiturn(row: dict, mode: str) -> dict:
    """A single-turn Geometry3K RL row (`geometry3k.geometry3k_row`) as a multi-turn tool row (module doc)."""
    truth = row["reward_model"]["ground_truth"]
    return {
        **row,
        "prompt": [{"role": "system", "content": system_prompt(mode)}] + list(row["prompt"]),
        "agent_name": AGENT_NAME,
        "extra_info": {
            **row["extra_info"],
            "need_tools_kwargs": True,
            "tools_kwargs": {GEO3K_TOOL: {"create_kwargs": {"ground_truth": truth}}},
        },
    }


def multiturn_schema(base: pa.Schema, extra_info_type: pa.StructType) -> pa.Schema:
    """The Arrow schema of a multi-turn row from the RL schema `base` (with images) and its extra_info type:
    extra_info's tool fields added, and the agent_name column."""
    create = pa.struct([("create_kwargs", pa.struct([("ground_truth", pa.string())]))])
    extra = pa.struct(
        list(extra_info_type)
        + [pa.field("need_tools_kwargs", pa.bool_()), pa.field("tools_kwargs", pa.struct([(GEO3K_TOOL, create)]))]
    )
    fields = [pa.field("extra_info", extra) if f.name == "extra_info" else f for f in base]
    return pa.schema(fields + [pa.field("agent_name", pa.string())])
