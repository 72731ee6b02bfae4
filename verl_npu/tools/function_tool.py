"""Python functions as tools (verl 0.9.1's `@function_tool`, `multi_turn.function_tool_path`).

A file named by `actor_rollout_ref.rollout.multi_turn.function_tool_path` decorates plain or `async`
functions; each becomes a tool next to those of the tool config file (a name used by both is refused)::

    from verl_npu.tools.function_tool import function_tool     # verl: from verl.tools.function_tool import ...

    @function_tool
    def add(a: int, b: int) -> str:
        \"\"\"Add two integers.

        Args:
            a: The first number.
            b: The second number.
        \"\"\"
        return str(a + b)

The tool's OpenAI schema is read from the signature and the Google-style docstring (transformers'
`get_json_schema`: every parameter needs a type hint and an `Args:` line), or given whole with
`@function_tool(schema={...})`; `@function_tool("name")` renames it. A call runs the function with the
call's arguments as keyword arguments; its return value becomes the tool turn as in verl: a `ToolResponse`
as it is, a string as the text, a dict as its JSON, a tuple `(response,)`, `(response, reward)` or
`(response, reward, metrics)`, anything else as `str(value)`. A function that raises, or a call with
arguments the function does not take, is an error message in the conversation (the agent loop's).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import inspect
import json
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib import util as importlib_util
from pathlib import Path
from typing import Any

from verl_npu.errors import UserError
from verl_npu.tools.base import BaseTool, ToolResponse

KEY = "actor_rollout_ref.rollout.multi_turn.function_tool_path"


@dataclass
class FunctionTool:
    """One decorated function: its tool name, the function, its OpenAI schema (a dict)."""

    name: str
    fn: Callable[..., Any]
    tool_schema: dict
    is_async: bool = False


#: the functions decorated while a function_tool_path file is loaded (load_function_tools collects them)
_COLLECTING: list[list[FunctionTool]] = []


def function_tool(name: str | Callable | None = None, *, schema: dict | None = None):
    """Mark a function as a tool (module docstring). Bare (`@function_tool`), renamed
    (`@function_tool("name")`) or with a whole schema (`@function_tool(schema={...})`). The schema is built
    when the decorator runs, so a function it cannot describe fails at load time, naming the function."""

    def decorate(fn: Callable, tool_name: str | None) -> Callable:
        tool_name = tool_name or fn.__name__
        built = copy.deepcopy(dict(schema)) if schema is not None else _schema_of(fn, tool_name)
        built.setdefault("function", {})["name"] = tool_name
        tool = FunctionTool(tool_name, fn, built, inspect.iscoroutinefunction(fn))
        if _COLLECTING:
            _COLLECTING[-1].append(tool)
        fn.__function_tool__ = tool  # so that a file imported outside a load still finds its tools
        return fn

    if callable(name) and schema is None:
        return decorate(name, None)
    return lambda fn: decorate(fn, name)


def _schema_of(fn: Callable, tool_name: str) -> dict:
    from transformers.utils import get_json_schema

    variadic = [
        p
        for p, v in inspect.signature(fn).parameters.items()
        if v.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if variadic:
        raise ValueError(
            f"@function_tool {tool_name!r}: parameters {variadic} (*args / **kwargs) cannot be written "
            "in an OpenAI tool schema; name every parameter"
        )
    try:
        return get_json_schema(fn)
    except Exception as err:  # transformers' DocstringParsingException / TypeHintParsingException
        raise ValueError(
            f"@function_tool {tool_name!r}: its schema cannot be read from the function ({err}); give "
            "every parameter a type hint and a line under 'Args:' in a Google-style docstring, or pass "
            "schema={...}"
        ) from None


def tool_result(value: Any) -> tuple[ToolResponse, float, dict]:
    """(response, step reward, metrics) of a function's return value (verl's rules, module docstring)."""
    if isinstance(value, tuple):
        if not 1 <= len(value) <= 3:
            raise TypeError(
                f"a function tool returned a tuple of {len(value)} values; return (response,), "
                "(response, reward) or (response, reward, metrics)"
            )
        response = tool_result(value[0])[0]
        reward = 0.0 if len(value) < 2 or value[1] is None else float(value[1])
        metrics = {} if len(value) < 3 or value[2] is None else dict(value[2])
        return response, reward, metrics
    if isinstance(value, ToolResponse):
        return value, 0.0, {}
    if isinstance(value, dict):
        return ToolResponse(text=json.dumps(value, ensure_ascii=False)), 0.0, {}
    return ToolResponse(text=value if isinstance(value, str) else str(value)), 0.0, {}


class FunctionToolAdapter(BaseTool):
    """A FunctionTool behind the tool interface the agent loop calls (create / execute / release)."""

    def __init__(self, tool: FunctionTool):
        super().__init__({}, tool.tool_schema)
        self.function = tool

    async def create(self, instance_id: str | None = None, **kwargs):
        return instance_id or str(uuid.uuid4()), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs):
        fn = self.function.fn
        if self.function.is_async:
            value = await fn(**parameters)
        else:
            value = await asyncio.to_thread(fn, **parameters)
        return tool_result(value)


def load_function_tools(path: str | Path) -> dict[str, FunctionToolAdapter]:
    """name -> tool for every `@function_tool` of the file at `path`. Raises UserError naming the file when it
    does not exist, fails to import (a function whose schema cannot be read included), declares a name twice
    or declares no tool."""
    file = Path(path).expanduser()
    file = file if file.is_absolute() else Path.cwd() / file
    if not file.is_file():
        raise UserError(
            f"{KEY}: file {str(file)!r} does not exist; point it at a .py file with @function_tool "
            "functions (docs/agents.md, 'Function tools')"
        )
    name = "verl_npu_function_tools_" + hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]
    spec = importlib_util.spec_from_file_location(name, file)
    module = importlib_util.module_from_spec(spec)
    found: list[FunctionTool] = []
    _COLLECTING.append(found)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(name, None)
        raise UserError(f"{KEY}: importing {file} failed: {type(err).__name__}: {err}") from None
    finally:
        _COLLECTING.pop()
    if not found:  # imported before (sys.modules): the decorated functions carry their tools
        found = [v.__function_tool__ for v in vars(module).values() if hasattr(v, "__function_tool__")]
    tools: dict[str, FunctionToolAdapter] = {}
    for tool in found:
        if tool.name in tools:
            raise UserError(f"{KEY}: {file} declares the function tool {tool.name!r} twice; rename one")
        tools[tool.name] = FunctionToolAdapter(tool)
    if not tools:
        raise UserError(
            f"{KEY}: {file} declares no tool; decorate its functions with @function_tool "
            "(from verl_npu.tools.function_tool import function_tool)"
        )
    return tools
