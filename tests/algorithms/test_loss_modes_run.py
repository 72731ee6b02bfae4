"""The new policy loss modes and estimators inside a real (tiny, CPU) training run: the actor hands each
loss its config section, modes without clip metrics log none, and every step updates the policy."""

from __future__ import annotations

import pytest
from test_e2e_cpu import _gsm8k_like, read_metrics, tiny_overrides

from verl_npu.config import load_recipe
from verl_npu.trainer.entry import run_training

CASES = [
    # (loss_mode, adv_estimator, loss_agg_mode, extra overrides)
    (
        "clip_cov",
        "grpo_passk",
        "token-mean",
        {
            "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": 0.2,
            "actor_rollout_ref.actor.policy_loss.clip_cov_lb": -10.0,
        },
    ),
    ("gpg", "gpg", "token-sum", {}),
    ("sapo", "opo", "seq-mean-token-mean", {"actor_rollout_ref.actor.tau_neg": 1.2}),
    ("dro", "grpo_vectorized", "seq-mean-token-sum", {"actor_rollout_ref.actor.policy_loss.dro_beta": 0.1}),
    ("gspo", "rloo_vectorized", "seq-mean-token-mean", {}),
]


@pytest.mark.parametrize("loss_mode, estimator, agg, extra", CASES, ids=[c[0] for c in CASES])
def test_loss_mode_trains(tmp_path, tiny_lm_path, loss_mode, estimator, agg, extra):
    data = _gsm8k_like(tmp_path / "gsm")
    reward = tmp_path / "dense.py"  # varied scores, so that groups differ and advantages are not all zero
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return (sum(map(ord, solution_str)) % 7) / 7\n"
    )
    rc = load_recipe(
        "tiny_geo3k",
        tiny_overrides(
            tmp_path,
            data,
            **{
                "actor_rollout_ref.model.path": "tiny://qwen2",
                "data.max_prompt_length": 48,
                "actor_rollout_ref.actor.policy_loss.loss_mode": loss_mode,
                "algorithm.adv_estimator": estimator,
                "actor_rollout_ref.actor.loss_agg_mode": agg,
                "trainer.total_training_steps": 1,
                "trainer.save_freq": -1,
                "trainer.test_freq": -1,
                "custom_reward_function.path": reward,
                **extra,
            },
        ),
    )
    assert run_training(rc) == 0
    [row] = read_metrics(tmp_path / "out")
    assert row["actor/pg_loss"] is not None and row["actor/grad_norm"] > 0
    if loss_mode in ("gpg", "dro"):  # verl logs no clip fractions for these modes
        assert "actor/pg_clipfrac" not in row
    else:
        assert "actor/pg_clipfrac" in row
    if loss_mode == "clip_cov":  # a wide band and budget: some tokens lose their gradient
        assert row["actor/pg_clipfrac"] > 0


def test_gdpo_trains_on_the_reward_functions_components(tmp_path):
    """gdpo normalises each component the reward function returns (here two of a dict) in its group:
    the trainer hands the estimator the step's reward extras."""
    data = _gsm8k_like(tmp_path / "gsm")
    reward = tmp_path / "parts.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    a, b = sum(map(ord, solution_str)) % 5 / 5, len(solution_str) % 3 / 3\n"
        "    return {'score': a + b, 'fmt': a, 'acc': b}\n"
    )
    rc = load_recipe(
        "tiny_geo3k",
        tiny_overrides(
            tmp_path,
            data,
            **{
                "actor_rollout_ref.model.path": "tiny://qwen2",
                "data.max_prompt_length": 48,
                "algorithm.adv_estimator": "gdpo",
                "algorithm.gdpo_reward_keys": "[fmt,acc]",
                "algorithm.gdpo_reward_weights": "[1.0,2.0]",
                "trainer.total_training_steps": 1,
                "trainer.save_freq": -1,
                "trainer.test_freq": -1,
                "custom_reward_function.path": reward,
            },
        ),
    )
    assert run_training(rc) == 0
    [row] = read_metrics(tmp_path / "out")
    assert row["actor/grad_norm"] > 0 and row["critic/advantages/max"] > 0 > row["critic/advantages/min"]
