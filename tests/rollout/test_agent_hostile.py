"""The agent loop under a hostile model and careless tools (issue 36): whatever the policy writes, and
whatever a user's tool raises or blocks on, becomes an error turn; nothing leaves `AgentLoop.run`.

The loop here is the real one (`AgentLoop.run`: turns appended, calls parsed, tools run, turns rendered
by a real chat template and tokenizer, rows built); only the model is replaced by a `TurnBackend` that
writes the given texts (the tokens a policy could sample), so no forward pass is needed."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest
import torch
from test_agent_loop import left_padded

from verl_npu.config.typed import section
from verl_npu.rollout.agent_loop import MULTI_TURN, AgentLoop, TurnBackend
from verl_npu.rollout.base import SamplingParams
from verl_npu.rollout.tool_calls import MAX_CALLS, MAX_DEPTH, parse_hermes, tool_call_metrics
from verl_npu.tools.base import BaseTool, ToolResponse


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from verl_npu.models.tiny import materialize

    return AutoTokenizer.from_pretrained(materialize("tiny://qwen2"))


def schema(name: str) -> dict:
    return {
        "type": "function",
        "function": {"name": name, "description": "d", "parameters": {"type": "object", "properties": {}}},
    }


class Echo(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="echo:" + json.dumps(parameters)[:50]), 0.0, {}


class Exits(BaseTool):
    def execute(self, instance_id, parameters, **kwargs):
        raise SystemExit(3)


class AsyncExits(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        raise SystemExit(4)


class FakeCtrlC(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        raise KeyboardInterrupt


class BusyAsync(BaseTool):
    """A blocking `async def execute`: a busy loop that never yields to its event loop."""

    async def execute(self, instance_id, parameters, **kwargs):
        end = time.monotonic() + 6
        while time.monotonic() < end:
            pass
        return ToolResponse(text="late"), 0.0, {}


class Scripted(TurnBackend):
    """Writes texts[uid][turn] (its tokens, then the end-of-turn token) for each trajectory."""

    def __init__(self, tokenizer, eos: int, texts: dict[str, list[str]]):
        self.tokenizer, self.eos, self.texts = tokenizer, eos, texts

    def next_turns(self, active, params, budget, record):
        if not active:
            return None
        out = []
        for t in active:
            script = self.texts[t.uid.split("#")[0]]
            text = script[min(t.assistant_turns, len(script) - 1)]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.eos]
            out.append((ids[: budget - len(t.response)], None))
        return out


def run_loop(tokenizer, tools: dict, texts: dict[str, list[str]], budget: int = 6000, **settings):
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    loop = AgentLoop(
        None,
        tokenizer,
        tools,
        section(MULTI_TURN, {"max_parallel_calls": 8, **settings}),
        eos_ids=[eos],
        pad_id=tokenizer.pad_token_id or 0,
        turns=Scripted(tokenizer, eos, texts),
    )
    uids = list(texts)
    rows = [
        tokenizer(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": "go"}], tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        )["input_ids"]
        for _ in uids
    ]
    batch = left_padded(rows, loop.pad_id, max(len(r) for r in rows), uid=uids, extra_info=[{} for _ in uids])
    return loop.run(batch, SamplingParams(max_new_tokens=budget))


def call(name: str, args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


# ------------------------------------------------------------------ parsing
def test_a_thousand_nested_brackets_are_an_error_call_not_a_recursion_error():
    deep = "[" * 1000 + "]" * 1000
    for body in (
        '{"name": "echo", "arguments": {"x": ' + deep + "}}",
        '{"name": "echo", "arguments": ' + json.dumps('{"x": ' + deep + "}") + "}",  # arguments as a string
        deep,
        "{" * 100000,
    ):
        calls = parse_hermes(f"<tool_call>{body}</tool_call>")
        assert len(calls) == 1 and calls[0].error and calls[0].arguments is None
    assert f"deeper than {MAX_DEPTH}" in parse_hermes(f"<tool_call>{deep}</tool_call>")[0].error
    nested = lambda d: json.loads("[" * d + "]" * d)  # noqa: E731
    # the call's object and its arguments are 2 levels: at the limit it is read, one deeper it is not
    assert parse_hermes(call("echo", {"x": nested(MAX_DEPTH - 2)}))[0].error is None
    assert parse_hermes(call("echo", {"x": nested(MAX_DEPTH - 1)}))[0].error


def test_hostile_json_size_numbers_unicode_and_count_are_bounded():
    assert (
        "is not usable JSON"
        in parse_hermes('<tool_call>{"name": "e", "arguments": {"n": ' + "9" * 5000 + "}}</tool_call>")[0].error
    )  # past Python's int digit limit
    assert "not valid Unicode" in parse_hermes('<tool_call>{"name": "e\\ud800", "arguments": {}}</tool_call>')[0].error
    assert "characters long" in parse_hermes(call("echo", {"x": "y" * 200_000}))[0].error
    assert len(parse_hermes(call("echo", {}) * 5000)) == MAX_CALLS
    t0 = time.monotonic()  # many openings without a closing tag: one linear scan, no backtracking
    assert parse_hermes("<tool_call>{" * 200_000) == []
    assert time.monotonic() - t0 < 2


# ------------------------------------------------------------------ the loop
def test_user_tools_raising_systemexit_or_blocking_their_event_loop_become_error_turns(tokenizer):
    """SystemExit from a sync or async tool, a KeyboardInterrupt a tool raises itself, and a busy loop in
    an async tool past its call_timeout: each an error turn, the run goes on, and the busy tool does not
    block the others (the whole round takes about its call_timeout, not the 6 s it busies)."""
    tools = {
        "echo": Echo({}, schema("echo")),
        "exits": Exits({}, schema("exits")),
        "async_exits": AsyncExits({}, schema("async_exits")),
        "ctrl_c": FakeCtrlC({}, schema("ctrl_c")),
        "busy": BusyAsync({"call_timeout": 1}, schema("busy")),
    }
    first = "".join(call(n, {}) for n in ("exits", "async_exits", "ctrl_c", "busy", "echo"))
    t0 = time.monotonic()
    out = run_loop(tokenizer, tools, {"q": [first, "done"]})
    took = time.monotonic() - t0
    records = out["agent_turns"][0][1]["calls"]
    errors = [r.get("error") for r in records]
    assert errors[0] == "Error executing tool 'exits': SystemExit: 3"
    assert errors[1] == "Error executing tool 'async_exits': SystemExit: 4"
    assert errors[2] == "Error executing tool 'ctrl_c': KeyboardInterrupt: "
    assert "ToolTimeout: execute of tool 'busy' did not return within 1 s" in errors[3]
    assert errors[4] is None and records[4]["result"].startswith("echo:")
    assert out["agent_turns"][0][-1]["text"].startswith("done")
    assert took < 5, f"the round took {took:.1f} s: the busy tool blocked the loop"
    metrics = tool_call_metrics(out["agent_turns"])
    assert metrics["tool_calls/exits/error_ratio"] == 1.0 and metrics["tool_calls/echo/error_ratio"] == 0.0


def test_a_tool_that_keeps_failing_is_reported(tokenizer, caplog):
    from verl_npu.trainer.summary import tool_lines

    tools = {"exits": Exits({}, schema("exits")), "echo": Echo({}, schema("echo"))}
    texts = {f"q{i}": [call("exits", {}) * 4 + call("echo", {}), "done"] for i in range(6)}
    with caplog.at_level("WARNING"):
        out = run_loop(tokenizer, tools, texts)
    assert "tool 'exits' keeps failing: its last 20 calls failed" in caplog.text
    metrics = tool_call_metrics(out["agent_turns"])
    assert metrics["tool_calls/exits/count"] == 24 and metrics["tool_calls/exits/error_ratio"] == 1.0
    lines = tool_lines([metrics])
    assert len(lines) == 1 and "mostly failed in the last step that called them: exits" in lines[0]
    assert "UNSAFE" in tool_lines([{"tool_calls/unsafe_sandbox": 3.0}])[0]


def test_calls_of_no_known_tool_are_not_called_a_failing_tool():
    """An unreadable call or an unknown name is the model's mistake: the summary counts them on a line of their own
    (from the last step with tool calls), and does not list "(unknown)" among the failing tools."""
    from verl_npu.trainer.summary import tool_lines

    early = tool_call_metrics([[{"calls": [{"name": "nope", "known": False, "error": "Error: unknown tool"}] * 3}]])
    last = tool_call_metrics(
        [[{"calls": [{"name": "echo", "known": True}] * 5 + [{"name": None, "known": False, "error": "bad"}]}]]
    )
    assert early["tool_calls/(unknown)/error_ratio"] == 1.0
    lines = tool_lines([early, last])
    assert len(lines) == 1, lines
    assert "named no known tool or could not be read, in the last step with tool calls: 1 of 6" in lines[0]
    assert tool_lines([early, tool_call_metrics([[{"calls": [{"name": "echo", "known": True}]}]])]) == []


ADVERSARIAL = [
    "[" * 1000,
    "{" * 1000 + "}" * 1000,
    "[" * 1000 + "]" * 1000,
    '"' * 500,
    "\\" * 500,
    "\x00\x01\x7f",
    '{"name": "echo", "arguments": ' + "[" * 1000 + "]" * 1000 + "}",
    '{"name": "echo", "arguments": "[[[["}',
    '{"name": "echo", "arguments": {"n": ' + "7" * 6000 + "}}",
    '{"name": "\\ud800", "arguments": {}}',
    '{"name": "echo", "arguments": {"s": "\\udfff\\ud800"}}',
    '{"name": "' + "n" * 5000 + '", "arguments": {}}',
    '{"name": null, "arguments": []}',
    "[]",
    "1e999999",
    "NaN",
    '{"name": "echo", "arguments": {"a": NaN}}',
    '{"name": "echo", "arguments": {"a": 1}, "name": "exits"}',
    "\ufeff{}",
    "é" * 300,
    "🙂" * 200,
    '{"name": "echo", "arguments": {"k": "' + "x" * 3000 + '"}}',
    '{"name": "echo", "arguments": "{\\"a\\": [' + "1," * 500 + '1]}"}',
]


def fuzz_text(rng: random.Random, tokenizer) -> str:
    kind = rng.randrange(5)
    if kind == 0:  # random tokens, as a policy early in training writes them
        return tokenizer.decode([rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 300))])
    if kind == 1:  # many calls, some cut off
        calls = "".join(f"<tool_call>{rng.choice(ADVERSARIAL)}</tool_call>" for _ in range(rng.randrange(1, 100)))
        return calls[: rng.randrange(len(calls) + 1)] if rng.random() < 0.3 else calls
    if kind == 2:  # a valid call with random JSON-ish noise spliced in
        text = call(rng.choice(["echo", "exits", "nope"]), {"x": rng.random()})
        pos = rng.randrange(len(text))
        return text[:pos] + rng.choice(ADVERSARIAL)[:200] + text[pos:]
    if kind == 3:  # random bytes decoded leniently, inside a call
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
        return "<tool_call>" + raw.decode("utf-8", errors="replace") + "</tool_call>"
    return f"<tool_call>{rng.choice(ADVERSARIAL)}</tool_call>" + "<tool_call>" * rng.randrange(3)


def test_fuzzed_model_outputs_never_raise_out_of_the_loop(tokenizer):
    """Random and adversarial model outputs (nesting, size, encodings, many calls) for a few seconds of
    rounds: every one ends as rows, none as an exception."""
    tools = {"echo": Echo({}, schema("echo")), "exits": Exits({}, schema("exits"))}
    rng = random.Random(36)
    deadline = time.monotonic() + 6
    batches = turns = 0
    while time.monotonic() < deadline:
        texts = {f"f{i}": [fuzz_text(rng, tokenizer) for _ in range(3)] for i in range(4)}
        out = run_loop(tokenizer, tools, texts, budget=3000, max_assistant_turns=3)
        assert len(out["agent_turns"]) == 4 and isinstance(out["responses"], torch.Tensor)
        batches += 1
        turns += sum(len(t) for t in out["agent_turns"])
    assert batches >= 3 and turns > batches * 4


def test_the_loop_runs_async_tools_on_their_own_loop_between_rounds(tokenizer):
    """State an async tool keeps (here: the event loop it first ran on) lives across rounds, as each
    round's asyncio.run used to discard it."""
    seen = []

    class Stateful(BaseTool):
        async def execute(self, instance_id, parameters, **kwargs):
            seen.append(asyncio.get_running_loop())
            return ToolResponse(text="ok"), 0.0, {}

    tools = {"stateful": Stateful({}, schema("stateful"))}
    run_loop(tokenizer, tools, {"q": [call("stateful", {}), call("stateful", {}), "done"]})
    assert len(seen) == 2 and seen[0] is seen[1]


