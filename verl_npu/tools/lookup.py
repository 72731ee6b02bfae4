"""The lookup tool of the tool demo (tool config `class_name: lookup`): the one way to read a problem's
hidden code.

Each row carries its own hidden code (`extra_info.tools_kwargs.lookup.create_kwargs`: `value`, and the
`key` the question names; written by `verl_npu.data.tool_lookup`). A call `{"name": "lookup", "arguments":
{}}` answers, as the tool turn, the row's code (e.g. `7`). The tool takes no argument (any it is given is
ignored), so a call is one fixed string: the only thing a model must copy is the code, from the tool's reply
into its answer. The step reward (`execute`'s second value) is 1.0 for every call; the agent loop records it
(`tool_rewards` in the rollout dumps) and does not add it to the reward. The codes are drawn per row, so a
model cannot learn them: only a call gives the code.
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
        "description": "Reads the code the question asks for",
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}


@TOOLS.register(
    "lookup",
    function_name="lookup",
    demo_data="verl_npu.data.tool_lookup:prepare_synthetic",
    doc="the tool demo's lookup: answers the row's hidden code (its create_kwargs); no argument",
)
class LookupTool(BaseTool):
    def __init__(self, config: dict, tool_schema=None):
        super().__init__(config, tool_schema or SCHEMA)
        self.checked_config(("type",), "the lookup tool")
        self._codes: dict[str, str] = {}

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        create_kwargs = kwargs.get("create_kwargs") or {}
        instance_id = instance_id or str(uuid.uuid4())
        value = create_kwargs.get("value")
        if value is None:
            raise ValueError(
                "the lookup tool needs the row's extra_info.tools_kwargs.lookup.create_kwargs "
                "{value} (verl_npu.data.tool_lookup writes it)"
            )
        self._codes[instance_id] = str(value)
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        return ToolResponse(text=self._codes[instance_id]), 1.0, {}

    async def release(self, instance_id: str, **kwargs) -> None:
        self._codes.pop(instance_id, None)
