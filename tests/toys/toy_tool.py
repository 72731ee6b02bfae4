"""A newcomer's tool, in one file: replies with its text argument reversed. Registered by naming this file in
$VERL_NPU_PLUGINS; a tool config file names it `class_name: toy_reverse`."""

from verl_npu.registry import TOOLS
from verl_npu.tools import BaseTool, ToolResponse

SCHEMA = {
    "type": "function",
    "function": {
        "name": "reverse_text",
        "description": "Reverses a text.",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string", "description": "the text"}},
            "required": ["text"],
        },
    },
}


@TOOLS.register("toy_reverse", function_name="reverse_text", doc="replies with the text reversed (a test's toy)")
class ToyReverseTool(BaseTool):
    def __init__(self, config: dict, tool_schema=None):
        super().__init__(config, tool_schema or SCHEMA)

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=str(parameters.get("text", ""))[::-1]), 0.0, {}
