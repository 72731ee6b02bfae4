"""DAPO as verl 0.9.1 spells it: dynamic sampling (algorithm.filter_groups.* with data.gen_batch_size), the dapo
reward manager's overlong penalty, their config rules; tiny CPU runs of the text model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from run_helpers import step_metrics, text_data, text_run_overrides, wait_for_checkpoint

from verl_npu.batch import Batch
from verl_npu.config import load_recipe
from verl_npu.errors import ConfigErrors
from verl_npu.rewards.dapo import dapo_scores, overlong_penalty
from verl_npu.trainer.dynamic_sampling import DynamicSampler, TooFewGroups, zero_variance_groups
from verl_npu.trainer.entry import run_training

# prompts of even i (ground truth 2i + 2 = 2 mod 4) score 0.5 whatever the response: zero-variance groups;
# the others get a reward that varies with the text (their groups keep some variance)
HALF_CONSTANT_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if int(ground_truth) % 4 == 2:
        return 0.5
    return float(sum(map(ord, solution_str)) % 7) / 6.0
"""
CONSTANT_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0
"""


def _overrides(tmp_path: Path, reward: str, **extra) -> list[str]:
    data = text_data(tmp_path / "data", rows=16)
    (tmp_path / "reward.py").write_text(reward)
    return text_run_overrides(
        tmp_path / "out",
        data,
        **{
            "custom_reward_function.path": tmp_path / "reward.py",
            "algorithm.filter_groups.enable": "true",
            "algorithm.filter_groups.metric": "seq_reward",
            "data.gen_batch_size": 2,
            "actor_rollout_ref.rollout.n": 4,
            "trainer.total_training_steps": 1,
            **extra,
        },
    )


def _state(out: Path, step: int) -> dict:
    return json.loads((out / "checkpoints" / f"global_step_{step}" / "trainer_state.json").read_text())


# ---- dynamic sampling in a real run -----------------------------------------------------------------------
def test_dynamic_sampling_drops_zero_variance_groups_and_trains_on_train_batch_size(tmp_path, capfd):
    rc = load_recipe(
        "tiny_gsm8k",
        _overrides(
            tmp_path,
            HALF_CONSTANT_REWARD,
            **{"trainer.save_freq": 1, "trainer.rollout_data_dir": tmp_path / "rollouts"},
        ),
    )
    assert run_training(rc) == 0
    log_text = capfd.readouterr().err
    row = step_metrics(tmp_path / "out")[1]
    batches = int(row["train/num_gen_batches"])
    kept, dropped = row["training/filter_groups/kept_groups"], row["training/filter_groups/dropped_groups"]
    # half the prompts give all-equal groups: with 2 prompts per batch, 4 groups need more than 2 batches
    assert batches >= 3 and dropped >= 1 and kept >= 4
    assert kept + dropped == 2 * batches
    assert row["training/filter_groups/evicted_samples"] == 4 * dropped
    assert row["training/filter_groups/discarded_surplus_samples"] == 4 * (kept - 4)
    # trained on exactly train_batch_size=4 groups of rollout.n=4 responses, none of them all-equal
    trained = [json.loads(line) for line in (tmp_path / "rollouts" / "1.jsonl").read_text().splitlines()]
    groups: dict[str, list[float]] = {}
    for r in trained:
        groups.setdefault(r["uid"], []).append(r["score"])
    assert len(trained) == 16 and len(groups) == 4
    assert all(len(set(scores)) > 1 for scores in groups.values())
    assert f"dynamic sampling, step 1: {batches} generation batch(es)" in log_text
    # the loader advanced over every generation batch consumed: 2 prompts each
    state = _state(tmp_path / "out", 1)["dataloader"]
    assert state["epoch"] * 16 + state["sample_index"] == 2 * batches


def test_dynamic_sampling_keeps_exactly_train_batch_size_groups():
    """Unit: with 3 prompts per batch, groups 0 and 2 of each batch constant, collect returns exactly 4 groups."""
    made = []

    def generate_and_score(prompts: Batch, k: int) -> Batch:
        uids = [f"{k}-{i}" for i in range(3) for _ in range(2)]
        scores = torch.zeros(6, 3)
        scores[:, -1] = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
        made.append(k)
        b = Batch({"token_level_scores": scores}, {"uid": uids})
        b.meta["reward_extras"] = {"x": list(range(6))}
        return b

    sampler = DynamicSampler(train_batch_size=4, metric="reward", max_num_gen_batches=0)
    batch, metrics = sampler.collect(
        Batch({"p": torch.zeros(3)}, {}), lambda: Batch({"p": torch.zeros(3)}, {}), generate_and_score, step=1
    )
    assert made == [0, 1, 2, 3]  # one group kept per batch
    assert list(dict.fromkeys(batch["uid"])) == ["0-1", "1-1", "2-1", "3-1"]
    assert len(batch) == 8 and batch.meta["reward_extras"]["x"] == [2, 3] * 4
    assert metrics["train/num_gen_batches"] == 4 and metrics["training/filter_groups/dropped_groups"] == 8


def test_zero_variance_groups_keeps_single_responses_and_nan():
    uids = ["a", "a", "b", "b", "c", "d", "d"]
    values = [1.0, 1.0, 1.0, 0.0, 3.0, float("nan"), float("nan")]
    assert zero_variance_groups(uids, values) == {"a"}


def test_dynamic_sampling_stops_at_max_num_gen_batches(tmp_path):
    rc = load_recipe(
        "tiny_gsm8k", _overrides(tmp_path, CONSTANT_REWARD, **{"algorithm.filter_groups.max_num_gen_batches": 3})
    )
    with pytest.raises(
        TooFewGroups,
        match=r"max_num_gen_batches=3 batches .* kept only 0 of the "
        r"data.train_batch_size=4 .* raise max_num_gen_batches",
    ):
        run_training(rc)


@pytest.mark.slow
def test_dynamic_sampling_resume_continues_exactly(tmp_path):
    """2 steps straight vs 1 step, then resume for the second: the same loader positions and metrics."""
    straight = _overrides(
        tmp_path / "a", HALF_CONSTANT_REWARD, **{"trainer.total_training_steps": 2, "trainer.save_freq": 1}
    )
    assert run_training(load_recipe("tiny_gsm8k", straight)) == 0
    half = _overrides(
        tmp_path / "b", HALF_CONSTANT_REWARD, **{"trainer.total_training_steps": 1, "trainer.save_freq": 1}
    )
    assert run_training(load_recipe("tiny_gsm8k", half)) == 0
    rest = _overrides(
        tmp_path / "b", HALF_CONSTANT_REWARD, **{"trainer.total_training_steps": 2, "trainer.save_freq": 1}
    )
    assert run_training(load_recipe("tiny_gsm8k", rest)) == 0
    assert _state(tmp_path / "a" / "out", 2)["dataloader"] == _state(tmp_path / "b" / "out", 2)["dataloader"]
    a, b = step_metrics(tmp_path / "a" / "out")[2], step_metrics(tmp_path / "b" / "out")[2]
    for key in ("train/num_gen_batches", "training/filter_groups/kept_groups", "critic/score/mean"):
        assert a[key] == b[key], key


@pytest.mark.slow
def test_dynamic_sampling_killed_run_resumes_like_an_uninterrupted_one(tmp_path):
    """SIGKILL after the step-2 checkpoint of an 8-step run, rerun: every step's sampling and training
    metrics equal the uninterrupted run's (the loader continues after every generation batch consumed)."""
    extra = {"trainer.total_training_steps": 8, "trainer.save_freq": 2}
    assert run_training(load_recipe("tiny_gsm8k", _overrides(tmp_path / "a", HALF_CONSTANT_REWARD, **extra))) == 0
    over = _overrides(tmp_path / "b", HALF_CONSTANT_REWARD, **extra)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    cmd = [sys.executable, "-m", "verl_npu.cli", "run", "tiny_gsm8k", *over]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = wait_for_checkpoint(proc, tmp_path / "b" / "out" / "checkpoints" / "latest_checkpointed_iteration.txt", 2)
    if killed:
        os.kill(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=300)
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    if killed and proc.returncode == -signal.SIGKILL:
        assert "resumed from" in again.stdout + again.stderr
    a, b = step_metrics(tmp_path / "a" / "out"), step_metrics(tmp_path / "b" / "out")
    assert sorted(b) == list(range(1, 9))
    for step in range(1, 9):
        for key in (
            "train/num_gen_batches",
            "training/filter_groups/kept_groups",
            "critic/score/mean",
            "actor/pg_loss",
        ):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-4, abs=1e-6), (step, key)
    assert _state(tmp_path / "a" / "out", 8)["dataloader"] == _state(tmp_path / "b" / "out", 8)["dataloader"]


