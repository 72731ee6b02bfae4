"""verl_npu.algorithms against values computed by hand on small tensors."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from verl_npu import algorithms as A
from verl_npu.config.typed import section
from verl_npu.errors import UserError


def algorithm(tree=None):
    """The typed `algorithm` section (the keys `tree` lacks at the schema's defaults)."""
    return section("algorithm", tree)


ALGO = algorithm()  # every key at the schema's default


def as64(value):
    return torch.as_tensor(value, dtype=torch.float64)


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(as64(actual), as64(expected), atol=tol, rtol=tol)


# ----------------------------------------------------------------------------- advantages

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
# sequence scores: row0 = 1, row1 = 0, row2 = 3, row3 = 2, row4 = 5 (reward on the last token)
REWARDS = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 2.0, 0.0], [5.0, 0.0, 0.0]])
UIDS = ["a", "a", "a", "b", "c"]  # group a = {1, 0, 3}, group b = {2}, group c = {5}


def test_grpo_normalised_by_unbiased_std_and_group_of_one():
    adv, ret = A.compute_advantages(
        "grpo",
        token_level_rewards=REWARDS,
        response_mask=MASK,
        group_ids=UIDS,
        config=algorithm({"norm_adv_by_std_in_grpo": True}),
    )
    mean, std = 4 / 3, math.sqrt(((1 - 4 / 3) ** 2 + (4 / 3) ** 2 + (3 - 4 / 3) ** 2) / 2)  # unbiased
    expected_a = [(s - mean) / (std + 1e-6) for s in (1.0, 0.0, 3.0)]
    # groups of one: mean 0, std 1
    expected = [expected_a[0], expected_a[1], expected_a[2], 2 / (1 + 1e-6), 5 / (1 + 1e-6)]
    close(adv, torch.tensor(expected).unsqueeze(-1) * MASK)
    assert torch.equal(adv, ret)
    assert adv[0, 2] == 0 and adv[1, 1] == 0  # zero on padding


def test_dr_grpo_does_not_divide_by_std():
    cfg = OmegaConf.create({"norm_adv_by_std_in_grpo": False})
    adv, _ = A.compute_advantages(
        "grpo", token_level_rewards=REWARDS, response_mask=MASK, group_ids=UIDS, config=algorithm(cfg)
    )
    close(adv[:, 0], [1 - 4 / 3, -4 / 3, 3 - 4 / 3, 2.0, 5.0])


def test_grpo_identical_scores_give_zero_advantage():
    rewards = torch.tensor([[1.0], [1.0]])
    adv, _ = A.compute_advantages(
        "grpo", token_level_rewards=rewards, response_mask=torch.ones(2, 1), group_ids=[0, 0], config=ALGO
    )
    close(adv, torch.zeros(2, 1))


def test_rloo_leave_one_out_baseline():
    adv, ret = A.compute_advantages(
        "rloo", token_level_rewards=REWARDS, response_mask=MASK, group_ids=UIDS, config=ALGO
    )
    expected = [1 - (0 + 3) / 2, 0 - (1 + 3) / 2, 3 - (1 + 0) / 2, 2.0, 5.0]
    close(adv, torch.tensor(expected).unsqueeze(-1) * MASK)
    assert torch.equal(adv, ret)


def test_reinforce_plus_plus_discounted_returns_whitened():
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 4.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = A.compute_advantages(
        "reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask, config=algorithm({"gamma": 0.5})
    )
    # row0: G2 = 2, G1 = 0 + 0.5*2 = 1, G0 = 1 + 0.5*1 = 1.5; row1: padding reward 9 is not seen
    # by real tokens because the running return restarts after the padded position: G1 = 4, G0 = 2
    close(ret, [[1.5, 1.0, 2.0], [2.0, 4.0, 0.0]])
    vals = torch.tensor([1.5, 1.0, 2.0, 2.0, 4.0], dtype=torch.float64)
    whitened = (vals - vals.mean()) / torch.sqrt(vals.var(unbiased=True) + 1e-8)
    close(adv[mask.bool()], whitened)
    assert adv[1, 2] == 0


