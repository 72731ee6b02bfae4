"""Two Ray workers (FSDP2 over gloo) train exactly like one: same global batch, same seeds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from run_helpers import run_overrides, step_metrics, text_data, wait_for_checkpoint, write_varied_reward
from safetensors.torch import load_file

from verl_npu.config import load_recipe
from verl_npu.data.geometry3k import prepare_synthetic
from verl_npu.trainer.entry import run_training

COMPARED = [
    "critic/score/mean",
    "response_length/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
    "actor/pg_clipfrac",
]


def overrides(out: Path, data: Path, gpus: int) -> list[str]:
    reward = write_varied_reward(out.parent / "dense_reward.py")
    return run_overrides(
        out,
        data,
        {
            "custom_reward_function.path": reward,
            "data.train_batch_size": 4,
            "data.max_response_length": 3,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 4,  # one update per step: same rows in it either way
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
            "actor_rollout_ref.actor.use_kl_loss": "true",
            "actor_rollout_ref.actor.kl_loss_coef": 0.05,
            "actor_rollout_ref.rollout.n": 4,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
            "trainer.n_gpus_per_node": gpus,
            "trainer.total_training_steps": 3,
            "trainer.save_freq": 3,
            "trainer.test_freq": -1,
            "trainer.logger": "[console]",
            "ray_init.num_cpus": 2,
        },
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "sp, vision", [(1, True), (2, True), (2, False)], ids=["data-parallel", "ulysses-sp2-vl", "ulysses-sp2-text"]
)
def test_two_cpu_workers_match_one_worker(tmp_path, tiny_vl_path, tiny_lm_path, sp, vision):
    """sp=1: two data-parallel FSDP2 workers; sp=2: one Ulysses group of two workers sharing each
    packed sequence; each against one worker."""
    one, two = tmp_path / "one", tmp_path / "two"
    if vision:
        data, model_path = tmp_path / "data", tiny_vl_path
        extra = ["actor_rollout_ref.model.use_remove_padding=true"] if sp > 1 else []
        prepare_synthetic(data, n_train=12, n_test=4, seed=0, image_size=56)
    else:
        data, model_path = text_data(tmp_path / "data"), tiny_lm_path
        extra = [
            "actor_rollout_ref.model.path=tiny://qwen2",
            "actor_rollout_ref.model.use_remove_padding=true",
            "data.max_prompt_length=32",
        ]
    ulysses = [
        f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}",
        f"actor_rollout_ref.ref.ulysses_sequence_parallel_size={sp}",
    ]
    assert run_training(load_recipe("tiny_geo3k", overrides(one, data, 1) + extra)) == 0
    assert run_training(load_recipe("tiny_geo3k", overrides(two, data, 2) + extra + ulysses)) == 0
    assert f"'data_parallel': {2 // sp}, 'ulysses_sp': {sp}" in (two / "logs" / "run.log").read_text()
    m1, m2 = step_metrics(one), step_metrics(two)
    assert sorted(m1) == sorted(m2) == [1, 2, 3]
    for step in m1:
        for key in COMPARED:
            assert m2[step][key] == pytest.approx(m1[step][key], rel=1e-4, abs=1e-5), (step, key)
    assert m1[3]["actor/grad_norm"] > 0

    ckpt1 = one / "checkpoints" / "global_step_3" / "actor"
    ckpt2 = two / "checkpoints" / "global_step_3" / "actor"
    # sharded state: one file per rank; the Hugging Face export is one full model either way
    assert sorted(p.name for p in ckpt2.glob("model_world_size_*")) == [
        "model_world_size_2_rank_0.pt",
        "model_world_size_2_rank_1.pt",
    ]
    w1 = load_file(str(ckpt1 / "huggingface" / "model.safetensors"))
    w2 = load_file(str(ckpt2 / "huggingface" / "model.safetensors"))
    assert set(w1) == set(w2), set(w1) ^ set(w2)
    initial = load_file(str(Path(model_path) / "model.safetensors"))
    # Adam divides by sqrt(v): on the rare elements whose gradient is nearly zero, float-level
    # differences in reduction order become visible (seen: at most ~6e-5 after 3 steps of lr 1e-3)
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], atol=1e-4, rtol=1e-4, msg=name)
    mean_diff = sum((w2[n] - w1[n]).abs().sum().item() for n in w1) / sum(w1[n].numel() for n in w1)
    assert mean_diff < 1e-6
    assert any(not torch.equal(w1[n], initial[n]) for n in w1)  # and they did train


@pytest.mark.slow
def test_a_dead_worker_stops_the_run_with_a_clear_error(tmp_path, tiny_cache):
    import os
    import re
    import signal
    import subprocess
    import sys
    import time

    data = tmp_path / "data"
    prepare_synthetic(data, n_train=12, n_test=4, seed=0, image_size=56)
    over = overrides(tmp_path / "run", data, 2) + ["trainer.total_training_steps=500", "trainer.save_freq=1"]
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, VERL_NPU_CACHE=str(tiny_cache))
    proc = subprocess.Popen(
        [sys.executable, "-m", "verl_npu.cli", "run", "tiny_geo3k", *over],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log = tmp_path / "run" / "logs" / "run.log"
    marker = tmp_path / "run" / "checkpoints" / "latest_checkpointed_iteration.txt"
    deadline = time.time() + 180
    pid = None
    while time.time() < deadline and proc.poll() is None:
        if pid is None and log.exists():
            found = re.search(r"worker rank 1: pid (\d+)", log.read_text())
            pid = int(found.group(1)) if found else None
        if pid is not None and marker.exists():
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.1)
    assert pid is not None, "worker pids were not logged"
    killed_at = time.time()
    output, _ = proc.communicate(timeout=120)
    assert time.time() - killed_at < 120
    assert proc.returncode == 1, output
    assert "worker rank 1 died" in output and "checkpoints" in output and "Traceback" not in output


@pytest.mark.slow
def test_killed_two_worker_run_resumes_on_two_workers(tmp_path, tiny_cache):
    import os
    import signal
    import subprocess
    import sys

    data = tmp_path / "data"
    prepare_synthetic(data, n_train=12, n_test=4, seed=0, image_size=56)
    steps = ["trainer.total_training_steps=4", "trainer.save_freq=2"]
    straight = tmp_path / "straight"
    assert run_training(load_recipe("tiny_geo3k", overrides(straight, data, 2) + steps)) == 0

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, VERL_NPU_CACHE=str(tiny_cache))
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "verl_npu.cli", "run", "tiny_geo3k", *overrides(killed, data, 2), *steps]
    proc = subprocess.Popen(
        cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    marker = killed / "checkpoints" / "latest_checkpointed_iteration.txt"
    if wait_for_checkpoint(proc, marker, 2, timeout=180):
        os.killpg(proc.pid, signal.SIGKILL)  # the controller and its Ray workers, all at once
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    resumed = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    # the console is what a user reads: no Ray token-auth warning, no transformers bars or deprecations
    for noise in ("Token authentication is enabled", "Loading weights", "Writing model shards", "past_key_values"):
        assert noise not in resumed.stderr, noise
    ref, got = step_metrics(straight), step_metrics(killed)
    assert sorted(got) == [1, 2, 3, 4]
    for step in (3, 4):
        for key in COMPARED:
            assert got[step][key] == pytest.approx(ref[step][key], rel=1e-4, abs=1e-5), (step, key)
