"""Rollout correction against upstream verl 0.9.1's own functions (issue 23).

verl runs in its side venv (VERL_SIDE_PYTHON, built by tests/verl_side.sh) as a subprocess
(tests/helpers/verl_side_rollout_corr.py) on the same random inputs given to verl-npu here: right-padded masks of
ragged lengths (a one-token row, an empty row), log-ratios wide enough that truncation, IcePop and every
rejection option act. Compared, in float64 and float32:
- `compute_rollout_correction_and_rejection_mask` vs `verl_npu.algorithms.compute_rollout_correction`: the IS
  weights, the rejection mask and every metric (the same names), for every `rollout_is` level, TIS and IcePop
  thresholds, batch normalisation, every `rollout_rs` option alone (k1 with `lower_upper` and a single bound)
  and chained options (one threshold shared, one per option);
- verl's `bypass_mode` policy loss vs ours: pg_loss, its gradient with respect to log_prob, the metrics
  (rollout_corr/* included), both loss types, every loss_agg_mode;
- every other policy loss mode with `rollout_is_weights` (verl multiplies them into each loss).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from run_helpers import run_on_verl_side, verl_side_python

from verl_npu import algorithms as A
from verl_npu.config.typed import section
from verl_npu.registry import POLICY_LOSSES
from verl_npu.rollout_corrections import ROLLOUT_RS_OPTIONS

POLICY_LOSS_MODES = POLICY_LOSSES.specs

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tests" / "helpers" / "verl_side_rollout_corr.py"
pytestmark = pytest.mark.verl_side
verl_side_python()

LENGTHS = [7, 3, 5, 1, 6, 0, 7, 4]  # row 5 is empty
TOL = {torch.float64: 1e-6, torch.float32: 2e-5}
ACTOR = {
    "clip_ratio": 0.2,
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.28,
    "clip_ratio_c": 3.0,
    "tau_pos": 1.0,
    "tau_neg": 1.05,
    "policy_loss": {
        "clip_cov_ratio": 0.1,
        "clip_cov_lb": 0.05,
        "clip_cov_ub": 3.0,
        "kl_cov_ratio": 0.1,
        "ppo_kl_coef": 0.3,
        "dro_beta": 0.5,
    },
}
#: a threshold per option that keeps some responses and rejects others on these inputs
RS_THRESHOLD = {
    "token_k1": "0.7_1.4",
    "token_k2": 0.05,
    "token_k3": 0.05,
    "seq_sum_k1": "0.3_3.0",
    "seq_sum_k2": 0.3,
    "seq_sum_k3": 0.3,
    "seq_mean_k1": "0.8_1.25",
    "seq_mean_k2": 0.06,
    "seq_mean_k3": 0.06,
    "seq_max_k2": 0.2,
    "seq_max_k3": 0.2,
}


def settings(rollout_is=None, threshold=2.0, normalize=False, rs=None, rs_threshold=None, loss_type="ppo_clip"):
    return {
        "rollout_is": rollout_is,
        "rollout_is_threshold": threshold,
        "rollout_is_batch_normalize": normalize,
        "rollout_rs": rs,
        "rollout_rs_threshold": rs_threshold,
        "bypass_mode": False,
        "loss_type": loss_type,
    }


def inputs(seed: int, dtype, empty_row: bool = True) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = LENGTHS if empty_row else [max(n, 2) for n in LENGTHS]
    mask = (torch.arange(7).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(torch.float64)
    rollout = -torch.rand(mask.shape, generator=g, dtype=torch.float64) * 2.5 - 0.02
    old = rollout + torch.randn(mask.shape, generator=g, dtype=torch.float64) * 0.4
    log_prob = old + torch.randn(mask.shape, generator=g, dtype=torch.float64) * 0.3
    adv = (
        torch.randn(len(lengths), 1, generator=g, dtype=torch.float64)
        + torch.randn(mask.shape, generator=g, dtype=torch.float64) * 0.2
    )
    out = {
        "old_log_prob": old,
        "rollout_log_prob": rollout,
        "log_prob": log_prob,
        "advantages": adv * mask,
        "response_mask": mask,
    }
    return {k: v.to(dtype) for k, v in out.items()}


def correction_settings() -> list[dict]:
    cases = [settings()]  # metrics only
    for level in ("token", "sequence"):
        for threshold in (2.0, "0.5_5.0", "1.5", 1.2):
            for normalize in (False, True):
                cases.append(settings(level, threshold, normalize))
    for option, threshold in RS_THRESHOLD.items():
        cases.append(settings(rs=option, rs_threshold=threshold))
    cases.append(settings(rs="token_k1", rs_threshold=1.5))  # k1 with one bound: lower = 1/upper
    cases.append(settings(rs="seq_mean_k1", rs_threshold="1.1"))
    cases.append(settings("token", 2.0, rs="token_k1,seq_mean_k3,token_k1", rs_threshold="0.7_1.4,0.06"))
    cases.append(settings("sequence", 3.0, True, rs="seq_sum_k1,seq_max_k2,token_k3", rs_threshold="0.3_3.0,0.2,0.05"))
    cases.append(settings("token", "0.8_1.5", rs="token_k2,seq_mean_k2", rs_threshold=0.05))
    return cases


def build_cases() -> dict:
    corrections, bypass, losses = [], [], []
    for dtype in (torch.float64, torch.float32):
        for i, s in enumerate(correction_settings()):
            x = inputs(10 + i, dtype)
            corrections.append(
                {
                    "old_log_prob": x["old_log_prob"],
                    "rollout_log_prob": x["rollout_log_prob"],
                    "response_mask": x["response_mask"],
                    "settings": s,
                }
            )
        bypass_settings = [
            settings(),
            settings("token", 2.0),
            settings("sequence", "0.5_5.0", True),
            settings("token", 1.5, rs="token_k1,seq_mean_k3", rs_threshold="0.4_2.5,0.3"),
        ]
        for loss_type in ("ppo_clip", "reinforce"):
            for j, s in enumerate(bypass_settings):
                for agg in A.LOSS_AGG_MODES:
                    x = inputs(200 + len(bypass), dtype, empty_row=False)
                    bypass.append(
                        {
                            "log_prob": x["log_prob"],
                            "old_log_prob": x["rollout_log_prob"],
                            "advantages": x["advantages"],
                            "response_mask": x["response_mask"],
                            "loss_agg_mode": agg,
                            "actor": ACTOR,
                            "settings": {**s, "loss_type": loss_type},
                        }
                    )
        for mode in POLICY_LOSS_MODES:
            if mode == "bypass_mode":
                continue
            for agg in ("token-mean", "seq-mean-token-mean"):
                x = inputs(400 + len(losses), dtype, empty_row=False)
                weights = A.rollout_is_weights(
                    x["old_log_prob"] - x["rollout_log_prob"], x["response_mask"], "token", 1.5
                )[0]
                losses.append(
                    {
                        "log_prob": x["log_prob"],
                        "old_log_prob": x["old_log_prob"],
                        "advantages": x["advantages"],
                        "response_mask": x["response_mask"],
                        "mode": mode,
                        "loss_agg_mode": agg,
                        "seed": len(losses),
                        "actor": ACTOR,
                        "global_batch_info": {},
                        "rollout_is_weights": weights,
                    }
                )
    return {"corrections": corrections, "bypass": bypass, "losses": losses}


@pytest.fixture(scope="module")
def verl_outputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verl_rollout_corr")
    cases = build_cases()
    return cases, run_on_verl_side(TOOL, cases, folder)


def _close_metrics(ours: dict, theirs: dict, tol: float, label) -> float:
    assert set(ours) == set(theirs), (label, sorted(set(ours) ^ set(theirs)))
    worst = 0.0
    for key, value in theirs.items():
        diff = abs(ours[key] - value)
        assert diff <= tol * max(1.0, abs(value)), (label, key, ours[key], value)
        worst = max(worst, diff / max(1.0, abs(value)))
    return worst


def test_weights_masks_and_metrics_match_verl(verl_outputs):
    cases, out = verl_outputs
    assert len(out["corrections"]) == len(cases["corrections"]) > 0
    seen_options, rejected, truncated = set(), 0, 0
    for case, theirs in zip(cases["corrections"], out["corrections"]):
        s = case["settings"]
        label = (s, case["old_log_prob"].dtype)
        tol = TOL[case["old_log_prob"].dtype]
        ours = A.compute_rollout_correction(
            case["old_log_prob"],
            case["rollout_log_prob"],
            case["response_mask"],
            **{k: v for k, v in s.items() if k not in ("bypass_mode", "loss_type")},
        )
        if theirs["weights"] is None:
            assert ours.weights is None, label
        else:
            torch.testing.assert_close(ours.weights, theirs["weights"], atol=tol, rtol=tol, msg=str(label))
            truncated += int(
                bool(
                    (theirs["weights"] == 0).logical_and(case["response_mask"] > 0).any()
                    or theirs["metrics"]["rollout_corr/rollout_is_ratio_fraction_high"] > 0
                )
            )
        assert torch.equal(ours.response_mask, theirs["mask"]), label
        assert ours.response_mask.dtype == theirs["mask"].dtype
        rejected += int(bool((theirs["mask"] < case["response_mask"]).any()))
        _close_metrics(ours.metrics, theirs["metrics"], tol, label)
        if s["rollout_rs"]:
            seen_options.update(o.strip() for o in s["rollout_rs"].split(","))
    assert seen_options == set(ROLLOUT_RS_OPTIONS)
    assert rejected >= 20 and truncated >= 10, (rejected, truncated)  # the cases exercise what they test


def test_bypass_mode_loss_matches_verl(verl_outputs):
    cases, out = verl_outputs
    assert len(out["bypass"]) == len(cases["bypass"]) > 0
    for case, theirs in zip(cases["bypass"], out["bypass"]):
        label = (case["settings"], case["loss_agg_mode"], case["log_prob"].dtype)
        tol = TOL[case["log_prob"].dtype]
        log_prob = case["log_prob"].clone().requires_grad_(True)
        ours = A.policy_loss_fn("bypass_mode")(
            log_prob,
            case["old_log_prob"],
            case["advantages"],
            case["response_mask"],
            ACTOR["clip_ratio_low"],
            ACTOR["clip_ratio_high"],
            ACTOR["clip_ratio_c"],
            case["loss_agg_mode"],
            config=ACTOR,
            rollout_correction=section("algorithm.rollout_correction", case["settings"]),
        )
        ours["pg_loss"].backward()
        scale = max(1.0, float(theirs["pg_loss"].abs()))
        assert float((ours["pg_loss"].detach() - theirs["pg_loss"]).abs()) <= tol * scale, label
        torch.testing.assert_close(log_prob.grad, theirs["grad"], atol=tol * scale, rtol=tol, msg=str(label))
        assert float(theirs["grad"].abs().sum()) > 0, label
        _close_metrics({k: float(v) for k, v in ours.items() if k != "pg_loss"}, theirs["metrics"], tol, label)


def test_every_loss_mode_with_is_weights_matches_verl(verl_outputs):
    cases, out = verl_outputs
    assert {c["mode"] for c in cases["losses"]} == set(POLICY_LOSS_MODES) - {"bypass_mode"}
    for case, theirs in zip(cases["losses"], out["losses"]):
        label = (case["mode"], case["loss_agg_mode"], case["log_prob"].dtype)
        tol = TOL[case["log_prob"].dtype]
        log_prob = case["log_prob"].clone().requires_grad_(True)
        torch.manual_seed(case["seed"])
        ours = A.policy_loss_fn(case["mode"])(
            log_prob,
            case["old_log_prob"],
            case["advantages"],
            case["response_mask"],
            ACTOR["clip_ratio_low"],
            ACTOR["clip_ratio_high"],
            ACTOR["clip_ratio_c"],
            case["loss_agg_mode"],
            config=ACTOR,
            rollout_is_weights=case["rollout_is_weights"],
        )
        ours["pg_loss"].backward()
        scale = max(1.0, float(theirs["pg_loss"].abs()))
        assert float((ours["pg_loss"].detach() - theirs["pg_loss"]).abs()) <= tol * scale, label
        torch.testing.assert_close(log_prob.grad, theirs["grad"], atol=tol * scale, rtol=tol, msg=str(label))
        _close_metrics({k: float(v) for k, v in ours.items() if k != "pg_loss"}, theirs["metrics"], tol, label)
        # the weights change the loss: not all of them are 1
        assert float((case["rollout_is_weights"] - case["response_mask"]).abs().max()) > 0.1