def test_reinforce_plus_plus_baseline_group_mean_then_batch_whitening():
    """verl's formula by hand: s_i - mean of its uid group (a group of one keeps s_i), broadcast over
    the response tokens, whitened with the mean and unbiased variance of all response tokens."""
    import statistics

    adv, ret = A.compute_advantages(
        "reinforce_plus_plus_baseline", token_level_rewards=REWARDS, response_mask=MASK, group_ids=UIDS, config=ALGO
    )
    # group a = {1, 0, 3} (mean 4/3); b = {2} and c = {5} are groups of one (baseline 0)
    centred = [1 - 4 / 3, 0 - 4 / 3, 3 - 4 / 3, 2.0, 5.0]
    tokens = [2, 1, 3, 2, 1]  # response tokens per row (MASK)
    values = [c for c, n in zip(centred, tokens) for _ in range(n)]
    mean, var = statistics.fmean(values), statistics.variance(values)
    expected = [(c - mean) / math.sqrt(var + 1e-8) for c in centred]
    close(adv, torch.tensor(expected).unsqueeze(-1) * MASK)
    close(adv[MASK.bool()].mean(), 0.0)
    assert torch.equal(adv, ret)
    assert adv[0, 2] == 0 and adv[1, 1] == 0  # zero on padding


def test_remax_reward_to_go_minus_baseline():
    rewards = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = A.compute_advantages(
        "remax", token_level_rewards=rewards, response_mask=mask, baseline_rewards=torch.tensor([1.0, 2.0]), config=ALGO
    )
    close(ret, [[3.0, 3.0, 2.0], [3.0, 0.0, 0.0]])
    close(adv, [[2.0, 2.0, 1.0], [1.0, -2.0, 0.0]])
    with pytest.raises(ValueError, match="baseline_rewards"):
        A.compute_advantages("remax", token_level_rewards=rewards, response_mask=mask, config=ALGO)


def test_unknown_estimator_lists_known_ones():
    with pytest.raises(KeyError, match="grpo") as info:
        A.compute_advantages(
            "no_such_estimator", token_level_rewards=REWARDS, response_mask=MASK, group_ids=UIDS, config=ALGO
        )
    assert "rloo" in str(info.value) and "reinforce_plus_plus" in str(info.value)
    assert set(A.ADVANTAGE_ESTIMATORS) == {
        "grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "gae",
        "opo",
        "grpo_passk",
        "gpg",
        "rloo_vectorized",
        "grpo_vectorized",
        "gdpo",
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
    }


def test_grpo_group_ids_length_mismatch():
    with pytest.raises(ValueError, match="group_ids has 2 entries"):
        A.compute_advantages("grpo", token_level_rewards=REWARDS, response_mask=MASK, group_ids=["a", "b"], config=ALGO)


def test_a_users_estimator_file_is_an_estimator(tmp_path):
    """`path/file.py:function` names a user's estimator: its spec read from the file's decorator, the
    function imported from the file by path."""
    from verl_npu.registry import ADVANTAGE_ESTIMATORS

    path = tmp_path / "zero_adv.py"
    path.write_text(
        "import torch\nfrom verl_npu.registry import ADVANTAGE_ESTIMATORS\n\n\n"
        "@ADVANTAGE_ESTIMATORS.register('zero', needs_group=True, doc='all zero')\n"
        "def zero(token_level_rewards, response_mask, group_ids, config, **_):\n"
        "    return torch.zeros_like(token_level_rewards), torch.zeros_like(token_level_rewards)\n"
    )
    name = f"{path}:zero"
    spec = ADVANTAGE_ESTIMATORS.spec(name)
    assert (spec.needs_group, spec.doc, spec.name) == (True, "all zero", name)
    adv, _ = A.compute_advantages(name, token_level_rewards=REWARDS, response_mask=MASK, config=ALGO)
    assert torch.count_nonzero(adv) == 0
    assert "no_such" in ADVANTAGE_ESTIMATORS.file_problem(f"{path}:no_such")
    assert "no file" in ADVANTAGE_ESTIMATORS.file_problem(f"{tmp_path}/missing.py:zero")


