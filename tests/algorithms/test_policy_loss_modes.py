"""The loss modes of verl_npu.algorithms.policy_loss_modes and the estimators of verl_npu.algorithms.advantage_modes
against values worked out by hand on small tensors (tests/algorithms/test_verl_algorithms.py compares them with verl itself)."""

import math

import pytest
import torch

from verl_npu import algorithms as A
from verl_npu.algorithms.advantage_modes import gdpo_advantage
from verl_npu.config.typed import section
from verl_npu.errors import UserError
from verl_npu.registry import POLICY_LOSSES

POLICY_LOSS_MODES = POLICY_LOSSES.specs

D = torch.float64
SETTINGS = {
    "tau_pos": 1.0,
    "tau_neg": 1.05,
    "policy_loss": {
        "clip_cov_ratio": 0.0002,
        "clip_cov_lb": 0.5,
        "clip_cov_ub": 5.0,
        "kl_cov_ratio": 0.25,
        "ppo_kl_coef": 0.3,
        "dro_beta": 0.5,
    },
}


def t(rows):
    return torch.tensor(rows, dtype=D)


def close(actual, expected, tol=1e-7):  # the 1e-8 guards of the sequence means
    torch.testing.assert_close(torch.as_tensor(actual, dtype=D), torch.as_tensor(expected, dtype=D), atol=tol, rtol=tol)


def run(mode, logp, old, adv, mask, agg="token-mean", low=0.2, high=0.2, c=3.0, config=SETTINGS, **kw):
    logp = logp.clone().requires_grad_(True)
    out = A.policy_loss_fn(mode)(logp, old, adv, mask, low, high, c, agg, config=config, **kw)
    out["pg_loss"].backward()
    return out, logp.grad


def test_every_mode_is_registered_under_its_name():
    assert set(A.POLICY_LOSSES) == set(POLICY_LOSS_MODES)
    for mode in POLICY_LOSS_MODES:
        assert A.policy_loss_fn(mode) is A.POLICY_LOSSES[mode]


def test_gspo_uses_the_length_normalised_sequence_ratio_for_every_token():
    # d = [ln 2, 0, 0] on 3 tokens (+ a padded token with a huge ratio that must not count): s = ln2/3, r = 2^(1/3)
    logp = t([[math.log(2.0), 0.0, 0.0, 30.0]]) - 1.0
    old = torch.full((1, 4), -1.0, dtype=D)
    mask = t([[1, 1, 1, 0]])
    r = 2 ** (1 / 3)
    out, grad = run("gspo", logp, old, t([[1.0, 1.0, 1.0, 1.0]]), mask, high=0.28)
    close(out["pg_loss"], -r)  # 1.26 < 1.28: not clipped
    close(grad, [[-r / 3, -r / 3, -r / 3, 0.0]])  # even the token with d = 0 gets the sequence ratio's gradient
    assert out["pg_clipfrac"] == 0 and out["pg_clipfrac_lower"] == 0
    out, grad = run("gspo", logp, old, t([[1.0, 1.0, 1.0, 1.0]]), mask, high=0.2)  # 1.26 > 1.2: clipped
    close(out["pg_loss"], -1.2)
    close(grad, torch.zeros(1, 4))
    close(out["pg_clipfrac"], 1.0)
    close(out["ppo_kl"], -math.log(2.0) / 3)


def test_sapo_gate_at_ratio_one_and_its_own_aggregation():
    # r = 1: gate = sigmoid(0)·4/τ = 2/τ, L = -2A/τ; d gate / d logp = τ·¼·4/τ = 1, so dL/dlogp = -A
    logp = t([[-1.0, -2.0], [-1.0, -3.0]])
    adv = t([[1.0, 1.0], [-1.0, -1.0]])
    mask = t([[1, 1], [1, 0]])
    out, grad = run("sapo", logp, logp.clone(), adv, mask, agg="token-sum")  # loss_agg_mode is not used
    close(out["pg_loss"], (-2.0 + 2 / 1.05) / 2)  # seq-mean-token-mean: row means -2 and 2/1.05, mean of rows
    close(grad, [[-0.5 / 2, -0.5 / 2], [1.0 / 2, 0.0]])
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.tau_pos"):
        run("sapo", logp, logp.clone(), adv, mask, config={})


