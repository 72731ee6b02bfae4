"""verl's module path of `BaseTool`: `from verl.tools.base_tool import BaseTool` ports as
`from verl_npu.tools.base_tool import BaseTool`."""

from verl_npu.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolResponse

__all__ = ["BaseTool", "OpenAIFunctionToolSchema", "ToolResponse"]