# ----------------------------------------------------------------------------- agg_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [1.0, 1.0, 1.0]])
LMASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
# masked per-row sums: 3, 4, 24, 0 (row 3 is empty); token counts 2, 1, 3, 0


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 31 / 6),
        ("token-sum", 31.0),
        ("seq-mean-token-sum", 31 / 3),
        ("seq-mean-token-mean", (3 / 2 + 4 / 1 + 24 / 3) / 3),
        ("seq-mean-token-sum-norm", 31 / 3 / 3),
    ],
)
def test_agg_loss_modes(mode, expected):
    close(A.agg_loss(LOSS, LMASK, mode), expected)


def test_agg_loss_norm_uses_loss_scale_factor():
    close(A.agg_loss(LOSS, LMASK, "seq-mean-token-sum-norm", loss_scale_factor=10), 31 / 3 / 10)


@pytest.mark.parametrize("mode", A.LOSS_AGG_MODES)
def test_micro_batches_with_global_counts_sum_to_full_batch(mode):
    full = A.agg_loss(LOSS, LMASK, mode)
    n_tok, n_seq = LMASK.sum(), (LMASK.sum(-1) > 0).sum()
    kwargs = {"global_tokens": n_tok, "global_seqs": n_seq, "loss_scale_factor": 3}
    micro = sum(A.agg_loss(LOSS[i : i + 2], LMASK[i : i + 2], mode, **kwargs) for i in (0, 2))
    close(micro, full)
    # two data-parallel ranks (one row pair each, each split into two micro-batches of one row);
    # the rank losses are averaged by the gradient all-reduce
    ranks = [
        sum(A.agg_loss(LOSS[r : r + 1], LMASK[r : r + 1], mode, dp_size=2, **kwargs) for r in rows)
        for rows in ((0, 1), (2, 3))
    ]
    close(sum(ranks) / 2, full)


def test_micro_batches_without_global_counts_differ_for_token_mean():
    micro = sum(A.agg_loss(LOSS[i : i + 2], LMASK[i : i + 2], "token-mean") for i in (0, 2))
    assert abs(micro.item() - 31 / 6) > 1  # local means: 7/3 + 24/3 -- the reason global counts exist


def test_agg_loss_invalid_mode():
    with pytest.raises(ValueError, match="token-mean"):
        A.agg_loss(LOSS, LMASK, "seq-mean")


# ----------------------------------------------------------------------------- policy loss


