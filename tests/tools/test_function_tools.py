"""Python functions as tools (verl 0.9.1's @function_tool, multi_turn.function_tool_path): schemas from the
functions, verl's return-value rules, refusals naming the file, the config keys, and a call in the agent loop."""

from __future__ import annotations

import asyncio
import re
import textwrap
from pathlib import Path

import pytest

from verl_npu.config import load_recipe
from verl_npu.errors import ConfigErrors, UserError
from verl_npu.tools.base import ToolResponse
from verl_npu.tools.function_tool import tool_result
from verl_npu.tools.loading import load_tools, run_method

REPO = Path(__file__).resolve().parents[2]
GSM8K_CONFIG = REPO / "examples" / "tool_config" / "gsm8k_tool_config.yaml"
MT = "actor_rollout_ref.rollout.multi_turn."


def doc_example(tmp_path: Path) -> Path:
    """docs/agents.md's function-tool file, as a user would save it."""
    doc = (REPO / "docs" / "agents.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc[doc.index("## Function tools") :], re.DOTALL).group(1)
    path = tmp_path / "my_functions.py"
    path.write_text(code)
    return path


def call(tool, arguments):
    async def life():
        iid, _ = await run_method(tool.create, create_kwargs={})
        out = await run_method(tool.execute, iid, arguments)
        await run_method(tool.release, iid)
        return out

    return asyncio.run(life())


def test_the_documented_functions_are_tools_with_schemas_from_their_docstrings(tmp_path):
    tools = load_tools(None, doc_example(tmp_path))
    assert sorted(tools) == ["add", "lookup"]
    fn = tools["add"].tool_schema.model_dump()["function"]
    assert fn["name"] == "add" and fn["description"] == "Add two integers."
    assert fn["parameters"]["properties"] == {
        "a": {"type": "integer", "description": "The first number."},
        "b": {"type": "integer", "description": "The second number."},
    }
    assert fn["parameters"]["required"] == ["a", "b"]
    response, reward, _ = call(tools["add"], {"a": 2, "b": 3})
    assert response.text == "5" and reward == 0.0
    response, reward, _ = call(tools["lookup"], {"word": "abc"})  # async, renamed, (dict, reward)
    assert response.text == '{"word": "abc", "length": 3}' and reward == pytest.approx(0.1)
    with pytest.raises(TypeError):  # the agent loop makes it an error turn
        call(tools["add"], {"a": 1})


def test_function_tools_join_the_tool_config_and_names_must_differ(tmp_path):
    both = load_tools(GSM8K_CONFIG, doc_example(tmp_path))
    assert sorted(both) == ["add", "calc_gsm8k_reward", "lookup"]
    clash = tmp_path / "clash.py"
    clash.write_text(
        "from verl_npu.tools.function_tool import function_tool\n\n"
        "@function_tool(schema={'type': 'function', 'function': {'name': 'x', 'parameters': "
        "{'type': 'object', 'properties': {}}}})\ndef calc_gsm8k_reward():\n    return 'no'\n"
    )
    with pytest.raises(UserError, match=r"declares tool name\(s\) \['calc_gsm8k_reward'\].*rename one"):
        load_tools(GSM8K_CONFIG, clash)


@pytest.mark.parametrize(
    "body, what",
    [
        ("x = 1\n", "declares no tool"),
        ("import nope_not_a_module\n", "importing .* failed: ModuleNotFoundError"),
        (
            "from verl_npu.tools.function_tool import function_tool\n\n@function_tool\ndef f(a):\n    return a\n",
            "@function_tool 'f': its schema cannot be read",
        ),
        (
            "from verl_npu.tools.function_tool import function_tool\n\n@function_tool\ndef f(*args: int):\n"
            '    """F.\n\n    Args:\n        args: x\n    """\n',
            r"\*args / \*\*kwargs",
        ),
        (
            "from verl_npu.tools.function_tool import function_tool\n\n"
            "@function_tool('g', schema={'type': 'function', 'function': {}})\ndef f():\n    return 1\n\n"
            "@function_tool('g', schema={'type': 'function', 'function': {}})\ndef h():\n    return 2\n",
            "'g' twice",
        ),
    ],
)
def test_bad_function_tool_files_are_refused_naming_the_file(tmp_path, body, what):
    path = tmp_path / "tools.py"
    path.write_text(textwrap.dedent(body))
    with pytest.raises(UserError, match=what) as info:
        load_tools(None, path)
    assert "multi_turn.function_tool_path" in str(info.value) and str(path) in str(info.value)
    with pytest.raises(UserError, match="does not exist"):
        load_tools(None, tmp_path / "none.py")


@pytest.mark.parametrize(
    "value, text, reward, metrics",
    [
        ("hi", "hi", 0.0, {}),
        ({"a": 1}, '{"a": 1}', 0.0, {}),
        (ToolResponse(text="r"), "r", 0.0, {}),
        (("t", 0.5), "t", 0.5, {}),
        (("t", None, {"m": 1}), "t", 0.0, {"m": 1}),
        ((ToolResponse(text="r"),), "r", 0.0, {}),
        (7, "7", 0.0, {}),
    ],
)
def test_return_values_follow_verls_rules(value, text, reward, metrics):
    response, got_reward, got_metrics = tool_result(value)
    assert (response.text, got_reward, got_metrics) == (text, reward, metrics)


def test_a_four_tuple_is_an_authoring_error():
    with pytest.raises(TypeError, match="tuple of 4 values"):
        tool_result((1, 2, 3, 4))


def test_config_keys_verls_data_spelling_and_the_path_check(tmp_path):
    path = doc_example(tmp_path)
    rc = load_recipe("tiny_gsm8k", [MT + "enable=true", f"data.function_tool_path={path}"])
    assert rc.backend.actor_rollout_ref.rollout.multi_turn.function_tool_path == str(path)
    with pytest.raises(ConfigErrors) as info:
        load_recipe(
            "tiny_gsm8k", [MT + "enable=true", f"{MT}function_tool_path={tmp_path / 'none.py'}"], check_paths=True
        )
    assert any(
        p.key.endswith("multi_turn.function_tool_path") and "does not exist" in p.message for p in info.value.problems
    )


def test_a_function_tool_call_in_the_agent_loop(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_npu.batch import Batch
    from verl_npu.config.typed import section
    from verl_npu.models.tiny import materialize
    from verl_npu.rollout.agent_loop import MULTI_TURN, AgentLoop
    from verl_npu.rollout.base import SamplingParams
    from verl_npu.rollout.hf import HFRollout

    path = materialize("tiny://qwen2")
    model, tok = AutoModelForCausalLM.from_pretrained(path).float().eval(), AutoTokenizer.from_pretrained(path)
    eng = HFRollout(model, tok, seed=0)
    eos = eng.eos_ids[0]
    turns = [
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>',
        "done",
    ]

    def factory(active, steps):
        plan = [tok(turns[t.assistant_turns], add_special_tokens=False)["input_ids"] + [eos] for t in active]
        return lambda scores, i: torch.tensor([p[i] if i < len(p) else eos for p in plan])

    loop = AgentLoop(
        model,
        tok,
        load_tools(None, doc_example(tmp_path)),
        section(MULTI_TURN, {}),
        eos_ids=eng.eos_ids,
        pad_id=eng.pad_id,
        suppress_ids=eng.suppress_ids,
        pick_factory=factory,
    )
    prompt = tok(
        tok.apply_chat_template([{"role": "user", "content": "2+40?"}], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )["input_ids"]
    batch = Batch(
        {"input_ids": torch.tensor([prompt]), "attention_mask": torch.ones(1, len(prompt), dtype=torch.long)},
        {"raw_prompt_ids": [prompt], "uid": ["q"], "extra_info": [{}]},
    )
    out = loop.run(batch, SamplingParams(n=1, max_new_tokens=200))
    traj = out["agent_turns"][0]
    assert [t["role"] for t in traj] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert traj[1]["calls"][0]["result"] == "42" and "\n42" in traj[1]["text"]
    assert traj[3]["calls"][0]["error"].startswith("Error executing tool 'add': TypeError")
    assert out["tool_call_counts"] == [2]
