"""The code interpreter's sandbox with real processes (verl_npu.tools.sandbox, issue 25): code cannot
write or read outside its folder, outlive its time limits, leave processes behind, exhaust the host's
memory or open a socket; each under both isolations where it makes the claim (namespaces where this
machine allows them, i.e. as root on Linux; the Python-level process fallback everywhere). And the tool
in a multi-turn rollout: its output is cut to max_tool_response_length, and a tool that hangs or raises
becomes an error message in the conversation."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from verl_npu.tools.code_interpreter import CodeInterpreterTool, retool_code
from verl_npu.tools.loading import load_tools
from verl_npu.tools.sandbox import SandboxLimits, namespaces_work, run_python

# as root on Linux (CI) the namespace sandbox must work: a broken one fails these tests instead of skipping
NEEDS_NS = pytest.mark.skipif(
    not namespaces_work() and not (sys.platform.startswith("linux") and os.geteuid() == 0),
    reason="no namespace sandbox here (needs root, or unprivileged user namespaces)",
)
NS = pytest.param("namespaces", marks=NEEDS_NS)
BOTH = [NS, "unsafe_process"]


def limits(isolation, **kw):
    return SandboxLimits(isolation=isolation, **{"wall_s": 20, "cpu_s": 10, **kw})


def host_processes_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.parametrize("isolation", BOTH)
def test_code_cannot_write_or_read_outside_its_folder(isolation, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-4711")
    target = tmp_path / "written.txt"
    code = f"""
import os, shutil, sys
for attempt in (lambda: open({str(target)!r}, "w").write("x"),
                lambda: open(sys.prefix + "/verl_npu_probe", "w").write("x"),   # the read-only environment
                lambda: open("/usr/verl_npu_probe", "w").write("x"),
                lambda: shutil.copy("/etc/hostname", {str(target)!r}),
                lambda: os.remove({str(secret)!r})):
    try:
        attempt()
        print("WROTE")
    except Exception as e:
        print("refused:", type(e).__name__)
try:
    print(open({str(secret)!r}).read())
except Exception as e:
    print("read refused:", type(e).__name__)
open("mine.txt", "w").write("inside")              # its own folder works
print(open("mine.txt").read(), os.getcwd() == os.environ["HOME"])
"""
    folders = lambda: set(Path(tempfile.gettempdir()).glob("verl_npu_sandbox_*"))  # noqa: E731
    before = folders()
    r = run_python(code, limits(isolation))
    assert folders() <= before  # the run's folder is deleted
    assert r.exit_code == 0, r.output
    assert "WROTE" not in r.output and "TOP-SECRET-4711" not in r.output
    assert "read refused:" in r.output and "inside True" in r.output
    assert not target.exists() and secret.read_text() == "TOP-SECRET-4711"
    assert not Path(sys.prefix, "verl_npu_probe").exists() and not Path("/usr/verl_npu_probe").exists()


@pytest.mark.parametrize("isolation", BOTH)
def test_an_endless_loop_is_stopped_at_the_wall_clock_and_the_cpu_limit(isolation):
    t0 = time.monotonic()
    r = run_python("while True:\n    pass\n", limits(isolation, wall_s=2, cpu_s=60))
    assert r.timed_out and r.exit_code is None and time.monotonic() - t0 < 10
    r = run_python("import time\nwhile True:\n    time.sleep(1)\n", limits(isolation, wall_s=1.5))
    assert r.timed_out and time.monotonic() - t0 < 20
    # the CPU limit (RLIMIT_CPU) ends a busy loop before a long wall clock does
    r = run_python("while True:\n    pass\n", limits(isolation, wall_s=60, cpu_s=1))
    assert not r.timed_out and r.exit_code in (128 + 9, 128 + 24), r  # SIGKILL or SIGXCPU
    assert time.monotonic() - t0 < 50


@NEEDS_NS
def test_no_process_outlives_the_code():
    def sandbox_user_processes():
        return {p for p in filter(str.isdigit, os.listdir("/proc")) if "\nUid:\t65534" in _status(p)}

    before = sandbox_user_processes()
    marker = "31337.25"
    code = f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'])\nprint('left a child')\n"
    r = run_python(code, limits("namespaces"))
    assert "left a child" in r.output and r.exit_code == 0
    time.sleep(0.5)
    assert host_processes_with(f"sleep {marker}") == []
    # a fork bomb hits the process limit and dies with the run's time limit
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_python(bomb, limits("namespaces", wall_s=2, processes=16))
    assert r.timed_out
    time.sleep(0.5)
    assert sandbox_user_processes() - before == set()  # none running, and no zombie left either


def _status(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""


def test_the_process_isolation_refuses_new_processes():
    r = run_python("import subprocess\nsubprocess.run(['true'])\n", limits("unsafe_process"))
    assert r.exit_code == 1 and "PermissionError: the sandbox does not allow subprocess.Popen" in r.output
    assert "sandbox_boot" not in r.output  # the traceback is the code's own


@pytest.mark.parametrize("isolation", BOTH)
def test_ten_gib_fail_cleanly(isolation):
    r = run_python(
        "try:\n    x = bytearray(10 * 2**30)\nexcept MemoryError:\n    print('no memory')\n",
        limits(isolation, memory_mb=512),
    )
    assert r.exit_code == 0 and r.output.strip() == "no memory"


@pytest.mark.parametrize("isolation", BOTH)
def test_code_cannot_open_a_socket(isolation):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = (
        f"import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
        "    print('CONNECTED')\nexcept Exception as e:\n    print('failed:', type(e).__name__)\n"
    )
    r = run_python(code, limits(isolation))
    try:
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()
    assert "CONNECTED" not in r.output and "failed:" in r.output


def test_output_is_capped_while_it_is_read():
    r = run_python(
        "import sys\nfor _ in range(10**6):\n    sys.stdout.write('y' * 100)\n",
        limits("unsafe_process", max_output_bytes=1000),
    )
    assert r.truncated and len(r.output) == 1000 and r.exit_code == 0


# ------------------------------------------------------------------ the tool
def test_verl_sandbox_fusion_config_builds_the_local_interpreter(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("tools.yaml").write_text("""
tools:
  - class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool
    config: {sandbox_fusion_url: "https://example.invalid/run_code", num_workers: 2, enable_global_rate_limit: true,
             rate_limit: 10, default_timeout: 5, default_language: python, memory_limit_mb: 512, type: native}
    tool_schema:
      type: function
      function:
        name: code_interpreter
        description: Run code.
        parameters: {type: object, properties: {code: {type: string, description: code}}, required: [code]}
  - class_name: recipe.retool.retool.CustomSandboxFusionTool
    config: {type: native, isolation: unsafe_process}
    tool_schema:
      type: function
      function:
        name: python
        description: Run code.
        parameters: {type: object, properties: {code: {type: string, description: code}}, required: [code]}
