"""Every distillation loss mode and its metrics against upstream verl 0.9.1's own functions (issue 38).

verl runs in its side venv (VERL_SIDE_PYTHON, built by tests/verl_side.sh) as a subprocess:
tests/helpers/verl_side_distill.py calls verl's FSDP top-k logits processor and `verl.trainer.distillation.losses.
distillation_loss` on the same inputs given to verl-npu's `verl_npu.algorithms.distillation` here. Compared,
for forward_kl_topk and each single-sample estimator (kl, k1, abs, mse, k2, low_var_kl, k3), supervised and
as a policy gradient, with and without the clamps, for every loss_agg_mode with global-batch counts: the loss,
its gradient with respect to the student's logits (top-k, supervised) or log-probs, and every metric (the
same names; none missing on either side). Inputs: ragged responses (one of a single token), a hole in one
response mask, teacher top-k ids that partly overlap the student's own top-k, log-probs spread wide enough
that both clamps bite.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from run_helpers import run_on_verl_side, verl_side_python

from verl_npu.algorithms import LOSS_AGG_MODES
from verl_npu.algorithms import distillation as D

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tests" / "helpers" / "verl_side_distill.py"
pytestmark = pytest.mark.verl_side
verl_side_python()

LENGTHS = [5, 1, 4, 3]
P, R, V, K = 2, 5, 11, 4


def loss_settings(mode: str, pg: bool, clamps: bool) -> dict:
    return {
        "loss_mode": mode,
        "topk": K,
        "use_task_rewards": True,
        "distillation_loss_coef": 1.0,
        "loss_max_clamp": 0.6 if clamps else None,
        "log_prob_min_clamp": -3.0 if clamps else None,
        "use_policy_gradient": pg,
        "policy_loss_mode": "vanilla",
        "clip_ratio": 0.2,
        "clip_ratio_low": 0.15,
        "clip_ratio_high": 0.25,
    }


def inputs(seed: int, mode: str) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(R).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)).float()
    mask[0, 2] = 0.0  # a hole (a tool turn inside the response)
    logits = torch.randn(len(LENGTHS), R, V, generator=g) * 2.5
    log_prob = torch.log_softmax(logits, -1)[..., 0] - torch.rand(len(LENGTHS), R, generator=g)
    out = {
        "response_mask": mask,
        "log_prob": log_prob,
        "old_log_prob": log_prob + torch.randn(len(LENGTHS), R, generator=g) * 0.4,
        "rollout_is_weights": torch.rand(len(LENGTHS), R, generator=g) + 0.5,
    }
    if mode in D.TOPK_MODES:
        teacher = torch.log_softmax(torch.randn(len(LENGTHS), R, V, generator=g) * 3.0, -1)
        # half the positions: the teacher's top-k; the other half: arbitrary distinct ids (partial overlap)
        top_lp, top_ids = torch.topk(teacher, K, dim=-1)
        shuffled = torch.argsort(torch.rand(len(LENGTHS), R, V, generator=g), dim=-1)[..., :K]
        use_top = torch.rand(len(LENGTHS), R, 1, generator=g) < 0.5
        ids = torch.where(use_top, top_ids, shuffled)
        out.update(student_logits=logits, teacher_topk_ids=ids, teacher_topk_log_probs=torch.gather(teacher, -1, ids))
    else:
        out["teacher_log_prob"] = log_prob + torch.randn(len(LENGTHS), R, generator=g) * 1.2
    return out


def cases() -> list[dict]:
    found = []
    for mode in D.DISTILLATION_LOSS_MODES:
        for pg in (False, True):
            if mode in ("k1", "kl") and not pg:
                continue  # verl refuses k1 as a supervised loss (its gradient ignores the teacher); so does verl-npu
            for agg in LOSS_AGG_MODES:
                for clamps in (False, True):
                    seed = 10 + len(found)
                    tokens = float(inputs(seed, mode)["response_mask"].sum())
                    found.append(
                        {
                            **inputs(seed, mode),
                            "loss": loss_settings(mode, pg, clamps),
                            "loss_agg_mode": agg,
                            "prompt_length": P,
                            "response_lengths": LENGTHS,
                            "global_batch_info": {
                                "dp_size": 2,
                                "batch_num_tokens": tokens * 1.5,
                                "global_batch_size": 6,
                                "loss_scale_factor": 7,
                            },
                        }
                    )
    return found


def ours(case: dict) -> dict:
    cfg = SimpleNamespace(**case["loss"])
    info = case["global_batch_info"]
    agg = {
        "global_tokens": info["batch_num_tokens"],
        "global_seqs": info["global_batch_size"],
        "dp_size": info["dp_size"],
        "loss_scale_factor": info["loss_scale_factor"],
    }
    mask = case["response_mask"]
    log_prob = case["log_prob"].clone().requires_grad_(True)
    wrt = log_prob
    if cfg.loss_mode in D.TOPK_MODES:
        logits = case["student_logits"].clone().requires_grad_(True)
        out = D.forward_kl_topk_per_token(
            logits, case["teacher_topk_log_probs"], case["teacher_topk_ids"], cfg.log_prob_min_clamp
        )
        per_token, metrics = D.topk_losses(out), D.topk_metrics(out, mask, cfg.topk)
        if not cfg.use_policy_gradient:
            wrt = logits
    else:
        per_token, metrics = D.estimator_per_token(log_prob, case["teacher_log_prob"], cfg.loss_mode, mask)
    loss, term_metrics = D.distillation_term(
        per_token,
        mask,
        cfg,
        case["loss_agg_mode"],
        log_prob=log_prob,
        old_log_prob=case["old_log_prob"],
        rollout_is_weights=case["rollout_is_weights"],
        **agg,
    )
    loss.backward()
    return {"loss": loss.detach(), "grad": wrt.grad, "metrics": {**metrics, **term_metrics}}


def test_every_distillation_loss_mode_and_its_metrics_equal_verl_091s(tmp_path):
    all_cases = cases()
    assert {c["loss"]["loss_mode"] for c in all_cases} == set(D.DISTILLATION_LOSS_MODES)
    theirs = run_on_verl_side(TOOL, all_cases, tmp_path)
    clamped_somewhere = set()
    for case, verl in zip(all_cases, theirs):
        mine = ours(case)
        label = f"{case['loss']} {case['loss_agg_mode']}"
        assert torch.allclose(mine["loss"].double(), verl["loss"].double(), atol=1e-5, rtol=1e-5), label
        mask = case["response_mask"].bool()
        assert torch.allclose(mine["grad"][mask].double(), verl["grad"][mask].double(), atol=1e-5, rtol=1e-4), label
        assert set(mine["metrics"]) == set(verl["metrics"]), label
        for name, value in verl["metrics"].items():
            assert mine["metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-6), f"{label}: {name}"
        if case["loss"]["loss_max_clamp"] is not None and verl["metrics"]["distillation/loss_max"] > 0.6:
            clamped_somewhere.add(case["loss"]["loss_mode"])
    # the inputs make the loss clamp bite for every mode whose per-token loss can exceed it
    assert {"forward_kl_topk", "k2", "k3", "abs"} <= clamped_somewhere
