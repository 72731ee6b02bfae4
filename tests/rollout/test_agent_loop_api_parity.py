"""verl-npu's custom agent-loop interface (`verl_npu.rollout.agent_loop_api`) offers what verl 0.9.1's does: every
method of verl's AgentLoopBase / AgentLoopOutput / AgentLoopMetrics with the same parameter names and the same
async-ness, every field (required where verl's is), and `register(agent_name)`, per the table recorded from
verl's source (tests/fixtures/verl_agent_loop_interface.json); with upstream verl at hand (VERL_SIDE_PYTHON,
tests/verl_side.sh) the table is read again from verl's source and must equal the recorded one."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import subprocess
from pathlib import Path

import pytest

from verl_npu.rollout import agent_loop_api

TESTS = Path(__file__).resolve().parents[1]
TABLE = TESTS / "fixtures" / "verl_agent_loop_interface.json"


def _params(fn) -> list[str]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        out.append(prefix + p.name)
    return out


def test_the_interface_offers_verls_methods_and_fields():
    table = json.loads(TABLE.read_text())
    output_init = inspect.signature(agent_loop_api.AgentLoopOutput.__init__).parameters
    metric_fields = {f.name: f for f in dataclasses.fields(agent_loop_api.AgentLoopMetrics)}
    checked = 0
    for name, (kind, detail) in table.items():
        owner, _, member = name.rpartition(".")
        if kind == "field" and owner == "AgentLoopOutput":
            assert member in output_init and member in agent_loop_api.AgentLoopOutput.FIELDS, name
            assert (output_init[member].default is not inspect.Parameter.empty) == detail, name
        elif kind == "field":
            assert member in metric_fields and (metric_fields[member].default is not dataclasses.MISSING) == detail, (
                name
            )
        else:
            fn = getattr(getattr(agent_loop_api, owner), member) if owner else getattr(agent_loop_api, member)
            assert _params(fn) == detail, (name, _params(fn), detail)
            assert asyncio.iscoroutinefunction(fn) == (kind == "async"), name
        checked += 1
    assert checked == len(table) >= 25


@pytest.mark.verl_side
def test_the_recorded_table_is_verls():
    from run_helpers import verl_side_python

    python = verl_side_python()
    out = subprocess.run(
        [python, str(TESTS / "helpers" / "verl_side_agent_loop.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout) == json.loads(TABLE.read_text())
