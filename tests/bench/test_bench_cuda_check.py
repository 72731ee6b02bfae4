"""bench/cuda_check.py on the CPU (`--device cpu`, the checks the GPU run makes, on this machine), so the
one-shot GPU script does not rot: its checks pass here, its results files hold what they say, and a
check that fails is recorded while the others still run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict, str]:
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "cuda_check.py"),
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert (out / "cuda_check.json").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["cuda_check.json", "cuda_check.md", "cuda_check_failures.log"]
    return proc, json.loads((out / "cuda_check.json").read_text()), (out / "cuda_check.md").read_text()


@pytest.mark.slow
def test_cpu_checks_pass_and_report_their_numbers(tmp_path):
    proc, result, table = _run(tmp_path, "--device", "cpu", "--only", "env", "kl-ref", "parity", "mem-text-mid")
    checks = {c["name"]: c for c in result["checks"]}
    assert proc.returncode == 0, {n: c["error"] for n, c in checks.items() if not c["ok"]}
    assert sorted(checks) == ["env", "kl-ref", "mem-text-mid", "parity", "setup"]
    assert checks["env"]["numbers"]["varlen_kernel"] == "sdpa_sequences"
    run = checks["kl-ref"]["numbers"]
    assert run["steps"] == [1, 2] and run["timing_s/step"] > 0 and run["actor/grad_norm"] > 0
    assert run["actor"]["trainable_dtypes"] == ["torch.float32"] and "ref_param_dtypes" in run["actor"]
    parity = checks["parity"]["numbers"]
    assert parity["device fp32, padding-free"]["logprob_max_abs"] < 1e-4
    assert 0 < parity["device bf16 autocast (actor), padded"]["logprob_max_abs"] < 0.25
    phases = checks["mem-text-mid"]["numbers"]["phases"]
    assert {"rollout", "old log-probs", "actor update"} <= set(phases)
    assert all(p["planned_mb"] > 0 and p["measured_mb"] > 0 for p in phases.values())
    assert "| kl-ref | yes |" in table and "| text-mid | actor update |" in table


@pytest.mark.slow
def test_a_failing_check_is_recorded_and_the_others_still_run(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA (the env check must fail)")
    proc, result, table = _run(tmp_path, "--device", "cuda", "--only", "env", "validate", "--jobs", "2")
    checks = {c["name"]: c for c in result["checks"]}
    assert proc.returncode == 1
    assert not checks["env"]["ok"] and "expected {'kind': 'cuda'" in checks["env"]["error"]
    assert checks["env"]["numbers"]["detected"]["cuda"]["error"].startswith("UserError")  # what it found is kept
    assert len(checks["env"]["error"].splitlines()) <= 40
    assert checks["validate"]["ok"], checks["validate"]["error"]
    assert "| env | **NO** |" in table and "## env failed" in table
    assert "===== env" in (tmp_path / "out" / "cuda_check_failures.log").read_text()
