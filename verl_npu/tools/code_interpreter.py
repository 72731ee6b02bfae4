"""The Python code interpreter tool: the model sends code, the tool runs it in a fresh sandbox
(`verl_npu.tools.sandbox`) and answers with what it printed (stdout and stderr together).

Tool config `class_name`: `code_interpreter`, or verl's `verl.tools.sandbox_fusion_tools.SandboxFusionTool`
(verl sends the code to a Sandbox Fusion server; verl-npu runs it locally in its own sandbox, Python
only). `retool_code_interpreter`, or the ReTool recipe's `recipe.retool.retool.CustomSandboxFusionTool`,
is the same tool with ReTool's preparation of the code (`retool_code`).

`config` (verl's Sandbox Fusion names where verl has one):

| key | default | meaning |
|---|---|---|
| default_timeout | 30 | wall-clock seconds per run; a call's `timeout` argument may only lower it |
| cpu_time_limit | default_timeout | CPU seconds per run (RLIMIT_CPU) |
| memory_limit_mb | 1024 | address space per run (RLIMIT_AS): a larger allocation raises MemoryError |
| disk_limit_mb | 64 | the sandbox's whole writable filesystem (a tmpfs: working folder + /tmp), and the largest file |
| max_processes | 64 | processes of the sandbox's user (RLIMIT_NPROC) |
| num_workers | 4 | sandboxes of this tool running at once (more calls wait) |
| max_output_bytes | 65536 | output kept from one run (the conversation: max_tool_response_length chars) |
| python_packages | true | the training environment's installed packages (numpy, sympy, ...) are importable, read-only |
| isolation | auto | auto or namespaces: the namespace sandbox, refused with what is missing where it cannot run; unsafe_process: Python-level guards only, no boundary (the run's summary says so) |
| call_timeout | default_timeout + 30 | the agent loop's deadline for one call, waiting for a free worker included |
| default_language | python | only python runs here |
| sandbox_fusion_url, rate_limit, enable_global_rate_limit | | verl's server settings: accepted and unused (no server) |

The reply is the program's output; when it printed nothing, `(no output)`; a run stopped at the wall
clock or killed by a limit says so in a last line, e.g. `[stopped: the code ran past its time limit of
30 s]`. The step reward is 0.0; the metrics are exit_code, timed_out, seconds and isolation.
"""

from __future__ import annotations

import ast
import logging
import re
import threading
import uuid
from typing import Any

from verl_npu.registry import TOOLS
from verl_npu.tools.base import BaseTool, ToolResponse
from verl_npu.tools.sandbox import ISOLATIONS, UNSAFE, SandboxLimits, active_isolation, run_python

log = logging.getLogger(__name__)

SCHEMA = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run Python code and return what it prints (stdout and stderr).",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        },
    },
}
#: verl's Sandbox Fusion settings that have no meaning without a server: accepted, not used
SERVER_KEYS = ("sandbox_fusion_url", "rate_limit", "enable_global_rate_limit")
KEYS = (
    "type",
    "default_timeout",
    "cpu_time_limit",
    "memory_limit_mb",
    "disk_limit_mb",
    "max_processes",
    "num_workers",
    "max_output_bytes",
    "python_packages",
    "isolation",
    "default_language",
    "call_timeout",
    *SERVER_KEYS,
)
SIGNALS = {
    137: "it was killed (SIGKILL)",
    152: "it used up its CPU time limit (SIGXCPU)",
    153: "it wrote a file larger than the disk limit (SIGXFSZ)",
}


