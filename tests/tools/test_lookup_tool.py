"""The tool demo's lookup task: the tool answers the row's own code (it takes no argument), the reward pays
the right code written as `#### n` and nothing for calling, the data hides each code behind the tool, and
`run` makes the multi-turn recipe's data from the tool's own writer (its registry spec), the SFT recipe's from
its own."""

from __future__ import annotations

import asyncio

import pyarrow.parquet as pq
import pytest

from verl_npu.data import tool_lookup
from verl_npu.demo import DEMO_DATA_SFT_OF_RECIPE, _data_writer, _tool_demo_data
from verl_npu.rewards import default_compute_score
from verl_npu.tool_registry import read_tool_config
from verl_npu.tools.loading import load_tools
from verl_npu.tools.lookup import LookupTool


def _call(tool, create_kwargs, arguments):
    async def go():
        instance, _ = await tool.create(create_kwargs=create_kwargs)
        out = await tool.execute(instance, arguments)
        await tool.release(instance)
        return out

    return asyncio.run(go())


def test_the_tool_answers_the_rows_own_code_whatever_its_arguments():
    tool = LookupTool({"type": "native"})
    response, reward, _ = _call(tool, {"key": "K", "value": "7"}, {})
    assert (response.text, reward) == ("7", 1.0)
    assert _call(tool, {"value": "3"}, {"key": "J"})[0].text == "3"  # an argument is ignored
    with pytest.raises(ValueError, match="create_kwargs"):
        _call(tool, {"key": "K"}, {})
    assert tool._codes == {}  # released


def test_the_tool_config_builds_the_builtin_tool():
    entries, problems = read_tool_config("examples/tool_config/lookup_tool_config.yaml")
    assert not problems and entries[0].demo_data == "verl_npu.data.tool_lookup:prepare_synthetic"
    tools = load_tools("examples/tool_config/lookup_tool_config.yaml")
    assert isinstance(tools["lookup"], LookupTool)


def test_the_reward_pays_the_right_code_and_nothing_for_the_call():
    def score(text):
        return default_compute_score("tool_lookup", text, "7")["score"]

    assert score("#### 7") == 1.0
    assert score("\n<|im_start|>tool\n7\n#### 7") == 1.0  # after the tool's reply
    assert score("#### 3") == 0.0 and score("7") == 0.0  # a wrong code; a bare number is no answer
    assert score("#### 7 #### 8") == 0.0  # the last answer counts


def test_the_data_hides_each_code_behind_the_tool():
    rows = tool_lookup.sft_rows(400, 0, "train")
    calling = [r for r in rows if len(r["messages"]) == 4]
    assert 0.5 < len(calling) / len(rows) < 0.7  # CALL_SHARE 0.6: the rest guess
    for r in calling[:20]:
        user, call, reply, answer = r["messages"]
        assert call["content"] == '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>'  # one fixed call
        assert reply["role"] == "tool" and answer["content"] == f"#### {reply['content']}"
    guesses = [r["messages"][1]["content"] for r in rows if len(r["messages"]) == 2]
    assert set(guesses) == {"#### 0"}  # one fixed guess (tool_lookup.GUESS)
    rl = [tool_lookup.rl_row(k, c, "test", i) for i, (k, c) in enumerate(tool_lookup.problems(50, 0, "test"))]
    kwargs = rl[0]["extra_info"]["tools_kwargs"]["lookup"]["create_kwargs"]
    assert kwargs["value"] == rl[0]["reward_model"]["ground_truth"] and kwargs["key"] in rl[0]["prompt"][0]["content"]
    assert kwargs["value"] not in rl[0]["prompt"][0]["content"]
    assert len({r["reward_model"]["ground_truth"] for r in rl}) == 10  # the codes vary row to row


def test_run_makes_each_stages_data_from_its_own_writer(tmp_path):
    """The multi-turn recipe's data comes from the writer its tool's registry spec names; the SFT recipe's
    from the writer of its recipe name (verl_npu/demo.py)."""
    from verl_npu.config.recipes import find_recipe

    writer, kwargs, _ = _data_writer(
        "tiny://qwen2", multi_turn=True, tool_data=_tool_demo_data("examples/tool_config/lookup_tool_config.yaml")
    )
    rl = pq.read_table(writer(tmp_path / "rl", 4, 2, seed=0, **kwargs)["paths"]["test"]).to_pylist()
    assert {r["data_source"] for r in rl} == {"tool_lookup"} and rl[0]["agent_name"] == "tool_agent"
    assert _tool_demo_data("examples/tool_config/gsm8k_tool_config.yaml") == ""
    module, fn, kwargs, _ = DEMO_DATA_SFT_OF_RECIPE["tiny_lookup_sft"]
    assert find_recipe("tiny_lookup_sft").is_file() and (module, fn) == ("verl_npu.data.tool_lookup", "prepare_sft")
    sft = pq.read_table(tool_lookup.prepare_sft(tmp_path / "sft", 4, 2)["paths"]["train"]).to_pylist()
    assert {r["data_source"] for r in sft} == {"tool_lookup_sft"}