""")
    tools = load_tools("tools.yaml")
    assert tools["python"].run("```python\nx = 6\nx * 7\n```")[0] == "42\n"  # ReTool's preparation
    tool = tools["code_interpreter"]
    assert isinstance(tool, CodeInterpreterTool) and tool.limits.wall_s == 5 and tool.limits.memory_mb == 512
    text, metrics = tool.run("print(6 * 7)")
    assert text == "42\n" and metrics["exit_code"] == 0
    text, metrics = tool.run("import time\ntime.sleep(10)", timeout=1)
    assert metrics["timed_out"] and text.endswith("[stopped: the code ran past its time limit of 1 s]")
    Path("bad.yaml").write_text("tools:\n  - class_name: code_interpreter\n    config: {default_language: cpp}\n")
    from verl_npu.errors import UserError

    with pytest.raises(UserError, match=r"tools\[0\]: constructing 'code_interpreter' failed.*Python only"):
        load_tools("bad.yaml")


def test_retool_code_preparation():
    assert retool_code("Let me compute.\n```python\nx = 3\nx * 2\n```\nthen") == "x = 3\nprint(x * 2)"
    assert retool_code("y = 1\n") == "y = 1\n"  # an assignment is not wrapped
    assert retool_code("print(1)\n\n") == "print(1)\n\n"
    assert retool_code("for i in range(2):\n    i") == "for i in range(2):\n    i"


def test_hanging_and_failing_tools_and_a_long_output_in_a_rollout():
    """The loop's call path (AgentLoop._call): a sync tool and an async tool that never return, a tool
    that raises, and code printing far more than max_tool_response_length: each is one tool message."""
    import asyncio

    from verl_npu.config.typed import section
    from verl_npu.rollout.agent_loop import MULTI_TURN, AgentLoop, ToolCall, Trajectory
    from verl_npu.tools.base import BaseTool

    schema = lambda n: {
        "type": "function",
        "function": {
            "name": n,
            "description": "d",  # noqa: E731
            "parameters": {"type": "object", "properties": {}},
        },
    }

    class SyncHang(BaseTool):
        def execute(self, instance_id, parameters, **kwargs):
            time.sleep(3600)

    class AsyncHang(BaseTool):
        async def execute(self, instance_id, parameters, **kwargs):
            await asyncio.sleep(3600)

    class Raises(BaseTool):
        async def execute(self, instance_id, parameters, **kwargs):
            raise KeyError("no such thing")

    tools = {
        "code_interpreter": CodeInterpreterTool({"default_timeout": 10}),
        "sync_hang": SyncHang({"call_timeout": 1}, schema("sync_hang")),
        "async_hang": AsyncHang({"call_timeout": 1}, schema("async_hang")),
        "raises": Raises({}, schema("raises")),
    }
    loop = AgentLoop.__new__(AgentLoop)  # only the call path: no model needed
    loop.tools, loop.settings = tools, section(MULTI_TURN, {"max_tool_response_length": 200})
    traj = Trajectory([1], "u#0", {})
    calls = [
        ToolCall("code_interpreter", {"code": "print('z' * 5000)"}),
        ToolCall("sync_hang", {}),
        ToolCall("async_hang", {}),
        ToolCall("raises", {}),
        ToolCall("code_interpreter", {"code": 5}),
        ToolCall("code_interpreter", {"code": "import os; os.kill(1, 9)"}),
    ]

    async def all_calls():
        return await asyncio.gather(*(loop._call(traj, c) for c in calls))

    t0 = time.monotonic()
    results = asyncio.run(all_calls())
    assert time.monotonic() - t0 < 30
    texts = [r[0] for r in results]
    assert len(texts[0]) <= 200 + len("...(truncated)...") and "(truncated)" in texts[0] and texts[0].startswith("z")
    assert texts[1] == (
        "Error executing tool 'sync_hang': ToolTimeout: execute of tool 'sync_hang' did not return within 1 s"
    )
    assert "ToolTimeout" in texts[2] and "'async_hang'" in texts[2]
    assert texts[3] == "Error executing tool 'raises': KeyError: 'no such thing'"
    assert texts[4].startswith("Error: the code interpreter needs")
    assert results[1][2]["error"] and results[3][2]["error"]


def test_without_namespaces_a_code_tool_refuses_to_start_unless_unsafe_is_asked_for(tmp_path, monkeypatch):
    """Where the namespaces cannot run (a locked-down kernel or container), `auto` and `namespaces` stop
    the run when the tools are built, naming what is missing and how to get it; only the setting named
    unsafe_process runs code behind the Python-level guards; the old name `process` is refused."""
    import verl_npu.tools.sandbox as sandbox
    from verl_npu.errors import UserError

    monkeypatch.setattr(sandbox, "namespaces_problem", lambda: "unshare: Operation not permitted")
    monkeypatch.chdir(tmp_path)
    for isolation in ("auto", "namespaces"):
        Path("tools.yaml").write_text(
            f"tools:\n  - class_name: code_interpreter\n    config: {{isolation: {isolation}}}\n"
        )
        with pytest.raises(
            UserError,
            match=rf"tools\[0\]: constructing 'code_interpreter' failed: RuntimeError: "
            rf"isolation: {isolation} needs the namespace sandbox.*unshare: Operation "
            r"not permitted. To get it: run the trainer as root.*unsafe_process",
        ):
            load_tools("tools.yaml")
    with pytest.raises(ValueError, match="isolation: process is no boundary.*unsafe_process"):
        CodeInterpreterTool({"isolation": "process"})
    tool = CodeInterpreterTool({"isolation": "unsafe_process"})
    assert tool.isolation == "unsafe_process" and tool.run("print(6 * 7)")[0] == "42\n"
    # each call through the agent loop records it, and the step metrics and the run's summary say so
    import asyncio

    from verl_npu.config.typed import section
    from verl_npu.rollout.agent_loop import MULTI_TURN, AgentLoop, ToolCall, Trajectory
    from verl_npu.rollout.tool_calls import tool_call_metrics
    from verl_npu.trainer.summary import tool_lines

    loop = AgentLoop.__new__(AgentLoop)
    loop.tools, loop.settings = {"code_interpreter": tool}, section(MULTI_TURN, {})
    text, _, record, _ = asyncio.run(
        loop._call(Trajectory([1], "u#0", {}), ToolCall("code_interpreter", {"code": "print(1)"}))
    )
    assert text == "1\n" and record["sandbox"] == "unsafe_process"
    metrics = tool_call_metrics([[{"role": "tool", "calls": [record]}]])
    assert metrics["tool_calls/unsafe_sandbox"] == 1.0
    assert tool_lines([metrics])[0].startswith("  UNSAFE: model-written code ran without an operating-system boundary")


@NEEDS_NS
def test_a_venv_reached_through_a_symlinked_folder_runs_code(tmp_path):
    """A project whose .venv is a symlink (a shared venv, a snapshot of a checkout): the sandbox binds the venv at
    its real path, so the interpreter must be named there too, still as the venv's own (its packages import)."""
    venv = Path(sys.prefix)
    linked = tmp_path / "linked_venv"
    linked.symlink_to(venv, target_is_directory=True)
    python = linked / Path(sys.executable).relative_to(venv) if Path(sys.executable).is_relative_to(venv) else None
    if python is None:
        pytest.skip("the tests' interpreter is not inside sys.prefix (no venv to link)")
    program = (
        "from verl_npu.tools.sandbox import SandboxLimits, run_python\n"
        "r = run_python('import numpy, sys; print(\"numpy\", numpy.__name__, sys.prefix)', "
        "SandboxLimits(isolation='namespaces', wall_s=20, cpu_s=10))\n"
        "print(r.exit_code, r.output)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([str(python), "-c", program], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    code, _, printed = out.stdout.partition(" ")
    assert code == "0", out.stdout
    assert printed.startswith("numpy numpy "), out.stdout
    # the code ran on the venv (its packages), reached at the venv's real folder
    assert printed.split()[2] == os.path.realpath(venv), out.stdout
