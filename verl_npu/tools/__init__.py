"""Tools a multi-turn rollout calls (verl's tool interface), built-in tools, and loading them from a tool
config file (`verl_npu.tool_registry` reads the file; `loading` imports the classes and builds them).

Built-in: `gsm8k` (the GSM8K answer check), `code_interpreter` / `retool_code_interpreter` (Python run in
a sandbox: `sandbox`, `sandbox_boot`), `search` (Search-R1's search tool over HTTP: `search`; a local server
for it: `retrieval_server`). Python functions as tools: `function_tool` (verl's `@function_tool`,
`multi_turn.function_tool_path`).

A tool written for verl ports by changing its import::

    from verl_npu.tools import BaseTool, OpenAIFunctionToolSchema, ToolResponse

(docs/agents.md, "Writing a tool").
"""

from verl_npu.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolResponse

__all__ = ["BaseTool", "OpenAIFunctionToolSchema", "ToolResponse"]
