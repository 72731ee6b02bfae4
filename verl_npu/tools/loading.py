"""Building the tools of a tool config file: import each class (built-in, the user's file, or a module),
construct it with the entry's `config` and `tool_schema`, and check the result.

Every problem is a `UserError` raised before any worker starts, naming the file and the entry's key
(`tools[1].class_name`) and what to do: a file of the wrong shape, a class that does not exist or is not
a tool, a constructor that fails, a schema whose name differs from the one the class declares, two tools
with one name. `run_method` calls a tool method that may be plain or `async def`, within a deadline.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import signal
import threading
from pathlib import Path
from typing import Any

from verl_npu.errors import UserError
from verl_npu.registry import TOOLS
from verl_npu.registry.core import load_file
from verl_npu.tool_registry import BUILTIN_FUNCTION_NAMES, ToolEntry, class_target, read_tool_config

KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
TOOL_METHODS = ("create", "execute", "release")


def named_class(
    target: tuple[str, str, str],
    entry_where: str,
    class_name: str,
    config_key: str,
    methods: tuple[str, ...],
    what: str,
    how: str,
) -> type:
    """The class a tool or interaction entry names (`target`: its class_target), with `methods`.
    Raises UserError naming the entry (`entry_where`) when it cannot be imported or is not `what`
    (`how`: how to make one)."""
    kind, where, cls = target
    try:
        if kind == "file":
            path = Path(os.path.expanduser(where))
            module = load_file(path if path.is_absolute() else Path.cwd() / path)
        else:
            module = importlib.import_module(where)
    except Exception as err:  # the user's module failed to import: its error, named
        raise UserError(
            f"{entry_where}.class_name: importing {where!r} failed: {type(err).__name__}: {err}. "
            f"Fix the module (or the class_name in {config_key})"
        ) from None
    found = class_of(module, where, cls, f"{entry_where}.class_name")
    missing = [m for m in methods if not callable(getattr(found, m, None))]
    if missing:
        raise UserError(
            f"{entry_where}.class_name: {class_name!r} is not {what}: it has no {', '.join(missing)} method(s). {how}"
        )
    return found


def class_of(module, where: str, cls: str, key: str) -> type:
    """The class `cls` of `module` (imported from `where`); raises UserError at `key` naming the classes
    the module has when it has no such class."""
    found = getattr(module, cls, None)
    if not isinstance(found, type):
        have = sorted(n for n, v in vars(module).items() if isinstance(v, type) and not n.startswith("_"))
        raise UserError(
            f"{key}: {where!r} has no class {cls!r} (classes there: {', '.join(have) or 'none'}); "
            f"fix {key.rpartition('.')[2]}"
        )
    return found


def tool_class(entry: ToolEntry) -> type:
    """The class an entry names: a registered tool's (the package's, or a $VERL_NPU_PLUGINS file's) from its
    registry; else the user's class. Raises UserError naming the entry when it cannot be imported."""
    if entry.builtin:
        return TOOLS.load(entry.builtin)
    return named_class(
        class_target(entry.class_name),
        entry.where,
        entry.class_name,
        KEY,
        TOOL_METHODS,
        "a tool",
        "Subclass verl_npu.tools.BaseTool (docs/agents.md)",
    )


def build_tool(entry: ToolEntry):
    """The tool object of one entry, its schema checked against the class's own."""
    cls = tool_class(entry)
    try:
        tool = cls(config=dict(entry.config), tool_schema=entry.schema)
    except Exception as err:
        raise UserError(
            f"{entry.where}: constructing {entry.class_name!r} failed: {type(err).__name__}: {err}. "
            "Fix its config / tool_schema"
        ) from None
    schema = getattr(tool, "tool_schema", None)
    dump = schema.model_dump() if hasattr(schema, "model_dump") else schema
    name = ((dump or {}).get("function") or {}).get("name")
    if not name:
        raise UserError(
            f"{entry.where}.tool_schema: {entry.class_name!r} has no schema with a function name; "
            "give the entry a tool_schema (type: function, function: {name, description, parameters})"
        )
    declared = getattr(cls, "name", None) if isinstance(getattr(cls, "name", None), str) else None
    if entry.builtin:
        declared = BUILTIN_FUNCTION_NAMES[entry.builtin]
    if declared and entry.name and declared != entry.name:
        raise UserError(
            f"{entry.where}.tool_schema.function.name: is {entry.name!r} but {entry.class_name!r} is "
            f"the tool {declared!r}; use name: {declared}"
        )
    tool.name = name
    return tool


def checked_entries(read, key: str, path) -> list:
    """The entries `read(path)` returns; a UserError listing every problem of the file (at `key`) if it has any."""
    entries, problems = read(path)
    if problems:
        raise UserError(
            f"{key} ({path}) has {len(problems)} problem(s):\n"
            + "\n".join(f"  {where}: {what}" for where, what in problems)
        )
    return entries


def load_tools(path: str | os.PathLike | None, function_tool_path: str | os.PathLike | None = None) -> dict[str, Any]:
    """name -> tool, for every entry of the tool config file `path` and every `@function_tool` of the file
    `function_tool_path` (multi_turn.function_tool_path; either may be None). Raises UserError listing every
    shape problem of the tool config file, or the first entry that cannot be built, or a name both files use."""
    entries = checked_entries(read_tool_config, KEY, path) if path else []
    tools: dict[str, Any] = {}
    for entry in entries:
        tool = build_tool(entry)
        if tool.name in tools:
            raise UserError(f"{entry.where}: the tool name {tool.name!r} is used twice; tool names must be unique")
        tools[tool.name] = tool
    if function_tool_path:
        from verl_npu.tools.function_tool import KEY as FUNCTION_KEY
        from verl_npu.tools.function_tool import load_function_tools

        functions = load_function_tools(function_tool_path)
        both = sorted(set(functions) & set(tools))
        if both:
            raise UserError(
                f"{FUNCTION_KEY} ({function_tool_path}) declares tool name(s) {both}, which {KEY} "
                f"({path}) declares too; tool names must be unique across the two files: rename one"
            )
        tools.update(functions)
    return tools


