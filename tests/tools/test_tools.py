"""Tool config files, tool loading, the GSM8K tool and the multi-turn config keys: every mistake is refused
before start, naming the file and the key."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from verl_npu.config import load_recipe
from verl_npu.errors import ConfigErrors, UserError
from verl_npu.tool_registry import read_tool_config
from verl_npu.tools.gsm8k import Gsm8kTool
from verl_npu.tools.loading import load_tools, run_method

REPO = Path(__file__).resolve().parents[2]
GSM8K_CONFIG = REPO / "examples" / "tool_config" / "gsm8k_tool_config.yaml"
MT = "actor_rollout_ref.rollout.multi_turn."


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


SCHEMA = """
    tool_schema:
      type: function
      function:
        name: {name}
        description: d
        parameters: {{type: object, properties: {{x: {{type: string}}}}, required: [x]}}
"""

# a tool written for verl, ported by changing its imports only
VERL_STYLE_TOOL = """
from typing import Any, Optional
from uuid import uuid4

from verl_npu.tools.base_tool import BaseTool              # verl: from verl.tools.base_tool import BaseTool
from verl_npu.tools.schemas import OpenAIFunctionToolSchema, ToolResponse   # verl: from verl.tools.schemas import ...


class Counter(BaseTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        self._instances = {}
        assert self.tool_schema.function.name == self.name

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        self._instances[instance_id] = kwargs.get("create_kwargs", {}).get("start", 0)
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs):
        self._instances[instance_id] += len(parameters["x"])
        return ToolResponse(text=f"count={self._instances[instance_id]}"), 0.1 * self.config["scale"], {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return float(self._instances[instance_id])

    async def release(self, instance_id: str, **kwargs) -> None:
        del self._instances[instance_id]


class NotATool:
    pass
"""


def test_the_shipped_gsm8k_tool_config_loads_through_verls_class_path():
    entries, problems = read_tool_config(GSM8K_CONFIG)
    assert problems == [] and entries[0].class_name == "verl.tools.gsm8k_tool.Gsm8kTool"
    tools = load_tools(GSM8K_CONFIG)
    assert list(tools) == ["calc_gsm8k_reward"] and isinstance(tools["calc_gsm8k_reward"], Gsm8kTool)


def test_gsm8k_tool_has_verls_semantics():
    tool = Gsm8kTool({})
    iid, _ = tool.create(create_kwargs={"ground_truth": "72"})
    assert tool.execute(iid, {"answer": "70"})[1:] == (-0.05, {})  # 0 is no improvement on 0
    response, step, _ = tool.execute(iid, {"answer": "72"})
    assert response.text == "Current parsed answer='72' reward=1.0" and step == 0.0
    assert tool.execute(iid, {"answer": "#### 72"})[1] == -0.05  # the same score again: penalty
    assert tool.calc_reward(iid) == 1.0
    tool.release(iid)
    assert iid not in tool._state
    iid, _ = tool.create(ground_truth="3")  # verl's older keyword
    assert tool.execute(iid, '{"answer": 3}')[0].text.endswith("reward=1.0")  # JSON text, a number


def test_a_verl_tool_ports_by_changing_its_import(tmp_path):
    write(tmp_path / "my_tools.py", VERL_STYLE_TOOL)
    cfg = write(
        tmp_path / "tools.yaml",
        "tools:\n  - class_name: " + str(tmp_path / "my_tools.py") + ":Counter\n"
        "    config: {type: native, scale: 2}\n"
        + textwrap.indent(textwrap.dedent(SCHEMA.format(name="count")), "    "),
    )
    tool = load_tools(cfg)["count"]

    async def life():
        iid, _ = await run_method(tool.create, create_kwargs={"start": 10})
        out = await run_method(tool.execute, iid, {"x": "abc"})
        reward = await run_method(tool.calc_reward, iid)
        await run_method(tool.release, iid)
        return out, reward

    (response, step, _), reward = asyncio.run(life())
    assert response.text == "count=13" and step == pytest.approx(0.2) and reward == 13.0


@pytest.mark.parametrize(
    "body, where, what",
    [
        ("tools: 3", "tools", "must be a list"),
        ("tools:\n  - config: {type: native}", "tools[0].class_name", "must name the tool class"),
        ("tools:\n  - class_name: gsm8k\n    config: {type: mcp}", "tools[0].config.type", "MCP tools are not built"),
        (
            "tools:\n  - class_name: gsm8k\n    tool_schema: {type: func, function: {name: a}}",
            "tools[0].tool_schema.type",
            "type: function",
        ),
        (
            "tools:\n  - class_name: gsm8k\n    tool_schema: {type: function, function: {name: a, parameters: {type: object, "
            "properties: {x: {type: string}}, required: [y]}}}",
            "parameters.required",
            "['y']",
        ),
        ("tools:\n  - class_name: nowhere/t.py:T", "tools[0].class_name", "does not exist"),
        ("tools:\n  - class_name: no_such_package_xyz.mod.Tool", "tools[0].class_name", "cannot be found"),
        ("tools:\n  - class_name: verl.tools.my_tool.MyTool", "tools[0].class_name", "change its import"),
        (
            "tools:\n  - class_name: verl.tools.mcp_search_tool.MCPSearchTool",
            "tools[0].class_name",
            "does not support verl's MCPSearchTool yet (it is an MCP tool); write a native tool class",
        ),
        (
            "tools:\n  - class_name: gsm8k\n    tool_schema: {type: function, function: {name: a}}\n"
            "  - class_name: gsm8k\n    tool_schema: {type: function, function: {name: a}}",
            "tools[1].tool_schema.function.name",
            "unique",
        ),
        ("tools: [", "", "not valid YAML"),
        (
            "tools:\n  - class_name: gsm8k\n    tool_schema: {type: function, function: {name: check}}",
            "tools[0].tool_schema.function.name",
            "use name: calc_gsm8k_reward",
        ),
    ],
)
def test_bad_tool_config_files_are_refused_naming_file_and_key(tmp_path, body, where, what):
    path = write(tmp_path / "t.yaml", body)
    _, problems = read_tool_config(path)
    assert any(str(path) in w and w.endswith(where) and what in m for w, m in problems), problems
    with pytest.raises(UserError, match="multi_turn.tool_config_path"):
        load_tools(path)


@pytest.mark.parametrize(
    "class_name, schema_name, what",
    [
        ("{file}:Missing", "count", "has no class 'Missing' \\(classes there: .*Counter"),
        ("{file}:NotATool", "count", "is not a tool: it has no create, execute, release"),
        (
            "gsm8k",
            "check_answer",
            "is 'check_answer' but 'gsm8k' is the tool 'calc_gsm8k_reward'; use name: calc_gsm8k_reward",
        ),
        ("{bad}:T", "t", "importing .* failed: ZeroDivisionError"),
    ],
)
def test_classes_that_cannot_be_built_are_refused_naming_the_entry(tmp_path, class_name, schema_name, what):
    write(tmp_path / "my_tools.py", VERL_STYLE_TOOL)
    write(tmp_path / "bad.py", "x = 1 / 0\n")
    name = class_name.format(file=tmp_path / "my_tools.py", bad=tmp_path / "bad.py")
    cfg = write(
        tmp_path / "tools.yaml",
        f"tools:\n  - class_name: {name}\n    config: {{type: native, scale: 1}}\n"
        + textwrap.indent(textwrap.dedent(SCHEMA.format(name=schema_name)), "    "),
    )
    with pytest.raises(UserError, match=what) as info:
        load_tools(cfg)
    assert f"{cfg}: tools[0]" in str(info.value)


# ------------------------------------------------------------------ config keys
def _problems(overrides, **kw):
    with pytest.raises(ConfigErrors) as info:
        load_recipe("tiny_gsm8k", overrides, **kw)
    return info.value.problems


def test_multi_turn_keys_load_and_data_tool_config_path_is_verls_spelling():
    rc = load_recipe(
        "tiny_gsm8k",
        [
            MT + "enable=true",
            MT + "max_assistant_turns=3",
            MT + "max_user_turns=2",
            MT + "max_parallel_calls=2",
            MT + "max_tool_response_length=64",
            MT + "tool_response_truncate_side=left",
            MT + "format=hermes",
            MT + "tokenization_sanity_check_mode=disable",
            f"data.tool_config_path={GSM8K_CONFIG}",
        ],
    )
    mt = rc.backend.actor_rollout_ref.rollout.multi_turn
    assert (mt.max_assistant_turns, mt.max_user_turns, mt.tool_response_truncate_side) == (3, 2, "left")
    assert mt.tool_config_path == str(GSM8K_CONFIG)
    # either engine runs the agent loop
    rc = load_recipe("tiny_gsm8k", [MT + "enable=true", "actor_rollout_ref.rollout.name=vllm"])
    assert (
        rc.backend.actor_rollout_ref.rollout.name == "vllm" and rc.backend.actor_rollout_ref.rollout.multi_turn.enable
    )


@pytest.mark.parametrize(
    "overrides, key, what",
    [
        ([MT + "enable=true", "actor_rollout_ref.rollout.ignore_eos=true"], "rollout.ignore_eos", "end-of-turn"),
        ([MT + "tool_response_truncate_side=top"], "multi_turn.tool_response_truncate_side", "top"),
        ([MT + "max_assistant_turns=0"], "multi_turn.max_assistant_turns", ">= 1"),
        ([MT + "use_inference_chat_template=true"], "multi_turn.use_inference_chat_template", "re-rendering"),
        (
            ["actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent"],
            "agent.default_agent_loop",
            "multi_turn.enable is false",
        ),
        (["actor_rollout_ref.rollout.agent.default_agent_loop=react_agent"], "agent.default_agent_loop", "react_agent"),
        # custom agent loops run on one-rank engines (their trajectories are not shared between TP ranks)
        (
            [
                "actor_rollout_ref.rollout.agent.agent_loop_config_path=/a.yaml",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            ],
            "agent.agent_loop_config_path",
            "tensor-parallel",
        ),
    ],
)
def test_multi_turn_settings_that_cannot_run_are_refused_by_key(overrides, key, what):
    problems = _problems(overrides)
    assert any(p.key.endswith(key) and what in str(p) for p in problems), [str(p) for p in problems]


def test_a_bad_tool_config_is_refused_at_check_paths_naming_key_file_and_entry(tmp_path):
    path = write(tmp_path / "t.yaml", "tools:\n  - class_name: gsm8k\n    config: {type: mcp}\n")
    problems = _problems(
        [MT + "enable=true", f"{MT}tool_config_path={path}", f"data.train_files={tmp_path}/x.parquet"], check_paths=True
    )
    [p] = [p for p in problems if p.key.endswith("multi_turn.tool_config_path")]
    assert f"{path}: tools[0].config.type" in p.message and "MCP" in p.message


def test_rows_naming_an_unknown_agent_or_the_tool_agent_without_multi_turn_are_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from verl_npu.config.schema_multiturn import AGENT_LOOPS
    from verl_npu.data import RLDataset
    from verl_npu.models.tiny import materialize

    tok = AutoTokenizer.from_pretrained(materialize("tiny://qwen2"))
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": "1+1?"}],
            "reward_model": {"style": "rule", "ground_truth": "2"},
            "agent_name": name,
        }
        for name in ("tool_agent", None, "react_agent")
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    data = RLDataset(str(tmp_path / "d.parquet"), tok, None, {"max_prompt_length": 64})
    assert data[0]["agent_name"] == "tool_agent" and data[1]["agent_name"] is None
    with pytest.raises(
        UserError,
        match=r"d.parquet row 2: agent_name 'react_agent' is not an agent loop.*"
        r"agent_loop_config_path: my_loop\)",
    ):
        data.check_agent_names(AGENT_LOOPS, multi_turn=True, custom=("my_loop",))
    data.check_agent_names(AGENT_LOOPS, multi_turn=True, custom=("react_agent",))  # a custom loop's name
    pq.write_table(pa.Table.from_pylist(rows[:2]), tmp_path / "d.parquet")
    data = RLDataset(str(tmp_path / "d.parquet"), tok, None, {"max_prompt_length": 64})
    data.check_agent_names(AGENT_LOOPS, multi_turn=True)
    with pytest.raises(UserError, match=r"row 0: agent_name 'tool_agent' needs multi-turn rollout; set .*enable=true"):
        data.check_agent_names(AGENT_LOOPS, multi_turn=False)


def test_the_tool_written_in_docs_agents_md_works_as_documented(tmp_path, monkeypatch):
    """docs/agents.md's example tool and its tool config, as a user would save them, load and run."""
    import re

    doc = (REPO / "docs" / "agents.md").read_text()
    section = doc[doc.index("## Writing a tool") :]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    config = re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1)
    (tmp_path / "my_tools.py").write_text(code)
    (tmp_path / "tools.yaml").write_text(config)
    monkeypatch.chdir(tmp_path)  # class_name my_tools.py:... is relative to the run's folder
    assert read_tool_config("tools.yaml")[1] == []
    tool = load_tools("tools.yaml")["guess_number"]

    async def play():
        iid, _ = await run_method(tool.create, create_kwargs={"secret": 7})
        replies = [(await run_method(tool.execute, iid, {"guess": g}))[0].text for g in (3, 9, 7)]
        reward = await run_method(tool.calc_reward, iid)
        await run_method(tool.release, iid)
        return replies, reward

    assert asyncio.run(play()) == (["higher", "lower", "right"], pytest.approx(1 / 3))
