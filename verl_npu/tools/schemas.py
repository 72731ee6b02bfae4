"""verl's module path of the tool schema classes: `from verl.tools.schemas import OpenAIFunctionToolSchema,
ToolResponse` ports as `from verl_npu.tools.schemas import ...`."""

from verl_npu.tools.base import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["OpenAIFunctionToolSchema", "ToolResponse"]