def test_ppo_clip_positive_and_negative_advantages_and_dual_clip():
    # ratios: 1.5 (A=+1, clipped to 1.2), 0.5 (A=+1, unclipped: min keeps 0.5),
    #         0.5 (A=-1, clipped to 0.8), 5.0 (A=-1, dual clip caps at 3), 1.0 padding
    ratios = torch.tensor([[1.5, 0.5, 0.5, 5.0, 1.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    old = torch.zeros(1, 5)
    logp = torch.log(ratios).requires_grad_(True)
    out = A.POLICY_LOSSES["vanilla"](logp, old, adv, mask, 0.2, 0.2, 3.0, "token-mean")
    per_token = [-1.2, -0.5, 0.8, 3.0]
    close(out["pg_loss"], sum(per_token) / 4)
    # clip active (L2 > L1): token 0 (-1.2 > -1.5), token 2 (0.8 > 0.5), token 3 (0.8 vs 5: no)
    close(out["pg_clipfrac"], 2 / 4)
    close(out["pg_clipfrac_lower"], 1 / 4)  # only token 3
    close(out["ppo_kl"], -torch.log(ratios[0, :4]).mean())
    out["pg_loss"].backward()
    # gradient flows only where neither clip is active (token 1): d(-A r)/dlogp = -A r = -0.5, /4
    close(logp.grad, [[0.0, -0.5 / 4, 0.0, 0.0, 0.0]])


def test_ppo_asymmetric_clip_and_ratio_clamp():
    logp = torch.tensor([[math.log(1.3), 50.0]])
    out = A.ppo_policy_loss(
        logp,
        torch.zeros(1, 2),
        torch.tensor([[1.0, 1.0]]),
        torch.ones(1, 2),
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        loss_agg_mode="token-sum",
    )
    # 1.3 -> 1.28; log ratio 50 clamps to 20 then clips to 1.28 -> both -1.28
    close(out["pg_loss"], -2.56)
    assert torch.isfinite(out["ppo_kl"]) and abs(out["ppo_kl"].item() + (math.log(1.3) + 20) / 2) < 1e-5


def test_ppo_rejects_dual_clip_below_one():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        A.ppo_policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), clip_ratio_c=1.0)


# ----------------------------------------------------------------------------- KL


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("kl", [-0.5, 1.0]),
        ("k1", [-0.5, 1.0]),
        ("abs", [0.5, 1.0]),
        ("mse", [0.125, 0.5]),
        ("k2", [0.125, 0.5]),
        ("low_var_kl", [math.exp(0.5) - 0.5 - 1, math.exp(-1.0) + 1.0 - 1]),
        ("k3", [math.exp(0.5) - 0.5 - 1, math.exp(-1.0) + 1.0 - 1]),
    ],
)
def test_kl_kinds(kind, expected):
    logp = torch.tensor([-1.5, -1.0])
    ref = torch.tensor([-1.0, -2.0])
    close(A.kl_penalty(logp, ref, kind), expected)


def test_low_var_kl_clamps():
    # ref - logp = 30 -> clamped to 20; exp(20) - 21 -> clamped to 10
    close(A.kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "low_var_kl"), [10.0])


def test_full_kl_matches_direct_computation_and_needs_logits():
    torch.manual_seed(0)
    logits, ref_logits = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    p, q = torch.softmax(logits, -1), torch.softmax(ref_logits, -1)
    direct = torch.zeros(2, 3)
    for b in range(2):
        for t in range(3):
            direct[b, t] = sum(p[b, t, v] * math.log(p[b, t, v] / q[b, t, v]) for v in range(5))
    value = A.kl_penalty(torch.zeros(2, 3), torch.zeros(2, 3), "full", logits=logits, ref_logits=ref_logits)
    close(value, direct)
    assert (value >= 0).all()
    with pytest.raises(ValueError, match="full KL needs logits"):
        A.kl_penalty(torch.zeros(2, 3), torch.zeros(2, 3), "full")


def test_kl_straight_through_suffix_has_k3_value_and_k2_gradient():
    logp = torch.tensor([-1.5, -1.0], requires_grad=True)
    ref = torch.tensor([-1.0, -2.0])
    value = A.kl_penalty(logp, ref, "k3+")
    close(value, A.kl_penalty(logp.detach(), ref, "k3"))
    value.sum().backward()
    close(logp.grad, (logp - ref).detach())  # d(½d²)/dlogp = d


def test_unknown_kl_kind():
    with pytest.raises(ValueError, match="low_var_kl"):
        A.kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


# ----------------------------------------------------------------------------- KL controllers


def test_adaptive_kl_controller_update_clips_error():
    ctrl = A.AdaptiveKLController(init_kl_coef=0.1, target_kl=0.5, horizon=100)
    ctrl.update(current_kl=0.6, n_steps=10)  # error 0.2 -> x(1 + 0.2*10/100)
    close(ctrl.value, 0.1 * 1.02)
    ctrl.update(current_kl=5.0, n_steps=10)  # error 9 clipped to 0.2
    close(ctrl.value, 0.1 * 1.02 * 1.02)
    ctrl.update(current_kl=0.0, n_steps=50)  # error -1 clipped to -0.2 -> x0.9
    close(ctrl.value, 0.1 * 1.02 * 1.02 * 0.9)


