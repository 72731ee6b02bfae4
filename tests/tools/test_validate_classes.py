"""`verl-npu validate --check-paths` imports the classes a multi-turn config names, in a process of its
own (issue 36): a tool config naming a class its file lacks, a module that fails to import or exits
while importing, and an interaction class that does not exist are each a problem at their key, all in
one report, and validate itself ends normally (exit 1, no traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MT = "actor_rollout_ref.rollout.multi_turn."


def test_validate_check_paths_reports_bad_tool_and_interaction_classes(tmp_path):
    (tmp_path / "my_tools.py").write_text(
        "from verl_npu.tools import BaseTool\n\nclass Calc(BaseTool):\n"
        "    def execute(self, instance_id, parameters, **kwargs):\n"
        "        return 'ok'\n"
    )
    (tmp_path / "broken.py").write_text("import no_such_package_36\n")
    (tmp_path / "exits.py").write_text("import os\nos._exit(7)\n")  # would end validate if imported there
    (tmp_path / "tools.yaml").write_text(f"""
tools:
  - class_name: {tmp_path}/my_tools.py:Calc
    tool_schema: {{type: function, function: {{name: calc, description: d, parameters: {{type: object, properties: {{}}}}}}}}
  - class_name: {tmp_path}/my_tools.py:NoSuchTool
    tool_schema: {{type: function, function: {{name: nope, description: d, parameters: {{type: object, properties: {{}}}}}}}}
  - class_name: {tmp_path}/broken.py:Tool
    tool_schema: {{type: function, function: {{name: broken, description: d, parameters: {{type: object, properties: {{}}}}}}}}
""")
    (tmp_path / "interactions.yaml").write_text(
        f"interaction:\n  - name: chess\n    class_name: {tmp_path}/my_tools.py:Chess\n"
    )
    cmd = [
        sys.executable,
        "-m",
        "verl_npu.cli",
        "validate",
        "tiny_grid_env",
        f"{MT}enable=true",
        f"{MT}tool_config_path={tmp_path}/tools.yaml",
        f"{MT}interaction_config_path={tmp_path}/interactions.yaml",
        "--check-paths",
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "Traceback" not in text
    assert "has no class 'NoSuchTool'" in text and "tools[1]" in text
    assert "tools[2].class_name: importing" in text and "No module named 'no_such_package_36'" in text
    assert "has no class 'Chess'" in text and "interaction_config_path" in text
    assert "tools[0]" not in text  # the tool that is fine is not reported

    # a module that exits the process while being imported: a problem, and validate still reports
    (tmp_path / "tools.yaml").write_text(f"""
tools:
  - class_name: {tmp_path}/exits.py:Tool
    tool_schema: {{type: function, function: {{name: ex, description: d, parameters: {{type: object, properties: {{}}}}}}}}
""")
    cmd = cmd[:-3] + [f"{MT}tool_config_path={tmp_path}/tools.yaml", "--check-paths"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text
    assert "ended the checking process (exit status 7)" in text


def test_validate_check_paths_reports_bad_agent_loop_classes_by_key(tmp_path):
    """rollout.agent.agent_loop_config_path (issue 39): the loop classes are imported in the checking process; a
    missing class, a class that is not an AgentLoopBase, a module that fails to import, and a default_agent_loop
    the file does not name are each reported at their key, the good loop not at all."""
    toys = ROOT / "tests" / "toys" / "toy_agent_loop.py"
    (tmp_path / "broken_loop.py").write_text("import no_such_package_39\n")
    (tmp_path / "loops.yaml").write_text(f"""
- {{name: good, _target_: {toys}:TwoTurnAgentLoop}}
- {{name: missing, _target_: {toys}:NoSuchLoop}}
- {{name: plain, _target_: {toys}:NotALoop}}
- {{name: broken, _target_: broken_loop.Loop}}
""")
    key = "actor_rollout_ref.rollout.agent."
    cmd = [
        sys.executable,
        "-m",
        "verl_npu.cli",
        "validate",
        "tiny_gsm8k",
        f"{key}agent_loop_config_path={tmp_path}/loops.yaml",
        f"{key}default_agent_loop=react",
        "--check-paths",
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text
    assert "[1]._target_" in text and "has no class 'NoSuchLoop'" in text
    assert "[2]._target_" in text and "must subclass AgentLoopBase" in text
    assert "[3]._target_: importing 'broken_loop' failed" in text and "no_such_package_39" in text
    assert "default_agent_loop" in text and "'react'" in text
    assert "[0]" not in text
