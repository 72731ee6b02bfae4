"""The fast paths of a step change nothing but speed: batched sampling stays reproducible, and the
skipped old-log-prob pass gives the metrics of a run that does it."""

from __future__ import annotations

import pytest
from run_helpers import step_metrics, text_data
from run_helpers import text_run_overrides as overrides

from verl_npu.config import load_recipe
from verl_npu.trainer.entry import run_training

COMPARED = [
    "critic/score/mean",
    "response_length/mean",
    "actor/pg_loss",
    "actor/entropy",
    "actor/grad_norm",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/entropy_before_update",
    "critic/advantages/mean",
]


def _count_forwards(monkeypatch) -> list[int]:
    """Counts response_log_probs calls made by the worker (old-log-prob pass and update)."""
    import verl_npu.workers.actor as actor

    calls = [0]
    real = actor.response_log_probs

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(actor, "response_log_probs", counted)
    return calls


@pytest.mark.slow
def test_same_seed_same_workers_give_identical_metrics(tmp_path, tiny_cache):
    data = text_data(tmp_path / "data")
    runs = []
    for name in ("a", "b"):
        assert run_training(load_recipe("tiny_geo3k", overrides(tmp_path / name, data))) == 0
        runs.append(step_metrics(tmp_path / name))
    for step in (1, 2):
        a = {k: v for k, v in runs[0][step].items() if not k.startswith(("timing_s/", "perf/", "actor/perf/"))}
        b = {k: v for k, v in runs[1][step].items() if not k.startswith(("timing_s/", "perf/", "actor/perf/"))}
        assert a == b


@pytest.mark.slow
def test_skipped_old_log_prob_pass_gives_the_same_run(tmp_path, tiny_cache, monkeypatch):
    """hf rollout, one epoch, one mini-batch: the update's own forward gives the old log-probs; the
    metrics equal those of a run that does the pass (forced here), and one forward per micro-batch
    is saved."""
    import verl_npu.workers.actor as actor

    data = text_data(tmp_path / "data")
    calls = _count_forwards(monkeypatch)
    assert run_training(load_recipe("tiny_geo3k", overrides(tmp_path / "skip", data))) == 0
    skipped_calls = calls[0]
    assert skipped_calls == 4  # 2 steps x 2 update micro-batches of 4 rows (4 prompts x 2 samples)
    assert "old-log-prob pass: skipped" in (tmp_path / "skip" / "logs" / "run.log").read_text()

    real = actor.old_log_prob_pass_needed
    monkeypatch.setattr(actor, "old_log_prob_pass_needed", lambda cfg, module: real(cfg, module) + ["forced"])
    calls[0] = 0
    assert run_training(load_recipe("tiny_geo3k", overrides(tmp_path / "pass", data))) == 0
    assert calls[0] == skipped_calls + 4  # plus 2 old-log-prob micro-batches per step
    skip, full = step_metrics(tmp_path / "skip"), step_metrics(tmp_path / "pass")
    for step in (1, 2):
        for key in COMPARED:
            assert skip[step][key] == pytest.approx(full[step][key], rel=1e-4, abs=1e-6), (step, key)
        assert skip[step]["actor/ppo_kl"] == 0.0 and skip[step]["actor/pg_clipfrac"] == 0.0
    assert skip[2]["actor/grad_norm"] > 0


@pytest.mark.parametrize(
    "extra, reason",
    [
        ({"actor_rollout_ref.actor.ppo_epochs": 2}, "ppo_epochs=2"),
        ({"data.train_batch_size": 8}, "ppo_mini_batch_size=4 < data.train_batch_size=8"),
        ({"algorithm.use_kl_in_reward": "true"}, "use_kl_in_reward"),
        ({"algorithm.rollout_correction.rollout_is": "token"}, "rollout.calculate_log_probs"),
        ({"actor_rollout_ref.model.override_config.attention_dropout": 0.1}, "attention_dropout=0.1"),
    ],
)
def test_old_log_prob_pass_runs_where_it_is_not_redundant(tmp_path, tiny_lm_path, extra, reason):
    from transformers import AutoModelForCausalLM

    from verl_npu.workers.actor import old_log_prob_pass_needed

    rc = load_recipe("tiny_geo3k", overrides(tmp_path / "out", tmp_path, **extra))
    dropout = extra.get("actor_rollout_ref.model.override_config.attention_dropout", 0.0)
    module = AutoModelForCausalLM.from_pretrained(tiny_lm_path, attention_dropout=dropout)
    reasons = old_log_prob_pass_needed(rc.backend, module)
    assert any(reason in r for r in reasons), reasons
    if dropout:  # the same config without dropout needs no pass
        assert old_log_prob_pass_needed(rc.backend, AutoModelForCausalLM.from_pretrained(tiny_lm_path)) == []
