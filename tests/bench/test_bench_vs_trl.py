"""bench/vs_trl.py --smoke runs (2 steps per side; verl-npu only when TRL is not installed), so the
benchmark never rots. No timing is asserted: speed is recorded in bench/results/vs_trl.md."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["vl", "text"])
def test_vs_trl_smoke_runs_both_trainers(tmp_path, task):
    summary_file = tmp_path / "summary.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "vs_trl.py"),
            "--smoke",
            "--task",
            task,
            "--threads",
            "1",
            "--json",
            str(summary_file),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    summary = json.loads(summary_file.read_text())
    sides = ["verl", "trl"] if importlib.util.find_spec("trl") is not None else ["verl"]
    assert sorted(summary["sides"]) == sorted(sides)
    for name in sides:
        side = summary["sides"][name]
        assert side["steps"] == 2
        assert side["median_step_s"] > 0 and side["completion_tokens_per_s"] > 0 and side["peak_rss_mb"] > 0
        assert f"| {name} |" in proc.stdout
    assert "step" in summary["sides"]["verl"]["phases_of_median_step"]
    assert ("ratio verl-npu / TRL" in proc.stdout) == ("trl" in sides)


@pytest.mark.slow
def test_step_cpu_reports_cpu_and_wall_medians():
    """bench/step_cpu.py (verl-npu's side timed in CPU seconds) runs and reports positive medians, the
    rollout's CPU time a part of the step's."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "step_cpu.py"), "--task", "text", "--steps", "3"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["task"] == "text"
    assert 0 < result["gen_cpu_s"] < result["step_cpu_s"] and result["step_s"] > 0
