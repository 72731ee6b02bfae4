"""Tiny end-to-end training runs on the CPU: real models, real data files, real outputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from run_helpers import run_overrides, wait_for_checkpoint
from safetensors.torch import load_file

from verl_npu.config import load_recipe
from verl_npu.trainer.entry import run_training

REPO = Path(__file__).resolve().parents[2]

ACTOR_METRICS = [
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
]
STEP_METRICS = [
    "training/global_step",
    "training/epoch",
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "critic/advantages/mean",
    "response_length/mean",
    "response_length/max",
    "response_length/clip_ratio",
    "prompt_length/mean",
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/adv",
    "timing_s/update_actor",
    "timing_s/step",
    "perf/throughput",
] + ACTOR_METRICS


def tiny_overrides(tmp_path: Path, data_dir: Path, **extra) -> list[str]:
    return run_overrides(
        tmp_path / "out",
        data_dir,
        {
            "data.train_batch_size": 4,
            "data.max_response_length": 4,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
            "actor_rollout_ref.actor.use_kl_loss": "true",
            "actor_rollout_ref.actor.kl_loss_coef": 0.01,
            "actor_rollout_ref.rollout.n": 2,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
            "trainer.total_training_steps": 3,
            "trainer.save_freq": 3,
            "trainer.test_freq": 3,
            "trainer.logger": "[console,tensorboard]",
        },
        extra,
    )


def read_metrics(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_vl_run_trains_logs_and_checkpoints(tmp_path, geo_data, tiny_vl_path):
    # 3 steps of a random model score 0 (zero advantages, and the KL term is 0 while the actor equals
    # the reference): a small entropy bonus gives every parameter a real gradient to train on
    rc = load_recipe(
        "tiny_geo3k", tiny_overrides(tmp_path, geo_data, **{"actor_rollout_ref.actor.entropy_coeff": 0.01})
    )
    assert run_training(rc) == 0
    out = tmp_path / "out"
    rows = read_metrics(out)
    train_rows = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3]
    for row in train_rows:
        missing = [k for k in STEP_METRICS if k not in row]
        assert not missing, f"metrics.jsonl lacks {missing}"
        assert all(v is None or isinstance(v, (int, float)) for v in row.values())
        for key in ACTOR_METRICS:
            assert row[key] is not None and abs(row[key]) < 1e6, key  # finite
    assert "val-core/synthetic_geometry/reward/mean@1" in train_rows[-1]

    # every trainable parameter moved away from the initial tiny model
    ckpt = out / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    hf_dir = ckpt / "global_step_3" / "actor" / "huggingface"
    trained = load_file(str(hf_dir / "model.safetensors"))
    initial = load_file(str(Path(tiny_vl_path) / "model.safetensors"))
    unchanged = [k for k, v in initial.items() if k in trained and torch.equal(v, trained[k])]
    assert not unchanged, f"parameters that did not change: {unchanged[:5]}"
    assert (ckpt / "global_step_3" / "trainer_state.json").exists()  # the trainer state: JSON, no pickle
    # the Hugging Face export loads with plain transformers
    from transformers import AutoModelForImageTextToText, AutoProcessor

    AutoModelForImageTextToText.from_pretrained(hf_dir)
    AutoProcessor.from_pretrained(hf_dir)

    # tensorboard events with verl's names; the resolved config and the curves
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list((out / "tensorboard").rglob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    assert {"critic/score/mean", "actor/pg_loss", "actor/kl_loss"} <= set(acc.Tags()["scalars"])
    assert (out / "exp-config.yaml").exists() and (out / "training_curves.png").stat().st_size > 1000
    assert (out / "logs" / "run.log").read_text().count("step 3") >= 1


def _gsm8k_like(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(8):
        a, b = i + 1, 2 * i + 3
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": f"What is {a} plus {b}? Give the number after ####."}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": "train", "index": i},
            }
        )
    for name in ("train", "test"):
        pq.write_table(pa.Table.from_pylist(rows), folder / f"{name}.parquet")
    return folder


@pytest.mark.parametrize(
    "estimator, kl_type",
    [
        ("rloo", "low_var_kl"),
        ("remax", "mse"),
        ("reinforce_plus_plus", "full"),
        ("reinforce_plus_plus_baseline", "abs"),
    ],
)
def test_text_model_run(tmp_path, tiny_lm_path, estimator, kl_type):
    """A text model, padding-free log-probs, token-budget micro-batches, every estimator, KL kinds
    (the exact 'full' one included), JSONL dumps."""
    data = _gsm8k_like(tmp_path / "gsm")
    # gsm8k's own score plus a dense term, so that random-init samples differ and gradients are real
    reward = tmp_path / "dense.py"
    reward.write_text(
        "from verl_npu.rewards import default_compute_score\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    out = dict(default_compute_score(data_source, solution_str, ground_truth, extra_info))\n"
        "    out['score'] += (sum(map(ord, solution_str)) % 5) / 10\n"
        "    return out\n"
    )
    rc = load_recipe(
        "tiny_geo3k",
        tiny_overrides(
            tmp_path,
            data,
            **{
                "actor_rollout_ref.model.path": "tiny://qwen2",
                "actor_rollout_ref.model.use_remove_padding": "true",
                "actor_rollout_ref.actor.use_dynamic_bsz": "true",
                "data.max_prompt_length": 48,
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 100,
                "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 100,
                "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": 100,
                "algorithm.adv_estimator": estimator,
                "actor_rollout_ref.actor.kl_loss_type": kl_type,
                "trainer.total_training_steps": 2,
                "trainer.save_freq": -1,
                "trainer.test_freq": -1,
                "trainer.rollout_data_dir": tmp_path / "rollouts",
                "custom_reward_function.path": reward,
            },
        ),
    )
    assert run_training(rc) == 0
    rows = read_metrics(tmp_path / "out")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["actor/pg_loss"] is not None and r["actor/grad_norm"] > 0 for r in rows)
    assert "critic/score/strict_accuracy/mean" in rows[0]
    dumped = [json.loads(line) for line in (tmp_path / "rollouts" / "2.jsonl").read_text().splitlines()]
    assert len(dumped) == 4 * 2 and {"response", "score", "ground_truth", "uid"} <= set(dumped[0])
    if estimator == "remax":
        assert "timing_s/gen_max" in rows[0]
    # the policy leaves the reference after the first optimizer step: every KL kind is >= 0 and grows
    assert 0 <= rows[0]["actor/kl_loss"] < rows[1]["actor/kl_loss"] < 1


# ---- resume -----------------------------------------------------------------------------------
COMPARED = [
    "critic/score/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/grad_norm",
    "response_length/mean",
    "actor/lr",
    "training/epoch",
]


def _cli_run(overrides: list[str], cache: Path) -> subprocess.Popen:
    env = dict(os.environ, VERL_NPU_CACHE=str(cache), OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "verl_npu.cli", "run", "tiny_geo3k", *overrides],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize("batch_size", [4, 2], ids=["epoch-boundary", "mid-epoch"])
def test_killed_run_resumes_like_an_uninterrupted_one(tmp_path, geo_data, tiny_cache, batch_size):
    """8 train rows: batch 4 -> the step-2 checkpoint sits on an epoch boundary; batch 2 -> mid-epoch."""
    common = {
        "data.train_batch_size": batch_size,
        "actor_rollout_ref.actor.ppo_mini_batch_size": batch_size,
        "trainer.total_training_steps": 4,
        "trainer.save_freq": 2,
        "trainer.test_freq": -1,
        "trainer.logger": "[console]",
    }
    straight = tmp_path / "straight"
    assert run_training(load_recipe("tiny_geo3k", tiny_overrides(straight, geo_data, **common))) == 0
    reference = {r["step"]: r for r in read_metrics(straight / "out")}

    killed = tmp_path / "killed"
    proc = _cli_run(tiny_overrides(killed, geo_data, **common), tiny_cache)
    marker = killed / "out" / "checkpoints" / "latest_checkpointed_iteration.txt"
    if wait_for_checkpoint(proc, marker, 2):
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stdout.read()

    resumed = _cli_run(tiny_overrides(killed, geo_data, **common), tiny_cache)
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    assert "resumed from" in output and "global_step_2" in output
    rows = {r["step"]: r for r in read_metrics(killed / "out")}
    assert sorted(rows) == [1, 2, 3, 4]  # no duplicate or lost rows
    for step in (3, 4):
        for key in COMPARED:
            assert rows[step][key] == pytest.approx(reference[step][key], rel=1e-4, abs=1e-6), (step, key)
    if batch_size == 4:
        assert rows[3]["training/epoch"] == 1.0  # the epoch after the boundary is not skipped


def test_ctrl_c_stops_cleanly_and_keeps_the_last_checkpoint(tmp_path, geo_data, tiny_cache):
    over = tiny_overrides(
        tmp_path,
        geo_data,
        **{
            "trainer.total_training_steps": 200,
            "trainer.save_freq": 1,
            "trainer.test_freq": -1,
            "trainer.logger": "[console]",
        },
    )
    proc = _cli_run(over, tiny_cache)
    marker = tmp_path / "out" / "checkpoints" / "latest_checkpointed_iteration.txt"
    wait_for_checkpoint(proc, marker, 2)
    os.kill(proc.pid, signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    assert "stopped by Ctrl-C (SIGINT) after step" in output and "Traceback" not in output  # the step saved
    ckpts = tmp_path / "out" / "checkpoints"
    assert not [p for p in ckpts.iterdir() if p.name.startswith(".")]  # nothing half-written left visible
    step = int(marker.read_text())
    assert (ckpts / f"global_step_{step}" / "actor" / "huggingface" / "model.safetensors").exists()


def test_bf16_compute_keeps_fp32_master_weights(tmp_path, geo_data, tiny_vl_path, monkeypatch):
    """Where the device computes in bf16, the worker autocasts; weights and optimizer stay fp32."""
    from verl_npu.device import DeviceInfo
    from verl_npu.workers.actor import ActorRolloutRefWorker

    monkeypatch.setattr(DeviceInfo, "train_dtype", lambda self: torch.bfloat16)
    rc = load_recipe("tiny_geo3k", tiny_overrides(tmp_path, geo_data))
    worker = ActorRolloutRefWorker(rc.typed, device=DeviceInfo("cpu"), total_training_steps=1)
    info = worker.init_model()
    assert info["compute_dtype"] == "torch.bfloat16"
    assert all(p.dtype == torch.float32 for p in worker.module.parameters())
    assert all(p.dtype == torch.bfloat16 for p in worker.ref_module.parameters())
    with worker._autocast():
        x = torch.nn.functional.linear(torch.randn(2, 4), torch.randn(3, 4))
    assert x.dtype == torch.bfloat16
