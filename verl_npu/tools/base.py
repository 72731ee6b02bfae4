"""verl's tool interface, with verl's names and meanings, so a tool written for verl ports by changing
its import.

A tool is one object per run (built from its tool config entry: `config`, `tool_schema`); each tool
call in a trajectory goes through its life cycle, as in verl 0.9.1's tool agent loop:

    instance_id, _ = create(create_kwargs=...)      # the row's extra_info.tools_kwargs[<tool name>].create_kwargs
    response, step_reward, metrics = execute(instance_id, arguments)   # arguments: the parsed JSON dict
    release(instance_id)

`calc_reward(instance_id)` is the tool's own score of its state (verl's tools call it from `execute`).
Any of the four may be a plain method or `async def`. `execute` may return a `ToolResponse`, a string
(verl's older tools) or a dict with `text`; `create` may return the instance id alone or
(instance id, ToolResponse). A tool that raises becomes an error message in the conversation, never a
crashed run (`verl_npu.rollout.agent_loop`).
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field
from typing import Any


class _Node:
    """Attribute access over a dict (what verl's pydantic schema objects give: `schema.function.name`)."""

    def __init__(self, data: dict):
        self._data = data

    def __getattr__(self, name: str) -> Any:
        data = self.__dict__.get("_data", {})
        if name not in data:
            raise AttributeError(name)
        value = data[name]
        return _Node(value) if isinstance(value, dict) else value

    def model_dump(self, **_: Any) -> dict:
        return copy.deepcopy(self._data)


class OpenAIFunctionToolSchema(_Node):
    """An OpenAI function tool schema ({"type": "function", "function": {"name", "description",
    "parameters"}}), read as attributes (`schema.function.name`) like verl's class of this name."""

    @classmethod
    def model_validate(cls, data: dict) -> OpenAIFunctionToolSchema:
        if isinstance(data, cls):
            return data
        return cls(copy.deepcopy(dict(data)))


@dataclass
class ToolResponse:
    """What a tool call returns to the conversation (verl's class of this name): text, and images (PIL)
    that join the conversation as the tool turn's image parts (a vision-language model on the hf engine;
    docs/agents.md, "Images in a conversation"). Videos are not built (a tool returning them gets an error
    message in the conversation)."""

    text: str | None = None
    image: list | None = None
    video: list | None = None
    extra: dict = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not self.text and not self.image and not self.video


class BaseTool:
    """Base class of tools (verl's `BaseTool`): override `execute`, and `create` / `calc_reward` /
    `release` where the tool keeps per-call state."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | dict | None):
        self.config = config or {}
        if tool_schema is None:
            tool_schema = self.get_openai_tool_schema()
        if tool_schema is None:
            raise ValueError(f"{type(self).__name__}: no tool_schema in the tool config and none from the class")
        self.tool_schema = OpenAIFunctionToolSchema.model_validate(tool_schema)
        self.name = self.tool_schema.function.name

    def checked_config(self, known: tuple[str, ...], tool: str) -> dict:
        """A copy of the tool config, after refusing every key not in `known` by name (a tool that reads a
        fixed set of keys ignores none silently); `tool` names the tool in the message."""
        unknown = sorted(set(self.config) - set(known))
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown}; {tool} reads {', '.join(known)}")
        return dict(self.config)

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
        return getattr(self, "tool_schema", None)

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid.uuid4()), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        return None