def test_make_kl_controller_from_config():
    fixed = A.make_kl_controller(section("algorithm.kl_ctrl", OmegaConf.create({"type": "fixed", "kl_coef": 0.05})))
    fixed.update(10.0, 100)
    assert isinstance(fixed, A.FixedKLController) and fixed.value == 0.05
    adaptive = A.make_kl_controller(
        section("algorithm.kl_ctrl", {"type": "adaptive", "kl_coef": 0.2, "target_kl": 0.1, "horizon": 1000})
    )
    assert isinstance(adaptive, A.AdaptiveKLController) and adaptive.value == 0.2
    with pytest.raises(UserError, match="algorithm.kl_ctrl.type"):
        A.make_kl_controller(section("algorithm.kl_ctrl", {"type": "pid"}))
    with pytest.raises(UserError, match="horizon"):
        A.make_kl_controller(section("algorithm.kl_ctrl", {"type": "adaptive", "horizon": 0}))


def test_apply_kl_in_reward():
    scores = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    old = torch.tensor([[-1.0, -1.0], [-1.0, -3.0]])
    ref = torch.tensor([[-2.0, -1.5], [-1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    ctrl = A.AdaptiveKLController(0.1, target_kl=0.5, horizon=10)
    rewards, metrics = A.apply_kl_in_reward(scores, old, ref, mask, ctrl, kind="kl")
    # kld = [[1, 0.5], [0, 0 (masked)]]
    close(rewards, [[-0.1, 0.95], [2.0, 0.0]])
    close(metrics["actor/reward_kl_penalty"], (0.75 + 0.0) / 2)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1
    close(ctrl.value, 0.1 * (1 - 0.2 * 2 / 10))  # error 0.375/0.5 - 1 = -0.25 clipped to -0.2


def test_masked_helpers():
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    m = torch.tensor([1.0, 1.0, 1.0, 0.0])
    close(A.masked_mean(x, m), 2.0)
    close(A.masked_var(x, m), 1.0)
    close(A.masked_whiten(x, m)[:3], torch.tensor([-1.0, 0.0, 1.0]) / math.sqrt(1 + 1e-8))
    close(A.masked_whiten(x, m, shift_mean=False)[:3], torch.tensor([1.0, 2.0, 3.0]), tol=1e-4)
    close(A.masked_mean(x, torch.zeros(4)), 0.0)


def test_a_users_estimator_file_takes_no_registered_name(tmp_path):
    """A user's file declaring a built-in's name (with the same function name) is reached only through its file
    entry: the built-in under that name stays the package's own."""
    from verl_npu.registry import ADVANTAGE_ESTIMATORS

    builtin = ADVANTAGE_ESTIMATORS.load("grpo")
    path = tmp_path / "shadow.py"
    path.write_text(
        "import torch\nfrom verl_npu.registry import ADVANTAGE_ESTIMATORS\n\n\n"
        f"@ADVANTAGE_ESTIMATORS.register('grpo', needs_group=True, doc='shadow')\n"
        f"def {builtin.__qualname__}(token_level_rewards, response_mask, group_ids, config, **_):\n"
        "    return torch.zeros_like(token_level_rewards), torch.zeros_like(token_level_rewards)\n"
    )
    users = ADVANTAGE_ESTIMATORS.load(f"{path}:{builtin.__qualname__}")
    assert users is not builtin and ADVANTAGE_ESTIMATORS.load("grpo") is builtin
    assert "grpo" in ADVANTAGE_ESTIMATORS.implementations and ADVANTAGE_ESTIMATORS.implementations["grpo"] is builtin
