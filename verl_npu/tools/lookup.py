"""The lookup tool of the tool demo (tool config `class_name: lookup`): a table the model can read only
through the tool.

Each row carries its own hidden entry (`extra_info.tools_kwargs.lookup.create_kwargs`: `key`, `value`;
written by `verl_npu.data.tool_lookup`). A call `{"name": "lookup", "arguments": {"key": "K"}}` answers, as
the tool turn, the entry's value (e.g. `472`) when `K` is the row's key (spaces and case aside), else
`no entry for 'K'`. The step reward (`execute`'s second value) is 1.0 for a call that found the entry, 0.0
otherwise; the agent loop records it (`tool_rewards` in the rollout dumps) and does not add it to the reward.
The values are drawn per row, so a model cannot learn them: only a call gives the value.
"""

from __future__ import annotations

import uuid
from typing import Any

from verl_npu.registry import TOOLS
from verl_npu.tools.base import BaseTool, ToolResponse

TOOL_NAME = "lookup"
SCHEMA = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Looks up the code stored under a key",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string", "description": "The key, as the question names it"}},
            "required": ["key"],
        },
    },
}


def not_found(key: str) -> str:
    """The tool turn of a call whose key is not the row's."""
    return f"no entry for {key!r}"


@TOOLS.register(
    "lookup",
    function_name="lookup",
    demo_data="verl_npu.data.tool_lookup:prepare_synthetic",
    doc="the tool demo's lookup: answers the value stored under the row's key (its create_kwargs)",
)
class LookupTool(BaseTool):
    def __init__(self, config: dict, tool_schema=None):
        super().__init__(config, tool_schema or SCHEMA)
        self.checked_config(("type",), "the lookup tool")
        self._entries: dict[str, tuple[str, str]] = {}

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        create_kwargs = kwargs.get("create_kwargs") or {}
        instance_id = instance_id or str(uuid.uuid4())
        key, value = create_kwargs.get("key"), create_kwargs.get("value")
        if key is None or value is None:
            raise ValueError(
                "the lookup tool needs the row's extra_info.tools_kwargs.lookup.create_kwargs "
                "{key, value} (verl_npu.data.tool_lookup writes them)"
            )
        self._entries[instance_id] = (str(key), str(value))
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        key, value = self._entries[instance_id]
        asked = parameters.get("key") if isinstance(parameters, dict) else None
        asked = "" if asked is None else str(asked)
        if asked.strip().lower() == key.strip().lower():
            return ToolResponse(text=value), 1.0, {}
        return ToolResponse(text=not_found(asked)), 0.0, {}

    async def release(self, instance_id: str, **kwargs) -> None:
        self._entries.pop(instance_id, None)