def tool_schema_dict(tool) -> dict:
    schema = tool.tool_schema
    return schema.model_dump() if hasattr(schema, "model_dump") else dict(schema)


#: seconds a tool method may take before its call becomes an error message (a tool's `call_timeout`
#: attribute, or its config's `call_timeout`, overrides it)
CALL_TIMEOUT_S = 600.0


def call_timeout(tool) -> float | None:
    """The deadline of one method call of `tool`: its `call_timeout` attribute, else its config's
    `call_timeout`, else CALL_TIMEOUT_S; 0 or a negative value: none."""
    value = getattr(tool, "call_timeout", None)
    if value is None:
        config = getattr(tool, "config", None)
        value = config.get("call_timeout") if isinstance(config, dict) else None
    value = CALL_TIMEOUT_S if value is None else float(value)
    return value if value > 0 else None


class ToolTimeout(Exception):
    """A tool method ran past its deadline (the agent loop turns it into the call's error message)."""


class ToolRaised(Exception):
    """A tool, interaction or environment method raised a BaseException that is not an Exception
    (SystemExit, KeyboardInterrupt, GeneratorExit, CancelledError, ...): handed to the loop as an ordinary
    error, so that user code cannot end the run that way. `raised` is the original. A real Ctrl-C never
    arrives here: user code runs in its own threads, and SIGINT goes to the main thread."""

    def __init__(self, raised: BaseException):
        super().__init__(f"{type(raised).__name__}: {raised}")
        self.raised = raised


def _settle(loop, future, setter, value):
    def settle():
        if not future.done():
            setter(value)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is gone: nobody waits any more
        pass


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _without_stop_signals(target):
    """`target`, to run in a thread of its own with SIGINT and SIGTERM blocked there: the kernel then hands a Ctrl-C
    or a SIGTERM to the main thread, where Python runs signal handlers. Taken by a tool's thread, the signal would
    only be flagged, and acted on when the main thread next ran Python: its event loop may sleep in select for as
    long as a call's timeout."""

    def run():
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        target()

    return run


def _in_thread(method, args, kwargs):
    """Run a plain method in a daemon thread; a future the caller can stop waiting for. A method that
    never returns keeps its thread, never the rollout."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def work():
        try:
            _settle(loop, future, future.set_result, method(*args, **kwargs))
        except Exception as err:  # noqa: BLE001 - handed to the awaiting side
            _settle(loop, future, future.set_exception, err)
        except BaseException as err:  # noqa: BLE001 - SystemExit & co. of user code: an ordinary error
            _settle(loop, future, future.set_exception, ToolRaised(err))

    name = f"tool-{getattr(method, '__name__', 'call')}"
    threading.Thread(target=_without_stop_signals(work), daemon=True, name=name).start()
    return future


_OWNER_LOOPS: dict[int, tuple[Any, asyncio.AbstractEventLoop]] = {}
_OWNER_LOOPS_LOCK = threading.Lock()


def _owner_loop(owner) -> asyncio.AbstractEventLoop:
    """The event loop, in a daemon thread of its own, that runs `owner`'s async methods: one that blocks
    (a busy loop in an `async def execute`) stalls only that tool, never the agent loop or other tools;
    its state (sessions, connections) lives on one loop for the whole run."""
    with _OWNER_LOOPS_LOCK:
        held = _OWNER_LOOPS.get(id(owner))
        if held is None or held[0] is not owner or held[1].is_closed():
            loop = asyncio.new_event_loop()
            name = getattr(owner, "name", type(owner).__name__)
            threading.Thread(
                target=_without_stop_signals(loop.run_forever), daemon=True, name=f"tool-loop-{name}"
            ).start()
            held = _OWNER_LOOPS[id(owner)] = (owner, loop)
        return held[1]


async def _guarded(awaitable):
    try:
        return await awaitable
    except Exception:
        raise
    except BaseException as err:  # noqa: BLE001 - SystemExit & co. of user code: an ordinary error
        raise ToolRaised(err) from None


def _on_own_loop(owner, awaitable):
    """A future (of the caller's loop) for `awaitable` run on `owner`'s own loop (`_owner_loop`)."""
    return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_guarded(awaitable), _owner_loop(owner)))


async def run_method(method, *args, **kwargs):
    """Call a tool (or interaction) method that may be plain or `async def` (or return an awaitable),
    within the owner's `call_timeout` (raises ToolTimeout past it). Plain methods run in threads, async
    ones on the owner's own event loop in its own thread (`_owner_loop`), so that one that never returns
    or blocks is left behind instead of blocking the rollout. Whatever the method raises arrives as an
    Exception (`ToolRaised` for SystemExit and the like)."""
    owner = getattr(method, "__self__", None)
    timeout = call_timeout(owner) if owner is not None else CALL_TIMEOUT_S
    if inspect.iscoroutinefunction(method):
        pending = _on_own_loop(owner, method(*args, **kwargs))
    else:
        pending = _in_thread(method, args, kwargs)
    try:
        result = await asyncio.wait_for(pending, timeout)
        if inspect.isawaitable(result):
            result = await asyncio.wait_for(_on_own_loop(owner, result), timeout)
    except asyncio.TimeoutError:
        name = getattr(owner, "name", type(owner).__name__)
        raise ToolTimeout(
            f"{getattr(method, '__name__', 'the call')} of tool {name!r} did not return within {timeout:g} s"
        ) from None
    return result