def test_gpg_is_the_plain_policy_gradient():
    logp, adv, mask = t([[-1.0, -2.0, -5.0]]), t([[2.0, -1.0, 9.0]]), t([[1, 1, 0]])
    out, grad = run("gpg", logp, logp + 3.0, adv, mask)
    close(out["pg_loss"], (2.0 - 2.0) / 2)
    close(grad, [[-1.0, 0.5, 0.0]])
    assert set(out) == {"pg_loss"}  # verl logs no clip metrics for gpg


def test_clip_cov_drops_the_gradient_of_covariance_outliers():
    # ratio 1 everywhere; A = [1, 0, -1, 0], logp - mean = [1, 0, -1, 0]: cov = [1, 0, 1, 0]; lb 0.5 -> 2 candidates
    logp, adv, mask = t([[-1.0, -2.0, -3.0, -2.0]]), t([[1.0, 0.0, -1.0, 0.0]]), torch.ones(1, 4, dtype=D)
    dropped = set()
    for seed in range(12):
        torch.manual_seed(seed)
        out, grad = run("clip_cov", logp, logp.clone(), adv, mask)  # budget max(int(0.0002·4), 1) = 1
        zero = {i for i in (0, 2) if grad[0, i] == 0}
        assert len(zero) == 1, grad  # exactly one candidate lost its gradient, the other keeps -A·r/4
        other = ({0, 2} - zero).pop()
        close(grad[0, other], -adv[0, other] / 4)
        close(out["pg_clipfrac"], 0.25)
        dropped |= zero
    assert dropped == {0, 2}  # chosen at random
    wide = {**SETTINGS, "policy_loss": {**SETTINGS["policy_loss"], "clip_cov_ratio": 0.5}}  # budget 2: both
    out, grad = run("clip_cov", logp, logp.clone(), adv, mask, config=wide)
    close(grad, torch.zeros(1, 4))
    close(out["pg_clipfrac"], 0.5)
    assert "pg_clipfrac_lower" not in out


def test_kl_cov_penalises_the_top_covariance_token():
    # logp - mean = [1, 0, -1.5, 0.5], A = [1, 0, -1, 0]: cov = [1, 0, 1.5, 0]; kl_cov_ratio 0.25 of 4 -> token 2
    logp, adv, mask = t([[-1.0, -2.0, -3.5, -1.5]]), t([[1.0, 0.0, -1.0, 0.0]]), torch.ones(1, 4, dtype=D)
    old = logp - t([[0.0, 0.0, 0.2, 0.0]])  # d = 0.2 on token 2
    out, grad = run("kl_cov", logp, old, adv, mask)
    close(out["pg_loss"], (-1.0 + math.exp(0.2) + 0.3 * 0.2) / 4)
    close(grad, [[-0.25, 0.0, (math.exp(0.2) + 0.3) / 4, 0.0]])
    close(out["ppo_kl"], 0.05)  # mean |d|
    assert set(out) == {"pg_loss", "ppo_kl"}


def test_geo_mean_clips_only_the_growing_side_per_token():
    logp = torch.full((2, 2), -1.0, dtype=D)
    old = logp - t([[0.1, 0.3], [-0.1, -0.3]])
    adv = t([[1.0, 1.0], [-1.0, -1.0]])
    out, grad = run("geo_mean", logp, old, adv, torch.ones(2, 2, dtype=D))
    # row 0 (A > 0): kept log-ratios [0.1, 0.2]; row 1 (A < 0): [-0.1, -0.2]; loss mean over the 2 rows
    close(out["pg_loss"], (-math.exp(0.15) + math.exp(-0.15)) / 2)
    close(grad, [[-math.exp(0.15) / 4, 0.0], [math.exp(-0.15) / 4, 0.0]])
    close(out["pg_clipfrac"], 0.25)
    close(out["pg_clipfrac_lower"], 0.25)
    # with global counts of a larger mini-batch: the sum over rows / global rows · dp
    out, _ = run("geo_mean", logp, old, adv, torch.ones(2, 2, dtype=D), global_seqs=8, dp_size=2, global_tokens=1)
    close(out["pg_loss"], (-math.exp(0.15) + math.exp(-0.15)) / 8 * 2)