# ---- the dapo reward manager's overlong penalty ------------------------------------------------------------
def test_overlong_penalty_values():
    # max_resp_len 20, buffer 4: expected_len 16; L=16 -> 0, L=18 -> -0.5 * 1.0, L=20 -> -1.0
    assert overlong_penalty([10, 16, 17, 18, 20], 4, 20, 1.0) == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert overlong_penalty([20], 4, 20, 0.5) == [-0.5]


def test_dapo_scores_add_the_penalty_and_log_extras():
    kwargs = {
        "max_resp_len": None,
        "overlong_buffer_cfg": {"enable": True, "len": 2, "penalty_factor": 1.0, "log": True},
    }
    scores, extras = dapo_scores([1.0, 1.0, 0.0], {}, [2, 3, 4], kwargs, max_response_length=4)
    assert scores == [1.0, 0.5, -1.0]
    assert extras == {"acc": [1.0, 1.0, 0.0], "overlong_reward": [0.0, -0.5, -1.0], "overlong": [0.0, 1.0, 1.0]}
    off = {"overlong_buffer_cfg": {"enable": False}}
    assert dapo_scores([1.0], {"acc": [0.0]}, [4], off, 4) == ([1.0], {"acc": [0.0]})


def test_dapo_reward_manager_in_a_run(tmp_path):
    """max_response_length 4, buffer 4, factor 1: every response of L tokens scores 1 - L/4."""
    rc = load_recipe(
        "tiny_gsm8k",
        _overrides(
            tmp_path,
            CONSTANT_REWARD,
            **{
                "algorithm.filter_groups.enable": "false",
                "data.gen_batch_size": "null",
                "reward_model.reward_manager": "dapo",
                "reward_model.reward_kwargs.overlong_buffer_cfg.enable": "true",
                "reward_model.reward_kwargs.overlong_buffer_cfg.len": 4,
                "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor": 1.0,
                "reward_model.reward_kwargs.overlong_buffer_cfg.log": "true",
            },
        ),
    )
    assert run_training(rc) == 0
    row = step_metrics(tmp_path / "out")[1]
    length = row["response_length/mean"]
    assert row["critic/score/mean"] == pytest.approx(1.0 - length / 4, abs=1e-5)
    assert row["critic/score/overlong_reward/mean"] == pytest.approx(-length / 4, abs=1e-5)
    assert "critic/score/acc/mean" in row and row["critic/score/acc/mean"] == pytest.approx(1.0)


