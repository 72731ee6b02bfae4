"""Every policy loss mode and advantage estimator against upstream verl 0.9.1's own functions (issue 23).

verl runs in its side venv (VERL_SIDE_PYTHON, built by tests/verl_side.sh) as a subprocess:
tests/helpers/verl_side_algos.py calls `get_policy_loss_fn(mode)` with an `ActorConfig` built as verl builds it,
and `get_adv_estimator_fn(name)`, on the same inputs given to verl-npu here: fixed seeds, right-padded
masks of ragged lengths (one row of a single token), several groups (one of a single row where the
estimator allows it). Compared: pg_loss, its gradient with respect to log_prob, the metrics (the same
names), for every loss_agg_mode, in float64 and float32, with and without global-batch counts; the
advantages and returns of every estimator (the optimal token baseline with the actor's old log-probs and
sum_pi_squared, with and without rollout importance weights, and on masks with holes); and verl's
variance-proxy metrics (`compute_variance_proxy_metrics`).

Known, deliberate difference: geo_mean with global-batch counts (verl ignores them and takes the mean
over the rows of the call; verl-npu divides by the global sequence count so micro-batches add up), so
that variant is compared only without global counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from run_helpers import run_on_verl_side, verl_side_python

from verl_npu import algorithms as A
from verl_npu.algorithms.advantage_modes import gdpo_advantage
from verl_npu.config.typed import section
from verl_npu.registry import POLICY_LOSSES

POLICY_LOSS_MODES = POLICY_LOSSES.specs

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tests" / "helpers" / "verl_side_algos.py"
pytestmark = pytest.mark.verl_side
verl_side_python()

LENGTHS = [7, 3, 5, 1, 6, 2, 7, 4]
UIDS = ["a", "a", "a", "b", "b", "c", "d", "d"]  # group c has one row
UIDS_PAIRED = ["a", "a", "a", "b", "b", "c", "c", "c"]  # every group >= 2 rows (grpo_passk)
ACTOR = {
    "clip_ratio": 0.2,
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.28,
    "clip_ratio_c": 3.0,
    "tau_pos": 1.0,
    "tau_neg": 1.05,
    # large enough ratios and a low bound so clip_cov / kl_cov pick several of many candidates
    "policy_loss": {
        "clip_cov_ratio": 0.1,
        "clip_cov_lb": 0.05,
        "clip_cov_ub": 3.0,
        "kl_cov_ratio": 0.1,
        "ppo_kl_coef": 0.3,
        "dro_beta": 0.5,
    },
}
TOL = {torch.float64: 1e-6, torch.float32: 1e-5}
#: bypass_mode reads the rollout-correction settings: compared in tests/algorithms/test_verl_rollout_correction.py
PLAIN_MODES = [mode for mode in POLICY_LOSS_MODES if mode != "bypass_mode"]


def mask_of(lengths, width=7, dtype=torch.float64):
    return (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(dtype)


def loss_inputs(seed: int, dtype) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = mask_of(LENGTHS)
    log_prob = -torch.rand(mask.shape, generator=g, dtype=torch.float64) * 2.5 - 0.02
    # wide log-ratios: clipping, the dual clip (ratio > 3) and the DPPO thresholds all occur
    old = log_prob + torch.randn(mask.shape, generator=g, dtype=torch.float64) * 0.6
    old = torch.minimum(old, torch.full_like(old, -1e-3))
    per_row = torch.randn(len(LENGTHS), 1, generator=g, dtype=torch.float64) * 1.5
    adv = per_row + torch.randn(mask.shape, generator=g, dtype=torch.float64) * 0.3  # token-varying advantages
    return {
        k: v.to(dtype)
        for k, v in {"log_prob": log_prob, "old_log_prob": old, "advantages": adv * mask, "response_mask": mask}.items()
    }


def loss_cases() -> list[dict]:
    cases = []
    for mode in PLAIN_MODES:
        for agg in A.LOSS_AGG_MODES:
            for dtype in (torch.float64, torch.float32):
                for global_info in (False, True):
                    if mode == "geo_mean" and global_info:
                        continue  # the deliberate difference (module docstring)
                    seed = 100 + len(cases)
                    inputs = loss_inputs(seed, dtype)
                    tokens = float(inputs["response_mask"].sum())
                    info = (
                        {
                            "dp_size": 2,
                            "batch_num_tokens": tokens * 1.5,
                            "global_batch_size": 12,
                            "loss_scale_factor": 9,
                        }
                        if global_info
                        else {}
                    )
                    cases.append(
                        {
                            **inputs,
                            "mode": mode,
                            "loss_agg_mode": agg,
                            "seed": seed,
                            "actor": ACTOR,
                            "global_batch_info": info,
                        }
                    )
    return cases


def ours_loss(case: dict) -> dict:
    info = case["global_batch_info"]
    agg = (
        {
            "global_tokens": info["batch_num_tokens"],
            "global_seqs": info["global_batch_size"],
            "dp_size": info["dp_size"],
            "loss_scale_factor": info["loss_scale_factor"],
        }
        if info
        else {}
    )
    log_prob = case["log_prob"].clone().requires_grad_(True)
    torch.manual_seed(case["seed"])
    out = A.policy_loss_fn(case["mode"])(
        log_prob,
        case["old_log_prob"],
        case["advantages"],
        case["response_mask"],
        ACTOR["clip_ratio_low"],
        ACTOR["clip_ratio_high"],
        ACTOR["clip_ratio_c"],
        case["loss_agg_mode"],
        config=ACTOR,
        **agg,
    )
    out["pg_loss"].backward()
    return {
        "pg_loss": out["pg_loss"].detach(),
        "grad": log_prob.grad,
        "metrics": {k: float(v) for k, v in out.items() if k != "pg_loss"},
    }


def estimator_cases() -> list[dict]:
    g = torch.Generator().manual_seed(7)
    mask = mask_of(LENGTHS)
    last = torch.tensor(LENGTHS) - 1
    scores = torch.round(torch.randn(len(LENGTHS), generator=g, dtype=torch.float64) * 4) / 4  # ties and zeros
    outcome = torch.zeros_like(mask)
    outcome[torch.arange(len(LENGTHS)), last] = scores
    dense = torch.randn(mask.shape, generator=g, dtype=torch.float64) * mask  # rewards on every token
    values = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    baselines = torch.randn(len(LENGTHS), generator=g, dtype=torch.float64)
    cases = []

    def add(
        name,
        rewards,
        uids,
        algorithm,
        verl_kwargs=None,
        our_kwargs=None,
        our_config="same",
        tol=1e-6,
        response_mask=mask,
    ):
        cases.append(
            {
                "name": name,
                "token_level_rewards": rewards,
                "response_mask": response_mask,
                "uids": uids,
                "algorithm": algorithm,
                "kwargs": verl_kwargs or {},
                "ours": our_kwargs or {},
                "our_config": algorithm if our_config == "same" else our_config,
                "tol": tol,
            }
        )

    for norm in (True, False):
        flag = {"norm_adv_by_std_in_grpo": norm}
        add("grpo", outcome, UIDS, flag, {"norm_adv_by_std_in_grpo": norm})
        # verl's vectorised GRPO takes the flag as an argument (its trainer passes only config)
        add("grpo_vectorized", outcome, UIDS, flag, {"norm_adv_by_std_in_grpo": norm})
        add("grpo_passk", outcome, UIDS_PAIRED, flag)
    for name in ("rloo", "rloo_vectorized", "opo", "gpg", "reinforce_plus_plus_baseline"):
        add(name, outcome, UIDS, {})
    add("opo", dense, UIDS, {})
    add("reinforce_plus_plus", dense, UIDS, {"gamma": 0.9})
    add("remax", dense, UIDS, {}, {"reward_baselines": baselines}, {"baseline_rewards": baselines})
    # verl-npu's GAE computes in float32
    add(
        "gae",
        dense,
        None,
        None,
        {"values": values, "gamma": 0.9, "lam": 0.8},
        {"values": values},
        our_config={"gamma": 0.9, "lam": 0.8},
        tol=1e-5,
    )
    # GDPO: two reward components per row (verl reads them in float32)
    comps = {
        "fmt": (torch.randint(0, 2, (8,), generator=g) * 0.5).tolist(),
        "acc": torch.round(torch.randn(8, generator=g) * 4).div(4).tolist(),
    }
    prompts = torch.zeros(len(LENGTHS), 3, dtype=torch.long)
    batch = {"prompts": prompts, "attention_mask": torch.cat([torch.ones(len(LENGTHS), 3), mask], dim=1).long()}
    for norm in (True, False):
        algorithm = {
            "norm_adv_by_std_in_grpo": norm,
            "gdpo_reward_keys": ["fmt", "acc"],
            "gdpo_reward_weights": [0.5, 2.0],
        }
        add(
            "gdpo",
            outcome,
            UIDS,
            algorithm,
            {"non_tensor_batch": comps, "batch": batch, "norm_adv_by_std_in_grpo": norm},
            {"reward_components": comps},
            tol=1e-5,
        )
    add("gdpo", outcome, UIDS, None, {"norm_adv_by_std_in_grpo": True}, our_config={}, tol=1e-5)
    # the optimal token baseline: the actor's old log-probs and sum of squared probabilities (sum_pi_squared >=
    # p^2 of the sampled token), optionally rollout importance weights; groups a, b and d have one longest row
    # (the zero tail), c has one row
    old = torch.log(torch.rand(mask.shape, generator=g, dtype=torch.float64) * 0.9 + 0.05)
    spsq = torch.exp(old) ** 2 + torch.rand(mask.shape, generator=g, dtype=torch.float64) * 0.3
    rho = torch.rand(mask.shape, generator=g, dtype=torch.float64) * 1.5 + 0.25
    holes = mask.clone()
    holes[0, 2:4], holes[2, 1], holes[6, 0] = 0.0, 0.0, 0.0  # tool output inside the response (multi-turn)
    holes[4, :] = 0.0  # a row with no response token
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        for rewards in (outcome, dense):
            otb = {"old_log_probs": old, "sum_pi_squared": spsq}
            add(name, rewards, UIDS, {}, otb, otb)
            add(name, rewards, UIDS, {}, {**otb, "rollout_is_weights": rho}, {**otb, "rollout_is_weights": rho})
        add(name, dense * holes, UIDS, {}, otb, otb, response_mask=holes)
    return cases


def ours_estimator(case: dict):
    if case["name"] == "gdpo":  # not registered yet (the trainer does not pass reward components)
        return gdpo_advantage(
            case["token_level_rewards"],
            case["response_mask"],
            case["uids"],
            section("algorithm", case["our_config"]),
            **case["ours"],
        )
    return A.compute_advantages(
        case["name"],
        token_level_rewards=case["token_level_rewards"],
        response_mask=case["response_mask"],
        group_ids=case["uids"],
        config=section("algorithm", case["our_config"]),
        **case["ours"],
    )


@pytest.fixture(scope="module")
def verl_outputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verl_algos")
    losses, estimators = loss_cases(), estimator_cases()
    side_estimators = [{k: v for k, v in c.items() if k not in ("ours", "our_config", "tol")} for c in estimators]
    side = {"losses": losses, "estimators": side_estimators, "variance_proxy": variance_proxy_cases()}
    return losses, estimators, run_on_verl_side(TOOL, side, folder)


def test_every_policy_loss_mode_and_agg_mode_matches_verl(verl_outputs):
    losses, _, out = verl_outputs
    assert len(out["losses"]) == len(losses) > 0
    worst: dict[str, float] = {}
    for case, theirs in zip(losses, out["losses"]):
        ours = ours_loss(case)
        label = (
            f"{case['mode']} {case['loss_agg_mode']} {case['log_prob'].dtype} global={bool(case['global_batch_info'])}"
        )
        tol = TOL[case["log_prob"].dtype]
        assert set(ours["metrics"]) == set(theirs["metrics"]), label
        diffs = [float((ours["pg_loss"] - theirs["pg_loss"]).abs()), float((ours["grad"] - theirs["grad"]).abs().max())]
        diffs += [abs(ours["metrics"][k] - theirs["metrics"][k]) for k in theirs["metrics"]]
        assert max(diffs) <= tol * max(1.0, float(theirs["pg_loss"].abs())), (label, diffs, ours, theirs)
        # the gradient is not trivially zero (except where a mode has none, e.g. every token masked)
        assert float(theirs["grad"].abs().sum()) > 0, label
        key = f"{case['mode']} {case['log_prob'].dtype}"
        worst[key] = max(worst.get(key, 0.0), max(diffs))
    assert {k.split()[0] for k in worst} == set(PLAIN_MODES)
    print("\nmax |ours - verl| per mode (pg_loss, grad, metrics; all agg modes):")
    for key, value in sorted(worst.items()):
        print(f"  {key}: {value:.3g}")


def test_every_advantage_estimator_matches_verl(verl_outputs):
    _, estimators, out = verl_outputs
    worst: dict[str, float] = {}
    for case, theirs in zip(estimators, out["estimators"]):
        adv, ret = ours_estimator(case)
        diff = max(float((adv - theirs["advantages"]).abs().max()), float((ret - theirs["returns"]).abs().max()))
        assert diff <= case["tol"] * max(1.0, float(theirs["advantages"].abs().max())), (case["name"], diff)
        assert float(adv.abs().sum()) > 0, case["name"]
        worst[case["name"]] = max(worst.get(case["name"], 0.0), diff)
    assert set(worst) == set(A.ADVANTAGE_ESTIMATORS) | {"gdpo"}
    print("\nmax |ours - verl| per estimator (advantages and returns):")
    for key, value in sorted(worst.items()):
        print(f"  {key}: {value:.3g}")


def variance_proxy_cases() -> list[dict]:
    """Batches with the actor's sum_pi_squared (float32, as the trainer holds them): with and without rollout
    importance weights, with and without a grad norm, one with an empty response."""
    g = torch.Generator().manual_seed(11)
    mask = mask_of(LENGTHS, dtype=torch.float32)
    mask[3] = 0.0
    old = torch.log(torch.rand(mask.shape, generator=g) * 0.9 + 0.05)
    tensors = {
        "old_log_probs": old,
        "sum_pi_squared": torch.exp(old) ** 2 + torch.rand(mask.shape, generator=g) * 0.3,
        "advantages": torch.randn(mask.shape, generator=g) * mask,
        "response_mask": mask,
    }
    rho = torch.rand(mask.shape, generator=g) * 1.5 + 0.25
    return [
        {"tensors": t, "gradient_norm": gn}
        for t in (tensors, {**tensors, "rollout_is_weights": rho})
        for gn in (None, 0.7, 5.0)
    ]


def test_variance_proxy_metrics_match_verl(verl_outputs):
    from verl_npu.batch import Batch
    from verl_npu.trainer.metrics import variance_proxy_metrics

    *_, out = verl_outputs
    cases = variance_proxy_cases()
    assert len(out["variance_proxy"]) == len(cases)
    for case, theirs in zip(cases, out["variance_proxy"]):
        ours = variance_proxy_metrics(Batch(dict(case["tensors"]), {}), case["gradient_norm"])
        assert set(ours) == set(theirs) and len(ours) == 5
        for key, value in theirs.items():
            assert ours[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (key, case["gradient_norm"])
    assert any(v["variance_proxy/proxy3_pure_noise"] > 0 for v in out["variance_proxy"])