def test_cispo_weights_log_prob_by_the_clipped_ratio_without_its_gradient():
    logp = t([[math.log(0.6), math.log(0.3)]])
    old = t([[math.log(0.4), math.log(0.3)]])  # ratios 1.5 and 1
    adv = t([[2.0, -1.0]])
    out, grad = run("cispo", logp, old, adv, torch.ones(1, 2, dtype=D), agg="token-sum", high=0.28)
    close(out["pg_loss"], -1.28 * 2.0 * math.log(0.6) + 1.0 * math.log(0.3))
    close(grad, [[-1.28 * 2.0, 1.0]])
    close(out["pg_clipfrac"], 0.5)


def test_dppo_tv_masks_tokens_outside_the_probability_trust_region():
    p, q = t([[0.5, 0.3, 0.1, 0.9]]), t([[0.2, 0.2, 0.4, 0.2]])
    adv = t([[1.0, 1.0, -1.0, -1.0]])
    out, grad = run("dppo_tv", p.log(), q.log(), adv, torch.ones(1, 4, dtype=D), agg="token-sum")
    # token 0: p - q = 0.3 > 0.2 out; 1: kept, weight 1.5; 2: p - q = -0.3 < -0.2 out; 3: kept, weight min(4.5, 3)
    close(grad, [[0.0, -1.5, 0.0, 3.0]])
    close(out["pg_loss"], -1.5 * math.log(0.3) + 3.0 * math.log(0.9))
    close(out["pg_clipfrac"], 0.5)
    close(out["pg_clipfrac_lower"], 0.25)  # token 3: ratio above clip_ratio_c and kept


def test_dppo_kl_uses_the_binary_kl_of_the_sampled_token():
    p, q = t([[0.5, 0.1]]), t([[0.2, 0.2]])
    kl = 0.2 * math.log(0.2 / 0.5) + 0.8 * math.log(0.8 / 0.5)  # about 0.193
    adv = t([[1.0, 1.0]])
    _, grad = run("dppo_kl", p.log(), q.log(), adv, torch.ones(1, 2, dtype=D), agg="token-sum", high=0.2)
    close(grad, [[-2.5, -0.5]])  # 0.193 <= 0.2 kept (weight 2.5); token 1: p < q always kept for A > 0
    out, grad = run("dppo_kl", p.log(), q.log(), adv, torch.ones(1, 2, dtype=D), agg="token-sum", high=kl - 1e-3)
    close(grad, [[0.0, -0.5]])
    close(out["pg_clipfrac"], 0.5)


def test_dro_quadratic_penalty_and_its_setting():
    logp, old = t([[-1.0]]), t([[-1.5]])  # d = 0.5
    out, grad = run("dro", logp, old, t([[1.0]]), torch.ones(1, 1, dtype=D), agg="token-sum")
    close(out["pg_loss"], -(-1.0 - 0.5 * 0.5 * 0.25))
    close(grad, [[-1.0 + 0.5 * 0.5]])
    no_beta = {**SETTINGS, "policy_loss": {**SETTINGS["policy_loss"], "dro_beta": None}}
    with pytest.raises(ValueError, match="policy_loss.dro_beta"):
        run("dro", logp, old, t([[1.0]]), torch.ones(1, 1, dtype=D), config=no_beta)


# ----------------------------------------------------------------------------- estimators

MASK = t([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]])
REWARDS = t([[0, 1, 0], [0, 0, 0], [0, 0, 3], [0, 2, 0], [5, 0, 0]])  # scores 1, 0, 3 | 2 | 5
UIDS = ["a", "a", "a", "b", "c"]