# ---- config -------------------------------------------------------------------------------------------------
BASE = ["actor_rollout_ref.model.path=tiny://qwen2"]


@pytest.mark.parametrize(
    "overrides,key,fragment",
    [
        (
            ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=null"],
            "algorithm.filter_groups.metric",
            "must be set",
        ),
        (
            ["algorithm.filter_groups.enable=true", "actor_rollout_ref.rollout.n=1"],
            "actor_rollout_ref.rollout.n",
            "at least 2 responses",
        ),
        (
            [
                "algorithm.filter_groups.enable=true",
                "algorithm.filter_groups.metric=seq_final_reward",
                "algorithm.use_kl_in_reward=true",
            ],
            "algorithm.filter_groups.metric",
            "not known when groups",
        ),
        (
            [
                "reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
                "reward_model.reward_kwargs.overlong_buffer_cfg.len=2",
            ],
            "reward_model.reward_manager",
            "set reward_model.",
        ),
        (
            ["reward_model.reward_manager=dapo", "reward_model.reward_kwargs.overlong_buffer_cfg.enable=true"],
            "reward_model.reward_kwargs.overlong_buffer_cfg.len",
            "must be positive",
        ),
        (
            [
                "reward_model.reward_manager=dapo",
                "reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
                "reward_model.reward_kwargs.overlong_buffer_cfg.len=300",
                "reward_model.reward_kwargs.max_resp_len=256",
            ],
            "reward_model.reward_kwargs.overlong_buffer_cfg.len",
            "longer than max_resp_len=256",
        ),
        (["data.gen_batch_size=0"], "data.gen_batch_size", ""),
        (
            ["algorithm.filter_groups.enable=true", "data.gen_batch_size=3", "trainer.n_gpus_per_node=2"],
            "data.gen_batch_size",
            "3 prompts cannot be split evenly over the 2 rollout groups",
        ),
    ],
)
def test_dapo_config_refusals(overrides, key, fragment):
    with pytest.raises(ConfigErrors) as err:
        load_recipe("tiny_gsm8k", BASE + overrides)
    problems = [p for p in err.value.problems if p.key.removeprefix("backend_config.") == key]
    assert problems, str(err.value)
    assert fragment in str(err.value)


