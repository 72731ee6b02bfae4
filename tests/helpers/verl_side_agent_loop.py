"""Run in the upstream verl venv (VERL_SIDE_PYTHON): prints verl 0.9.1's custom agent-loop interface as JSON, read
from the source of verl/experimental/agent_loop/agent_loop.py without importing it (importing it needs verl's
server stack): for AgentLoopBase / AgentLoopOutput / AgentLoopMetrics each method's kind (def / async) and
parameter names, each field's name and whether it has a default; and register's parameters.

    python tests/helpers/verl_side_agent_loop.py [PATH_TO_agent_loop.py]

tests/rollout/test_agent_loop_api_parity.py compares the answer with tests/fixtures/verl_agent_loop_interface.json
(the table verl-npu's `verl_npu.rollout.agent_loop_api` is checked against)."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

CLASSES = ("AgentLoopBase", "AgentLoopOutput", "AgentLoopMetrics")


def params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = node.args
    return (
        [x.arg for x in a.posonlyargs + a.args]
        + ([f"*{a.vararg.arg}"] if a.vararg else [])
        + [x.arg for x in a.kwonlyargs]
        + ([f"**{a.kwarg.arg}"] if a.kwarg else [])
    )


def interface(source: str) -> dict:
    out: dict = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name in CLASSES:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    kind = "async" if isinstance(item, ast.AsyncFunctionDef) else "def"
                    out[f"{node.name}.{item.name}"] = [kind, params(item)]
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    out[f"{node.name}.{item.target.id}"] = ["field", item.value is not None]
        elif isinstance(node, ast.FunctionDef) and node.name == "register":
            out["register"] = ["def", params(node)]
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1:
        path = Path(sys.argv[1])
    else:
        spec = importlib.util.find_spec("verl")
        path = Path(list(spec.submodule_search_locations)[0]) / "experimental" / "agent_loop" / "agent_loop.py"
    print(json.dumps(interface(path.read_text()), indent=1, sort_keys=True))
