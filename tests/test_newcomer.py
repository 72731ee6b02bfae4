"""What a newcomer reads on the console (issue 27): where the run is, one validation block, and a plain
word when a finished run has nothing left to do."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from run_helpers import text_data, text_run_overrides
from verl_npu.trainer.tracking import format_console_line

CLI = [sys.executable, "-m", "verl_npu.cli"]


def _run(out, data) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    args = text_run_overrides(out, data, **{"trainer.total_training_steps": 2, "trainer.test_freq": 2,
                                            "trainer.save_freq": 2})
    return subprocess.run([*CLI, "run", "tiny_gsm8k", *args], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_step_lines_show_progress_one_validation_block_and_a_finished_run_says_so(tmp_path):
    data = text_data(tmp_path / "data")
    out = tmp_path / "out"
    first = _run(out, data)
    assert first.returncode == 0, first.stderr[-3000:]
    steps = [line for line in first.stderr.splitlines() if re.search(r"INFO step \d", line)]
    assert len(steps) == 2, first.stderr[-3000:]
    assert re.search(r"INFO step 1/2 \| [0-9.e+-]+ s/step, \d+s left \| score ", steps[0]), steps[0]
    assert re.search(r"INFO step 2/2 \| [0-9.e+-]+ s/step, 0s left \| ", steps[1]), steps[1]
    assert first.stderr.count("[val/generations] step 2:") == 1  # printed once, not once per sink
    assert "validation generations at step" not in first.stderr
    assert "done: 2 steps" in first.stderr

    again = _run(out, data)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"nothing to do: the run in {out} is already complete at step 2 of 2" in again.stderr
    assert "raise trainer.total_training_steps" in again.stderr and "trainer.resume_mode=disable" in again.stderr
    assert "last mean score n/a" not in again.stderr and "done:" not in again.stderr
    assert not re.search(r"INFO step \d", again.stderr)


def test_console_line_progress_replaces_the_bare_step():
    metrics = {"critic/score/mean": 0.5}
    assert format_console_line(metrics, 3) == "step 3 | score 0.5"
    assert format_console_line(metrics, 3, "step 3/10 | 2 s/step, 14s left") == "step 3/10 | 2 s/step, 14s left | score 0.5"
