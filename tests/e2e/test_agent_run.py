"""A multi-turn run end to end on the CPU (recipes/tiny_tool_gsm8k.yaml, 2 steps) and the refusal of a tool
that cannot be built before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_helpers import run_overrides

from verl_npu.config import load_recipe
from verl_npu.data.gsm8k_multiturn import prepare_synthetic
from verl_npu.errors import UserError
from verl_npu.trainer.entry import run_training

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "examples" / "tool_config" / "gsm8k_tool_config.yaml"


def overrides(tmp_path: Path, data: Path, **extra) -> list[str]:
    return run_overrides(
        tmp_path / "out",
        data,
        {
            "data.train_batch_size": 4,
            "data.max_response_length": 64,
            "actor_rollout_ref.rollout.n": 2,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,  # two updates: old log-probs
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
            "actor_rollout_ref.actor.use_kl_loss": "true",
            "actor_rollout_ref.actor.kl_loss_coef": 0.01,  # the reference too
            "actor_rollout_ref.rollout.multi_turn.tool_config_path": TOOLS,
            "trainer.total_training_steps": 2,
            "trainer.test_freq": 2,
            "trainer.save_freq": 2,
            "trainer.rollout_data_dir": tmp_path / "rollouts",
        },
        extra,
    )


def test_tiny_tool_gsm8k_runs_two_steps_with_the_tool_configured(tmp_path):
    data = tmp_path / "data"
    prepare_synthetic(data, 16, 4)
    import pyarrow.parquet as pq

    row = pq.read_table(data / "train.parquet").to_pylist()[0]  # verl's multi-turn format
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and row["agent_name"] == "tool_agent"
    assert (
        row["extra_info"]["tools_kwargs"]["calc_gsm8k_reward"]["create_kwargs"]["ground_truth"]
        == row["reward_model"]["ground_truth"]
    )
    # calculate_log_probs: the rollout's log-probs of the model's tokens, compared by the trainer with the actor's
    rc = load_recipe(
        "tiny_tool_gsm8k", overrides(tmp_path, data, **{"actor_rollout_ref.rollout.calculate_log_probs": "true"})
    )
    assert run_training(rc) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "training/global_step" in r]
    assert [r["training/global_step"] for r in train] == [1.0, 2.0]
    for r in train:
        assert r["num_turns/min"] >= 2 and r["tool_call_counts/min"] >= 0
        assert r["response_length/max"] <= 64 and "actor/kl_loss" in r
        assert r["training/rollout_probs_diff_max"] < 1e-4  # fp32 on CPU: the same distribution
    assert "val-aux/num_turns/mean" in rows[-1] and "val-core/synthetic_arithmetic/reward/mean@1" in rows[-1]
    dumped = [json.loads(line) for line in (tmp_path / "rollouts" / "1.jsonl").read_text().splitlines()]
    assert len(dumped) == 8 and all(d["turns"][0]["role"] == "assistant" and d["turns"][0]["trained"] for d in dumped)
    assert (tmp_path / "out" / "checkpoints" / "global_step_2").is_dir()


def test_a_tool_class_that_cannot_be_built_stops_the_run_before_it_starts(tmp_path):
    data = tmp_path / "data"
    prepare_synthetic(data, 8, 2)
    (tmp_path / "t.py").write_text("class Other:\n    pass\n")
    cfg = tmp_path / "tools.yaml"
    cfg.write_text(f"tools:\n  - class_name: {tmp_path / 't.py'}:Missing\n    config: {{type: native}}\n")
    rc = load_recipe(
        "tiny_tool_gsm8k", overrides(tmp_path, data, **{"actor_rollout_ref.rollout.multi_turn.tool_config_path": cfg})
    )
    with pytest.raises(UserError, match=r"tools\[0\]\.class_name: .* has no class 'Missing'"):
        run_training(rc)
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_two_workers_train_a_multi_turn_recipe_like_one(tmp_path):
    """Ray with 2 CPU workers (FSDP2, hf rollout synced across ranks) against 1 worker: same metrics."""
    from run_helpers import step_metrics, write_varied_reward

    data = tmp_path / "data"
    prepare_synthetic(data, 16, 4)
    reward = write_varied_reward(tmp_path / "reward.py")  # a reward that varies, so the updates differ from 0
    runs = {}
    for gpus in (1, 2):
        out = tmp_path / f"w{gpus}"
        rc = load_recipe(
            "tiny_tool_gsm8k",
            overrides(
                out,
                data,
                **{
                    "trainer.n_gpus_per_node": gpus,
                    "ray_init.num_cpus": 2,
                    "custom_reward_function.path": reward,
                    "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
                    "trainer.test_freq": -1,
                    "trainer.rollout_data_dir": "null",
                },
            ),
        )
        assert run_training(rc) == 0
        runs[gpus] = step_metrics(out / "out")
    for step in (1, 2):
        for key in (
            "critic/score/mean",
            "num_turns/mean",
            "tool_call_counts/mean",
            "response_length/mean",
            "actor/pg_loss",
            "actor/kl_loss",
            "actor/grad_norm",
        ):
            assert runs[2][step][key] == pytest.approx(runs[1][step][key], rel=1e-4, abs=1e-5), (step, key)
    assert runs[1][2]["actor/grad_norm"] > 0