def adv_of(name, uids=UIDS, config=None):
    adv, ret = A.compute_advantages(
        name, token_level_rewards=REWARDS, response_mask=MASK, group_ids=uids, config=section("algorithm", config)
    )
    assert torch.equal(adv, ret)
    return adv


def test_opo_length_weighted_baseline():
    baseline = (2 * 1 + 1 * 0 + 3 * 3) / 6  # lengths 2, 1, 3
    close(adv_of("opo"), t([1 - baseline, -baseline, 3 - baseline, 2, 5]).unsqueeze(-1) * MASK)


def test_grpo_passk_only_the_best_of_a_group():
    uids = ["a", "a", "a", "b", "b"]  # b = {2, 5}
    std_a, std_b = math.sqrt(7 / 3), math.sqrt(4.5)
    expected = t([0, 0, 2 / (std_a + 1e-6), 0, 3 / (std_b + 1e-6)])
    close(adv_of("grpo_passk", uids), expected.unsqueeze(-1) * MASK)
    close(adv_of("grpo_passk", uids, {"norm_adv_by_std_in_grpo": False}), t([0, 0, 2, 0, 3]).unsqueeze(-1) * MASK)
    with pytest.raises(ValueError, match="at least 2"):
        adv_of("grpo_passk")


def test_gpg_advantage_scales_by_the_share_of_nonzero_scores():
    alpha = 5 / 4  # 4 of the 5 scores are non-zero
    expected = t([1 - 4 / 3, -4 / 3, 3 - 4 / 3, 2, 5]) * alpha
    close(adv_of("gpg"), expected.unsqueeze(-1) * MASK)


def test_vectorized_estimators():
    close(adv_of("grpo_vectorized"), adv_of("grpo"), tol=1e-6)  # float32 group statistics
    close(
        adv_of("grpo_vectorized", config={"norm_adv_by_std_in_grpo": False}),
        adv_of("grpo", config={"norm_adv_by_std_in_grpo": False}),
        tol=1e-6,
    )
    # rloo_vectorized: like rloo, but a group of one gets 0 (rloo gives it its score)
    close(adv_of("rloo_vectorized"), t([1 - 1.5, 0 - 2, 3 - 0.5, 0, 0]).unsqueeze(-1) * MASK)


def test_gdpo_normalises_each_component_in_its_group_then_whitens():
    mask = torch.ones(2, 2, dtype=D)
    config = section("algorithm", {"gdpo_reward_keys": ["x", "y"], "gdpo_reward_weights": [1.0, 3.0]})
    adv, _ = gdpo_advantage(
        torch.zeros(2, 2, dtype=D), mask, ["g", "g"], config, reward_components={"x": [0.0, 1.0], "y": [2.0, 0.0]}
    )
    # per component ±1/√2; sum = ±√2 (row 0 +, row 1 -); whitened over 4 tokens (unbiased var 8/3): ±√(3/4)
    close(adv, t([[1, 1], [-1, -1]]) * math.sqrt(0.75), tol=1e-6)
    with pytest.raises(UserError, match=r"gdpo_reward_keys \['x', 'y'\] must all be keys .* returned \['x'\]"):
        gdpo_advantage(torch.zeros(2, 2, dtype=D), mask, ["g", "g"], config, reward_components={"x": [0, 1]})
    with pytest.raises(UserError, match="1 of 2 rows' rewards have no 'y'"):
        gdpo_advantage(
            torch.zeros(2, 2, dtype=D),
            mask,
            ["g", "g"],
            config,
            reward_components={"x": [0.0, 1.0], "y": [2.0, float("nan")]},
        )
    with pytest.raises(UserError, match="has 1 weights for 2 gdpo_reward_keys"):
        gdpo_advantage(
            torch.zeros(2, 2, dtype=D),
            mask,
            ["g", "g"],
            config.replace(gdpo_reward_weights=[1.0]),
            reward_components={"x": [0.0, 1.0], "y": [2.0, 0.0]},
        )
