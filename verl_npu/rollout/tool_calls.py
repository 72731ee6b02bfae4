"""The model's tool calls, read as untrusted input, and what the loop reports about the tools.

`parse_hermes` finds the Hermes calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) of a
turn's text with bounded work whatever the model wrote: at most MAX_CALLS calls are read (a linear scan,
no backtracking regular expression), a call longer than MAX_CALL_CHARS characters or nested deeper than
MAX_DEPTH (measured by an iterative scan before any parser sees it, so that ~1,000 brackets cannot reach
the JSON parser's recursion), JSON the parser refuses for any reason (a number past Python's digit
limit included) and text that cannot be encoded as UTF-8 (a lone surrogate from a \\ud800 escape) each
become a call carrying an error message: the loop answers it as an error turn, never an exception.

`tool_call_metrics` summarises a batch's calls per tool for the step's metrics; `ToolHealth` notices a
tool that fails call after call and says so in the log once per streak.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass

log = logging.getLogger(__name__)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALLS = 64  # calls read from one turn (max_parallel_calls then keeps the first ones)
MAX_CALL_CHARS = 1 << 17  # characters of one call's JSON
MAX_DEPTH = 64  # nesting of one call's JSON (objects and arrays)
FAILING_STREAK = 20  # consecutive failed calls of one tool before the log says it keeps failing
UNKNOWN_TOOL = "(unknown)"  # the name metrics give calls of no known tool, or that could not be read
SHAPE = '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'


@dataclass
class ToolCall:
    name: str | None
    arguments: dict | None
    error: str | None = None  # set for a call that could not be parsed


def call_bodies(text: str) -> list[str]:
    """The text between each `<tool_call>` and the next `</tool_call>`, in order, at most MAX_CALLS."""
    bodies: list[str] = []
    pos = 0
    while len(bodies) < MAX_CALLS:
        start = text.find(OPEN, pos)
        if start < 0:
            break
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:  # no closing tag after this one: none after any later opening tag either
            break
        bodies.append(text[start + len(OPEN) : end])
        pos = end + len(CLOSE)
    return bodies


def nesting_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """How deep `[` / `{` nest in JSON text, outside strings; stops counting past `limit` (returns
    limit + 1). Iterative: any depth costs one pass over the text."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return limit + 1
        elif ch in "]}":
            depth -= 1
    return deepest


def _load(text: str) -> tuple[object, str | None]:
    """(the JSON value, None) or (None, why it was refused)."""
    if len(text) > MAX_CALL_CHARS:
        return None, f"is {len(text)} characters long (at most {MAX_CALL_CHARS})"
    if nesting_depth(text) > MAX_DEPTH:
        return None, f"nests deeper than {MAX_DEPTH} levels"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        return None, f"is not valid JSON ({err.msg})"
    except (ValueError, RecursionError, MemoryError) as err:  # e.g. an integer past the digit limit
        return None, f"is not usable JSON ({type(err).__name__}: {str(err)[:120]})"
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return None, "holds text that is not valid Unicode (a lone surrogate escape)"
    return value, None


def parse_call(body: str) -> ToolCall:
    """One call's JSON text as a ToolCall (with an error message when it cannot be used)."""
    obj, why = _load(body)
    if why is not None:
        return ToolCall(None, None, f"Error: the tool call {why}; write {SHAPE}")
    name = obj.get("name") if isinstance(obj, dict) else None
    args = obj.get("arguments", {}) if isinstance(obj, dict) else None
    if isinstance(args, str):  # arguments given as a JSON string
        args, _ = _load(args)
    if not isinstance(name, str) or not isinstance(args, dict):
        return ToolCall(
            name if isinstance(name, str) else None,
            None,
            'Error: a tool call needs "name" (a string) and "arguments" (a JSON object)',
        )
    return ToolCall(name, args)


def parse_hermes(text: str) -> list[ToolCall]:
    """The Hermes tool calls in a turn's text, in order; malformed ones carry an error message. Never
    raises, with bounded work (module docstring)."""
    return [parse_call(body) for body in call_bodies(text)]


def tool_call_metrics(agent_turns: list) -> dict[str, float]:
    """Per tool the batch called: `tool_calls/<name>/count` and `tool_calls/<name>/error_ratio` (the share
    of its calls that became an error message); calls of no known tool (an unknown name, a call that
    could not be read) count under `(unknown)`; `tool_calls/unsafe_sandbox` counts the calls whose code
    ran without an operating-system boundary (`isolation: unsafe_process`), when there were any."""
    calls, errors, unsafe = Counter(), Counter(), 0
    for turns in agent_turns or []:
        for turn in turns or []:
            for record in turn.get("calls") or []:
                name = record.get("name") if record.get("known") else UNKNOWN_TOOL
                calls[name] += 1
                errors[name] += bool(record.get("error"))
                unsafe += record.get("sandbox") == "unsafe_process"
    metrics: dict[str, float] = {}
    for name, count in calls.items():
        metrics[f"tool_calls/{name}/count"] = float(count)
        metrics[f"tool_calls/{name}/error_ratio"] = errors[name] / count
    if unsafe:
        metrics["tool_calls/unsafe_sandbox"] = float(unsafe)
    return metrics


class ToolHealth:
    """Consecutive failed calls per tool, across batches; the log says once per streak that a tool
    keeps failing (its last error), and again when it recovers."""

    def __init__(self, streak: int = FAILING_STREAK):
        self.streak, self.failures = streak, Counter()

    def record(self, name: str, error: str | None) -> None:
        if error is None:
            if self.failures[name] >= self.streak:
                log.warning("tool %r answers again after %d failed calls", name, self.failures[name])
            self.failures[name] = 0
            return
        self.failures[name] += 1
        if self.failures[name] == self.streak:
            log.warning(
                "tool %r keeps failing: its last %d calls failed (tool_calls/%s/error_ratio in the "
                "metrics); the last error: %s",
                name,
                self.streak,
                name,
                error[:300],
            )