def test_dapo_keys_are_accepted_and_the_old_overlong_spelling_warns():
    rc = load_recipe(
        "tiny_gsm8k",
        BASE
        + [
            "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.metric=acc",
            "algorithm.filter_groups.max_num_gen_batches=10",
            "data.gen_batch_size=16",
            "reward_model.reward_manager=dapo",
            "reward_model.overlong_buffer.enable=true",
            "reward_model.overlong_buffer.len=2",
            "reward_model.overlong_buffer.penalty_factor=1.0",
        ],
    )
    ob = rc.backend.reward_model.reward_kwargs.overlong_buffer_cfg
    assert (ob.enable, ob.len, ob.penalty_factor) == (True, 2, 1.0)
    assert any(
        "reward_model.overlong_buffer.len is the DAPO recipe's older spelling of "
        "reward_model.reward_kwargs.overlong_buffer_cfg.len" in w
        for w in rc.warnings
    )
    plain = load_recipe("tiny_gsm8k", BASE + ["data.gen_batch_size=16"])
    assert any("data.gen_batch_size=16 has no effect" in w for w in plain.warnings)


def test_metric_values_read_extras_and_name_a_missing_one():
    from verl_npu.errors import UserError
    from verl_npu.trainer.dynamic_sampling import metric_values

    scores = torch.tensor([[0.0, 2.0], [0.0, 1.0]])
    batch = Batch({"token_level_scores": scores}, {"uid": ["a", "a"]})
    batch.meta["reward_extras"] = {"accuracy": [1.0, 0.0]}
    assert metric_values(batch, "seq_reward") == [2.0, 1.0]
    assert metric_values(batch, "acc") == [2.0, 1.0]  # no extra 'acc': the summed score
    assert metric_values(batch, "accuracy") == [1.0, 0.0]
    with pytest.raises(UserError, match=r"metric='format' is not a reward extra of this run \(extras: accuracy\)"):
        metric_values(batch, "format")


def test_the_dapo_scripts_plus_spelling_of_reward_kwargs_loads():
    """verl's DAPO scripts add the reward kwargs with Hydra's +."""
    rc = load_recipe(
        "tiny_gsm8k",
        BASE
        + [
            "data.max_response_length=64",
            "algorithm.filter_groups.enable=True",
            "algorithm.filter_groups.metric=acc",
            "data.gen_batch_size=48",
            "reward_model.reward_manager=dapo",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.len=16",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
            "+reward_model.reward_kwargs.max_resp_len=64",
        ],
    )
    kwargs = rc.backend.reward_model.reward_kwargs
    assert kwargs.max_resp_len == 64 and kwargs.overlong_buffer_cfg.len == 16 and not rc.warnings
