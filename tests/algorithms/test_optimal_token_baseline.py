"""verl 0.9.1's optimal token baseline (`algorithm.adv_estimator=optimal_token_baseline` /
`tir_optimal_token_baseline`) with `actor.calculate_sum_pi_squared`: the actor's sum of squared probabilities
on every forward path, the estimator's formula worked out by hand, the config rule, and a tiny CPU run.
(Equality with verl's own estimator on the same inputs: tests/algorithms/test_verl_algorithms.py, verl side venv.)"""

from __future__ import annotations

import pytest
import torch
from run_helpers import step_metrics, text_data, text_run_overrides
from transformers import AutoModelForCausalLM

from verl_npu import algorithms as A
from verl_npu.config import load_recipe
from verl_npu.config.typed import section
from verl_npu.errors import ConfigErrors
from verl_npu.models.forward import response_log_probs, sum_pi_squared
from verl_npu.trainer import ppo
from verl_npu.trainer.entry import run_training
from verl_npu.workers.actor import old_log_prob_pass_needed

OTB = ["algorithm.adv_estimator=optimal_token_baseline", "actor_rollout_ref.actor.calculate_sum_pi_squared=true"]


def test_sum_pi_squared_is_the_sum_of_squared_softmax_chunked_or_not():
    logits = torch.randn(3, 5, 41, generator=torch.Generator().manual_seed(0)) * 4
    expected = torch.softmax(logits, -1).pow(2).sum(-1)
    torch.testing.assert_close(sum_pi_squared(logits), expected)
    torch.testing.assert_close(sum_pi_squared(logits, chunk=4), expected)
    uniform = sum_pi_squared(torch.zeros(1, 41))
    assert float(uniform) == pytest.approx(1 / 41)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_the_forward_gives_sum_pi_squared_of_the_scaled_distribution(tiny_lm_path, remove_padding):
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (3, 12), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding of a short prompt
    mask[1, 10:] = 0  # a short response
    with torch.no_grad():
        lp, ent, spsq = response_log_probs(
            model,
            ids,
            mask,
            5,
            temperature=0.7,
            with_entropy=True,
            remove_padding=remove_padding,
            with_sum_pi_squared=True,
        )
        lp_ref, ent_ref, logits = response_log_probs(
            model, ids, mask, 5, temperature=0.7, with_entropy=True, return_logits=True
        )
        # the fused projection never holds the logits: a Σπ² pass runs unfused, with the same numbers
        fused = response_log_probs(
            model,
            ids,
            mask,
            5,
            temperature=0.7,
            with_entropy=True,
            fused=True,
            remove_padding=remove_padding,
            with_sum_pi_squared=True,
        )
    resp = mask[:, -5:].bool()
    expected = torch.softmax(logits.float(), -1).pow(2).sum(-1)
    torch.testing.assert_close(spsq[resp], expected[resp], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(lp[resp], lp_ref[resp], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused[2][resp], spsq[resp], atol=1e-6, rtol=1e-5)
    # the sampled token's own probability is one term of the sum
    assert bool((spsq[resp] >= lp[resp].exp() ** 2 - 1e-6).all()) and bool((spsq[resp] <= 1 + 1e-6).all())
    with pytest.raises(ValueError, match="exclusive"):
        response_log_probs(model, ids, mask, 5, return_logits=True, with_sum_pi_squared=True)


def test_otb_by_hand():
    """Two rows of one prompt, 2 tokens each, outcome rewards 1 and 0: w = 1 - 2π + Σπ², W its running sum,
    B_t = Σ G·W / Σ W per column."""
    mask = torch.ones(2, 2, dtype=torch.float64)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    pi = torch.tensor([[0.5, 0.5], [0.9, 0.1]], dtype=torch.float64)
    spsq = torch.tensor([[0.5, 0.25], [0.82, 0.5]], dtype=torch.float64)
    adv, ret = A.compute_advantages(
        "optimal_token_baseline",
        token_level_rewards=rewards,
        response_mask=mask,
        group_ids=["p", "p"],
        old_log_probs=pi.log(),
        sum_pi_squared=spsq,
        config=section("algorithm"),
    )
    w = 1 - 2 * pi + spsq  # [[0.5, 0.25], [0.02, 0.8]]
    big_w = w.cumsum(-1)  # [[0.5, 0.75], [0.02, 0.82]]
    g = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    baseline = (g * big_w).sum(0) / (big_w.sum(0) + 1e-8)
    torch.testing.assert_close(ret, g)
    torch.testing.assert_close(adv, g - baseline)
    # the first token of row 0 (low path variance in row 1) gets nearly all of the reward: B_0 = 0.5/0.52
    assert float(adv[0, 0]) == pytest.approx(1 - 0.5 / 0.52, rel=1e-6)
    with pytest.raises(Exception, match="calculate_sum_pi_squared=true"):
        A.compute_advantages(
            "optimal_token_baseline",
            token_level_rewards=rewards,
            response_mask=mask,
            group_ids=["p", "p"],
            config=section("algorithm"),
        )


def test_config_needs_calculate_sum_pi_squared_and_forces_the_old_log_prob_pass():
    with pytest.raises(ConfigErrors) as err:
        load_recipe("tiny_gsm8k", ["algorithm.adv_estimator=tir_optimal_token_baseline"])
    [problem] = [
        p for p in err.value.problems if p.key == "backend_config.actor_rollout_ref.actor.calculate_sum_pi_squared"
    ]
    assert "tir_optimal_token_baseline" in problem.message and "calculate_sum_pi_squared=true" in problem.fix
    rc = load_recipe("tiny_gsm8k", OTB)
    assert rc.backend.actor_rollout_ref.actor.calculate_sum_pi_squared is True
    reasons = old_log_prob_pass_needed(rc.backend, torch.nn.Linear(1, 1))
    assert any("calculate_sum_pi_squared" in r for r in reasons)


def test_a_run_feeds_the_actors_sum_pi_squared_to_the_estimator(tmp_path, monkeypatch):
    seen = []
    real = A.compute_advantages

    def spy(name, **kwargs):
        seen.append((name, kwargs))
        return real(name, **kwargs)

    monkeypatch.setattr(ppo.algorithms, "compute_advantages", spy)
    data = text_data(tmp_path / "data", rows=8)
    overrides = text_run_overrides(
        tmp_path / "out",
        data,
        **{
            "algorithm.adv_estimator": "optimal_token_baseline",
            "actor_rollout_ref.actor.calculate_sum_pi_squared": "true",
            "actor_rollout_ref.rollout.n": 4,
            "trainer.total_training_steps": 1,
        },
    )
    assert run_training(load_recipe("tiny_gsm8k", overrides)) == 0
    [(name, kw)] = seen
    mask = kw["response_mask"].bool()
    spsq, old = kw["sum_pi_squared"], kw["old_log_probs"]
    assert name == "optimal_token_baseline" and spsq.shape == old.shape == mask.shape
    # aligned with the sampled tokens: every response position's sum holds its own token's p^2
    assert bool((spsq[mask] >= old[mask].exp() ** 2 - 1e-5).all()) and bool((spsq[mask] <= 1 + 1e-5).all())
    row = step_metrics(tmp_path / "out")[1]
    assert all(row[k] == row[k] for k in ("critic/advantages/max", "actor/pg_loss"))  # finite, no NaN
    # verl's variance proxies come with sum_pi_squared (their values: tests/algorithms/test_verl_algorithms.py)
    assert row["variance_proxy/expected_w"] > 0
    assert row["variance_proxy/proxy1_signal_strength"] == pytest.approx(row["actor/grad_norm"] ** 2, rel=1e-5)


# the settings of upstream verl's examples/otb_trainer/run_qwen3_8b_fsdp.sh (its defaults; paths changed)
OTB_SCRIPT = [
    "algorithm.use_kl_in_reward=False",
    "data.train_batch_size=128",
    "data.max_prompt_length=1024",
    "data.max_response_length=2048",
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=128",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.calculate_sum_pi_squared=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.75",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24576",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=24576",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "trainer.balance_batch=True",
    "trainer.critic_warmup=0",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
    "af_output_dir=/tmp/otb",
    "actor_rollout_ref.model.path=/models/Qwen3-8B",
    "data.train_files=[/data/gsm8k/train.parquet,/data/math/train.parquet]",
    "data.val_files=[/data/gsm8k/test.parquet,/data/math/test.parquet]",
]


@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_verls_otb_example_settings_validate(estimator):
    rc = load_recipe("qwen25_gsm8k", OTB_SCRIPT + [f"algorithm.adv_estimator={estimator}"])
    assert rc.backend.algorithm.adv_estimator == estimator
    assert not [w for w in rc.warnings if "sum_pi" in w or "estimator" in w]