# verl's Sandbox Fusion tool runs locally here, in the sandbox of verl_npu.tools.sandbox
@TOOLS.register(
    "code_interpreter",
    function_name=None,
    verl_class_paths=("verl.tools.sandbox_fusion_tools.SandboxFusionTool",),
    doc="runs the model's Python code in a local sandbox and replies with its output",
)
class CodeInterpreterTool(BaseTool):
    """Runs the `code` argument in a sandbox per call (module docstring)."""

    def __init__(self, config: dict, tool_schema=None):
        super().__init__(config, tool_schema or SCHEMA)
        cfg = self.checked_config(KEYS, "the code interpreter")
        language = str(cfg.get("default_language", "python"))
        if language != "python":
            raise ValueError(f"default_language is {language!r}: the local sandbox runs Python only")
        isolation = str(cfg.get("isolation", "auto"))
        if isolation not in ISOLATIONS:
            active_isolation(isolation)  # raises, naming the values (and what `process` became)
        wall = float(cfg.get("default_timeout", 30))
        self.limits = SandboxLimits(
            wall_s=wall,
            cpu_s=float(cfg.get("cpu_time_limit", wall)),
            memory_mb=int(cfg.get("memory_limit_mb", 1024)),
            disk_mb=int(cfg.get("disk_limit_mb", 64)),
            processes=int(cfg.get("max_processes", 64)),
            max_output_bytes=int(cfg.get("max_output_bytes", 65536)),
            python_packages=bool(cfg.get("python_packages", True)),
            isolation=isolation,
        )
        if min(self.limits.wall_s, self.limits.cpu_s, self.limits.memory_mb, self.limits.disk_mb) <= 0:
            raise ValueError("default_timeout, cpu_time_limit, memory_limit_mb and disk_limit_mb must be positive")
        # raises, naming what is missing and how to get it, when no operating-system boundary can run here
        self.isolation = active_isolation(isolation)
        if self.isolation == UNSAFE:
            log.warning(
                "code interpreter %r: isolation unsafe_process: model-written code runs WITHOUT an "
                "operating-system boundary (Python-level guards only, which code can defeat)",
                self.name,
            )
        # the agent loop's guard (run_method): the run's own deadline plus time to start and clean up
        self.call_timeout = float(cfg.get("call_timeout", self.limits.wall_s + 30.0))
        self._slots = threading.BoundedSemaphore(max(int(cfg.get("num_workers", 4)), 1))
        if any(k in cfg for k in SERVER_KEYS):
            log.info(
                "code interpreter: %s set; verl-npu runs the code locally, the server settings are not used",
                ", ".join(k for k in SERVER_KEYS if k in cfg),
            )
        log.info(
            "code interpreter %r: sandbox isolation %s, %.0f s wall / %.0f s CPU, %d MiB memory",
            self.name,
            self.isolation,
            self.limits.wall_s,
            self.limits.cpu_s,
            self.limits.memory_mb,
        )

    def create(self, instance_id: str | None = None, **kwargs):
        return instance_id or str(uuid.uuid4()), ToolResponse()

    def prepare(self, code: str) -> str:
        """The program that runs for a call's `code` (the code itself here)."""
        return code

    def run(self, code: str, timeout: float | None = None) -> tuple[str, dict]:
        """(reply text, metrics) of one run; blocks, at most num_workers at a time."""
        limits = self.limits
        if timeout is not None:
            wall = min(float(timeout), limits.wall_s)
            limits = SandboxLimits(**{**limits.__dict__, "wall_s": wall, "cpu_s": min(limits.cpu_s, wall)})
        with self._slots:
            result = run_python(self.prepare(code), limits)
        text = result.output
        if result.truncated:
            text += f"\n[output cut at {limits.max_output_bytes} bytes]"
        if result.timed_out:
            text += f"\n[stopped: the code ran past its time limit of {limits.wall_s:g} s]"
        elif result.exit_code in SIGNALS:
            text += f"\n[stopped: {SIGNALS[result.exit_code]}]"
        if not text.strip():
            text = "(no output)"
        return text, {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "seconds": round(result.seconds, 3),
            "isolation": result.isolation,
        }

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs):
        import asyncio

        code = parameters.get("code") if isinstance(parameters, dict) else None
        if not isinstance(code, str) or not code.strip():
            return ToolResponse(text='Error: the code interpreter needs "code": a string of Python'), 0.0, {}
        language = parameters.get("language", "python")
        if language != "python":
            return ToolResponse(text=f"Error: language {language!r} cannot run here; only python"), 0.0, {}
        timeout = parameters.get("timeout")
        timeout = float(timeout) if isinstance(timeout, (int, float)) and timeout > 0 else None
        text, metrics = await asyncio.to_thread(self.run, code, timeout)
        return ToolResponse(text=text), 0.0, metrics

    def release(self, instance_id: str, **kwargs) -> None:
        return None


def retool_code(code: str) -> str:
    """ReTool's preparation of the model's code (its recipe's CustomSandboxFusionTool): the first
    ```python fenced block when there is one, and the last non-empty line printed when it is a bare
    expression that is not already a print (ReTool wraps any last line; an assignment is left alone
    here, where ReTool's wrapping would make it a syntax error)."""
    fenced = re.findall(r"```python(.*?)```", code, re.DOTALL)
    if fenced:
        code = fenced[0].strip()
    lines = code.split("\n")
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if not line.strip():
            continue
        if line.startswith("print") or line[:1].isspace():
            break
        try:
            tree = ast.parse(line)
        except SyntaxError:
            break
        if len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr):
            lines[i] = f"print({line})"
        break
    return "\n".join(lines)


# the ReTool recipe's variant of the Sandbox Fusion tool
@TOOLS.register(
    "retool_code_interpreter",
    function_name=None,
    verl_class_paths=("recipe.retool.retool.CustomSandboxFusionTool",),
    doc="the code interpreter with ReTool's code preparation",
)
class ReToolCodeInterpreter(CodeInterpreterTool):
    """The code interpreter with ReTool's code preparation (`retool_code`)."""

    def prepare(self, code: str) -> str:
        return retool_code(code)