CTRL_C = """
import asyncio, signal, sys, time
# as a user's foreground process has it: started from a background job (`pytest ... &`) SIGINT comes in ignored, and
# Python then installs no Ctrl-C handler
signal.signal(signal.SIGINT, signal.default_int_handler)
from verl_npu.config.typed import section
from verl_npu.rollout.agent_loop import MULTI_TURN, AgentLoop, ToolCall, Trajectory
from verl_npu.tools.base import BaseTool, ToolResponse

class Slow(BaseTool):
    def execute(self, instance_id, parameters, **kwargs):
        print("ready", flush=True)
        time.sleep(600)
        return ToolResponse(text="late"), 0.0, {}

schema = {"type": "function", "function": {"name": "slow", "description": "d",
                                           "parameters": {"type": "object", "properties": {}}}}
loop = AgentLoop.__new__(AgentLoop)
loop.tools, loop.settings = {"slow": Slow({"call_timeout": 900}, schema)}, section(MULTI_TURN, {})
try:
    print(asyncio.run(loop._call(Trajectory([1], "u#0", {}), ToolCall("slow", {}))))
except KeyboardInterrupt:
    print("stopped by Ctrl-C", flush=True)
    sys.exit(130)
"""


def test_a_real_ctrl_c_still_stops_the_loop_while_a_tool_runs():
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # a hang shows every thread's stack (SIGABRT below)
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            out, err = proc.communicate(timeout=30)
            raise AssertionError(f"no exit 120 s after SIGINT; the child's threads:\n{err[-6000:]}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "stopped by Ctrl-C" in out, (out, err[-2000:])
    assert time.monotonic() - t0 < 120  # long before the tool (600 s) or its deadline (900 s) would end it


def test_tool_threads_leave_ctrl_c_and_sigterm_to_the_main_thread():
    """A plain tool method runs in a thread of its own and an async one on its owner's loop thread: both block SIGINT
    and SIGTERM there, so the kernel hands a Ctrl-C (or a scheduler's SIGTERM) to the main thread, where Python runs
    signal handlers (taken by another thread, a signal is only flagged until the main thread next runs Python)."""
    import signal

    from verl_npu.tools.loading import run_method

    class Masks(BaseTool):
        def execute(self, instance_id, parameters, **kwargs):
            return signal.pthread_sigmask(signal.SIG_BLOCK, set())

        async def release(self, instance_id, **kwargs):
            return signal.pthread_sigmask(signal.SIG_BLOCK, set())

    tool = Masks({}, schema("masks"))
    plain = asyncio.run(run_method(tool.execute, "i", {}))
    on_loop = asyncio.run(run_method(tool.release, "i"))
    for blocked in (plain, on_loop):
        assert {signal.SIGINT, signal.SIGTERM} <= set(blocked), blocked
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())  # the main thread's is untouched
