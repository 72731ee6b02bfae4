"""Rollout correction (`algorithm.rollout_correction.*`, verl 0.9.1): the tensor functions, the bypass_mode loss, the
hf engine's own log-probs, the config rules, and tiny CPU runs of the text model with the hf engine.

(The numbers against upstream verl itself: tests/algorithms/test_verl_rollout_correction.py, in the verl side venv.)
"""

from __future__ import annotations

import math

import pytest
import torch
from run_helpers import step_metrics, text_data, text_run_overrides
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_npu import algorithms as A
from verl_npu.batch import Batch
from verl_npu.config import load_recipe
from verl_npu.config.typed import section
from verl_npu.errors import ConfigErrors
from verl_npu.models.forward import response_log_probs
from verl_npu.rollout.base import SamplingParams
from verl_npu.rollout.hf import HFRollout
from verl_npu.trainer.entry import run_training

MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)


def _log_ratio(seed=0, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(MASK.shape, generator=g, dtype=torch.float64) * scale


# ---- importance weights ------------------------------------------------------------------------------------------
def test_token_tis_weights_are_truncated_ratios_and_zero_on_padding():
    d = _log_ratio()
    d[0, 0], d[1, 1] = 100.0, -100.0  # beyond the safety bound
    w, m = A.rollout_is_weights(d, MASK, "token", 1.5)
    expected = torch.exp(d.clamp(-20, 20)).clamp(max=1.5) * MASK
    torch.testing.assert_close(w, expected)
    assert w[0, 0] == 1.5 and 0 < w[1, 1] < 1e-8 and (w[MASK == 0] == 0).all()
    assert m["rollout_is_max"] == 1.5 and m["rollout_is_ratio_fraction_high"] > 0


def test_sequence_weight_is_the_product_of_token_ratios_on_every_token():
    d = _log_ratio(1, 0.3)
    w, m = A.rollout_is_weights(d, MASK, "sequence", 10.0)
    for row, n in enumerate([4, 2, 1]):
        weight = math.exp(float(d[row, :n].sum()))
        torch.testing.assert_close(w[row, :n], torch.full((n,), min(weight, 10.0), dtype=torch.float64))
    assert (w[3] == 0).all()
    assert m["rollout_is_max"] == pytest.approx(math.exp(max(float((d * MASK)[r].sum()) for r in range(4))))


def test_icepop_zeroes_weights_outside_the_range_and_batch_normalisation_gives_mean_one():
    d = torch.log(
        torch.tensor([[0.4, 0.9, 1.1, 6.0], [1.0, 2.0, 1, 1], [0.7, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.float64)
    )
    w, m = A.rollout_is_weights(d, MASK, "token", "0.5_5.0")
    assert w[0].tolist() == pytest.approx([0.0, 0.9, 1.1, 0.0])
    assert m["rollout_is_oob_ratio"] == pytest.approx(2 / 7)
    normed, m = A.rollout_is_weights(d, MASK, "token", "0.5_5.0", batch_normalize=True)
    assert float((normed * MASK).sum() / MASK.sum()) == pytest.approx(1.0)
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(float((w * MASK).sum() / MASK.sum()))
    seq, _ = A.rollout_is_weights(_log_ratio(2), MASK, "sequence", 3.0, batch_normalize=True)
    assert float(seq[:3, 0].mean()) == pytest.approx(1.0)  # the mean over the three non-empty rows


def test_weights_carry_no_gradient():
    d = _log_ratio().requires_grad_(True)
    w, _ = A.rollout_is_weights(d, MASK, "token", 2.0)
    assert not w.requires_grad


# ---- rejection ---------------------------------------------------------------------------------------------------
def test_token_k1_keeps_ratios_between_the_bounds_and_seq_max_rejects_whole_responses():
    d = torch.tensor([[0.0, 0.3, -0.3, 0.1], [0.0, 0.05, 0, 0], [0.9, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
    # k1 = -d; bounds 0.8_1.2: log 0.8 = -0.223 <= -d <= log 1.2 = 0.182
    mask, m = A.rollout_rejection_mask(d, MASK, "token_k1", "0.8_1.2")
    assert mask.tolist() == [[1, 0, 0, 1], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert m["rollout_rs_token_k1_masked_fraction"] == pytest.approx(3 / 7)
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(2 / 4)  # of all rows, as verl counts
    # seq_max_k2: a response goes when its largest d²/2 passes 0.03 (|d| > 0.245): rows 0 and 2
    mask, _ = A.rollout_rejection_mask(d, MASK, "seq_max_k2", 0.03)
    assert mask.tolist() == [[0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    # chained: a token must pass every option (k1 with one number U: bounds 1/U .. U; the repeat is dropped)
    both, _ = A.rollout_rejection_mask(d, MASK, "token_k1, seq_max_k2,token_k1", "1.25,0.03")
    assert both.tolist() == [[0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]


def test_rejection_keeps_the_mask_dtype_and_seq_mean_uses_the_row_mean():
    d = torch.tensor([[0.2, 0.2, 0.2, 0.2], [0.5, -0.5, 0, 0], [0.1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
    mask, _ = A.rollout_rejection_mask(d, MASK.bool(), "seq_mean_k2", 0.05)  # mean d²/2: 0.02, 0.125, 0.005
    assert mask.dtype == torch.bool
    assert mask.long().tolist() == [[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    sums, _ = A.rollout_rejection_mask(d, MASK.long(), "seq_sum_k2", 0.05)  # sums: 0.08, 0.25, 0.005
    assert sums.dtype == torch.long and sums[:3, 0].tolist() == [0, 0, 1]


@pytest.mark.parametrize(
    "options, thresholds, message",
    [
        ("token_k4", 1.0, "'token_k4' is not an option"),
        ("seq_max_k1", 1.0, "'seq_max_k1' is not an option"),
        ("token_k1,token_k2", "1.5,0.1,0.2", "3 thresholds for 2 rollout_rs options"),
        ("token_k2", "0.5_2.0", "takes one upper bound"),
        ("token_k1", "2.0_0.5", "lower bound is above the upper bound"),
        ("token_k3", 0, "must be positive"),
        ("token_k3", None, "every option needs a threshold"),
    ],
)
def test_bad_rejection_settings_are_refused(options, thresholds, message):
    with pytest.raises(ValueError, match=message):
        A.rollout_rejection_mask(_log_ratio(), MASK, options, thresholds)


def test_correction_prefixes_metrics_and_leaves_the_mask_alone_without_rejection():
    old, rollout = -torch.rand(MASK.shape, dtype=torch.float64), -torch.rand(MASK.shape, dtype=torch.float64)
    out = A.compute_rollout_correction(old, rollout, MASK)
    assert out.weights is None and torch.equal(out.response_mask, MASK) and out.response_mask is not MASK
    assert out.metrics["rollout_corr/kl"] == pytest.approx(float(((rollout - old) * MASK).sum() / MASK.sum()))
    assert all(k.startswith("rollout_corr/") for k in out.metrics)


# ---- the policy losses ------------------------------------------------------------------------------------------
def _loss_inputs(seed=3):
    g = torch.Generator().manual_seed(seed)
    mask = MASK[:3]
    rollout = -torch.rand(mask.shape, generator=g, dtype=torch.float64) - 0.1
    log_prob = rollout + torch.randn(mask.shape, generator=g, dtype=torch.float64) * 0.1
    adv = torch.randn(3, 1, generator=g, dtype=torch.float64).expand_as(mask) * mask
    return log_prob.requires_grad_(True), rollout, adv, mask


def test_is_weights_scale_each_tokens_policy_loss():
    log_prob, old, adv, mask = _loss_inputs()
    w = torch.rand(mask.shape, dtype=torch.float64) * mask
    plain = A.ppo_policy_loss(log_prob, old, adv, mask)["pg_loss"]
    weighted = A.ppo_policy_loss(log_prob, old, adv, mask, rollout_is_weights=w)["pg_loss"]
    (g_plain,) = torch.autograd.grad(plain, log_prob)
    (g_weighted,) = torch.autograd.grad(weighted, log_prob)
    torch.testing.assert_close(g_weighted, g_plain * w)


def test_bypass_ppo_clip_is_vanilla_with_the_rollout_as_old_policy():
    log_prob, rollout, adv, mask = _loss_inputs()
    settings = section(
        "algorithm.rollout_correction", {"rollout_is": "token", "rollout_is_threshold": 2.0, "loss_type": "ppo_clip"}
    )
    out = A.policy_loss_fn("bypass_mode")(log_prob, rollout, adv, mask, rollout_correction=settings)
    vanilla = A.ppo_policy_loss(log_prob, rollout, adv, mask)
    torch.testing.assert_close(out["pg_loss"], vanilla["pg_loss"])  # the weights are not applied twice
    assert out["rollout_corr/rollout_is_mean"] > 0 and "rollout_corr/kl" in out


def test_bypass_reinforce_weights_the_log_prob_gradient_and_rejected_tokens_get_none():
    log_prob, rollout, adv, mask = _loss_inputs()
    settings = section(
        "algorithm.rollout_correction",
        {
            "rollout_is": "token",
            "rollout_is_threshold": 1.05,
            "loss_type": "reinforce",
            "rollout_rs": "token_k2",
            "rollout_rs_threshold": 0.004,
        },
    )
    out = A.policy_loss_fn("bypass_mode")(log_prob, rollout, adv, mask, rollout_correction=settings)
    (grad,) = torch.autograd.grad(out["pg_loss"], log_prob)
    d = (log_prob - rollout).detach()
    kept = (0.5 * d.square() <= 0.004).double() * mask
    assert 0 < kept.sum() < mask.sum()
    w = torch.exp(d).clamp(max=1.05)
    torch.testing.assert_close(grad, -adv * w * kept / kept.sum())
    assert out["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 - float(kept.sum() / mask.sum()))


# ---- the hf engine's log-probs ------------------------------------------------------------------------------------
def _prompts(tok):
    tok.padding_side = "left"
    enc = tok(["a short one", "a much longer prompt with more words"], return_tensors="pt", padding=True)
    return Batch({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}, {"uid": ["a", "b"]})


def test_hf_log_probs_are_the_sampling_distributions(tiny_lm_path):
    tok = AutoTokenizer.from_pretrained(tiny_lm_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32).eval()
    prompts = _prompts(tok)
    plain = SamplingParams(n=2, temperature=0.7, max_new_tokens=5)
    out = HFRollout(model, tok, seed=3, log_probs=True).generate(prompts, plain)
    assert "rollout_log_probs" not in HFRollout(model, tok, seed=3).generate(prompts, plain)
    mask = out["response_mask"].bool()
    with torch.no_grad():  # temperature only: the actor's log-probs at that temperature
        actor, _ = response_log_probs(model, out["input_ids"], out["attention_mask"], 5, temperature=0.7)
    torch.testing.assert_close(out["rollout_log_probs"][mask], actor[mask], atol=1e-4, rtol=1e-4)
    assert (out["rollout_log_probs"][~mask] == 0).all()
    # top-k renormalises over the k kept tokens: the sampled tokens' log-probs rise, the samples stay the same
    top = HFRollout(model, tok, seed=3, log_probs=True).generate(
        prompts, SamplingParams(n=2, temperature=0.7, top_k=3, max_new_tokens=5)
    )
    with torch.no_grad():
        actor_top, _ = response_log_probs(model, top["input_ids"], top["attention_mask"], 5, temperature=0.7)
    kept = top["response_mask"].bool()
    assert (top["rollout_log_probs"][kept] > actor_top[kept] + 1e-3).all()
    greedy = HFRollout(model, tok, log_probs=True).generate(
        prompts, SamplingParams(n=1, do_sample=False, max_new_tokens=5)
    )
    with torch.no_grad():  # greedy: the plain (temperature 1) distribution, as vLLM reports it
        actor_greedy, _ = response_log_probs(model, greedy["input_ids"], greedy["attention_mask"], 5)
    g_mask = greedy["response_mask"].bool()
    torch.testing.assert_close(greedy["rollout_log_probs"][g_mask], actor_greedy[g_mask], atol=1e-4, rtol=1e-4)


# ---- config ------------------------------------------------------------------------------------------------------
RC = "algorithm.rollout_correction."


def _problems(*overrides) -> str:
    with pytest.raises(ConfigErrors) as info:
        load_recipe("tiny_gsm8k", list(overrides))
    return str(info.value)


@pytest.mark.parametrize(
    "overrides, key, fix",
    [
        ([RC + "rollout_is=tokens"], "rollout_correction.rollout_is", "pick one of: token, sequence"),
        ([RC + "rollout_is=token", RC + "rollout_is_threshold=-2"], "rollout_is_threshold", "set a positive number"),
        ([RC + "rollout_is=token", RC + "rollout_is_threshold='3.0_1.0'"], "rollout_is_threshold", "lower <= upper"),
        ([RC + "rollout_is=token", RC + "rollout_is_threshold=null"], "rollout_is_threshold", "rollout_is=null"),
        ([RC + "rollout_is_threshold=true"], "rollout_is_threshold", "float | str"),
        ([RC + "rollout_rs=token_k1,seq_max_k1", RC + "rollout_rs_threshold=2.0"], "rollout_rs", "separated by commas"),
        ([RC + "rollout_rs=seq_mean_k3"], "rollout_rs_threshold", "upper bound > 0"),
        (
            [RC + "rollout_rs=token_k1,token_k2", RC + "rollout_rs_threshold='1.5,0.1,0.1'"],
            "rollout_rs_threshold",
            "one per option",
        ),
        (
            [RC + "rollout_is=token", "actor_rollout_ref.rollout.calculate_log_probs=false"],
            "rollout.calculate_log_probs",
            "set actor_rollout_ref.rollout.calculate_log_probs=true",
        ),
        (
            [RC + "bypass_mode=true", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"],
            "policy_loss.loss_mode",
            "bypass_mode=false to keep gspo",
        ),
        (
            ["actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode"],
            "policy_loss.loss_mode",
            "set algorithm.rollout_correction.bypass_mode=true",
        ),
        ([RC + "loss_type=ppo"], "loss_type", "pick one of: ppo_clip, reinforce"),
    ],
)
def test_bad_rollout_correction_settings_name_the_key_and_the_fix(overrides, key, fix):
    text = _problems(*overrides)
    assert key in text and fix in text, text


def test_rollout_correction_turns_on_the_rollout_log_probs_and_the_bypass_loss():
    rc = load_recipe(
        "tiny_gsm8k",
        [
            RC + "rollout_is=sequence",
            RC + "rollout_rs=token_k1,seq_mean_k3",
            RC + "rollout_rs_threshold='0.5_2.0,0.01'",
            RC + "bypass_mode=true",
            RC + "loss_type=reinforce",
            RC + "rollout_is_threshold='0.5_5.0'",
        ],
    )
    assert rc.backend.actor_rollout_ref.rollout.calculate_log_probs is True
    assert rc.backend.actor_rollout_ref.actor.policy_loss.loss_mode == "bypass_mode"
    assert {d.key for d in rc.derived} >= {
        "backend_config.actor_rollout_ref.rollout.calculate_log_probs",
        "backend_config.actor_rollout_ref.actor.policy_loss.loss_mode",
    }
    off = load_recipe("tiny_gsm8k", [])
    assert off.backend.actor_rollout_ref.rollout.calculate_log_probs is False
    assert off.backend.algorithm.rollout_correction.rollout_is is None


# ---- tiny CPU runs (hf engine) ----------------------------------------------------------------------------------
def _run(tmp_path, name, **extra) -> dict:
    data = text_data(tmp_path / "data")
    rc = load_recipe(
        "tiny_gsm8k",
        text_run_overrides(
            tmp_path / name,
            data,
            **{
                "trainer.total_training_steps": 1,
                "actor_rollout_ref.rollout.top_p": 0.9,
                "actor_rollout_ref.actor.entropy_coeff": 0,
                **extra,
            },
        ),
    )
    assert run_training(rc) == 0
    return step_metrics(tmp_path / name)[1]


def test_tiny_runs_log_the_metrics_and_the_correction_changes_the_update(tmp_path):
    """top_p=0.9 on the near-uniform tiny model: the rollout's (renormalised) probabilities are ~1/0.9 of the
    actor's, so every IS weight is ~0.9 and the update's gradient shrinks by that factor; the samples are the
    same in every run (same seeds)."""
    off = _run(tmp_path, "off")
    assert not any(k.startswith("rollout_corr/") for k in off)
    on = _run(
        tmp_path,
        "on",
        **{
            RC + "rollout_is": "token",
            RC + "rollout_is_threshold": 2.0,
            RC + "rollout_rs": "token_k1",
            RC + "rollout_rs_threshold": "0.5_2.0",
        },
    )
    weight = on["rollout_corr/rollout_is_mean"]
    assert 0.85 < weight < 0.95 and on["rollout_corr/rollout_rs_masked_fraction"] == 0
    assert {
        "rollout_corr/kl",
        "rollout_corr/chi2_seq",
        "rollout_corr/rollout_rs_token_k1_mean",
        "rollout_corr/rollout_is_eff_sample_size",
        "training/rollout_probs_diff_mean",
    } <= set(on)
    assert on["critic/score/mean"] == off["critic/score/mean"]  # the same responses
    assert on["actor/grad_norm"] == pytest.approx(weight * off["actor/grad_norm"], rel=0.01)
    # bypass mode: no old-log-prob pass, the loss computes the correction (its metrics come from the update)
    bypass = _run(
        tmp_path, "bypass", **{RC + "bypass_mode": "true", RC + "loss_type": "reinforce", RC + "rollout_is": "token"}
    )
    assert "actor/entropy_before_update" not in bypass and "timing_s/old_log_prob" in bypass
    assert 0.85 < bypass["rollout_corr/rollout_is_mean"] < 0.95 and "actor/ppo_kl" in bypass
    assert bypass["actor/grad_norm"] == pytest.approx(
        bypass["rollout_corr/rollout_is_mean"] * off["actor/grad_norm"], rel=0.02
    )
    # every token rejected (d²/2 ~ 0.0055 > 0.001): no policy gradient at all
    rejected = _run(tmp_path, "rejected", **{RC + "rollout_rs": "token_k2", RC + "rollout_rs_threshold": 0.001})
    assert rejected["rollout_corr/rollout_rs_masked_fraction"] == 1.0
    assert rejected["actor/grad_norm"] == 0.0 and rejected["response_length/mean"] == off["response_length/mean"]


def test_verls_multi_rs_example_validates():
    """verl's examples/rollout_correction/run_with_rollout_corr_multi_rs.sh (@ 83e82cd): its rollout-correction,
    rollout and batch overrides as written (Hydra's quotes kept). Two of its lines are left out, neither about
    rollout correction: `hydra.run.dir` (Hydra's own, refused here as an unknown top-level key) and no
    `rollout.n` (verl's default 1, which verl-npu refuses for grpo), so n=4 is added."""
    script = [
        RC + "rollout_is=token",
        RC + "rollout_is_threshold=2.0",
        RC + "rollout_is_batch_normalize=false",
        RC + "rollout_rs='token_k1,seq_max_k2'",
        RC + "rollout_rs_threshold='0.6_1.6,2.5'",
        RC + "bypass_mode=true",
        RC + "loss_type=ppo_clip",
        "algorithm.adv_estimator=grpo",
        "data.max_prompt_length=2048",
        "data.max_response_length=4096",
        "data.train_batch_size=128",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "trainer.n_gpus_per_node=4",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.model.path=/models/Qwen2.5-3B",
        "trainer.device=npu",
    ]
    rc = load_recipe("tiny_gsm8k", script)
    settings = rc.backend.algorithm.rollout_correction
    assert settings.rollout_rs == "token_k1,seq_max_k2" and settings.rollout_rs_threshold == "0.6_1.6,2.5"
    assert rc.backend.actor_rollout_ref.actor.policy_loss.loss_mode == "bypass_mode"


def test_the_hf_engine_is_not_stopped_for_renormalised_probabilities():
    """The hf engine samples from the actor's module: with top-k / top-p its log-probs differ from the actor's by
    the renormalisation only, so rollout.max_probs_diff (meant for engines with their own weights) does not stop it."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from verl_npu.trainer.ppo import PPOTrainer

    trainer = PPOTrainer.__new__(PPOTrainer)
    trainer.checkpoints, trainer.global_step = SimpleNamespace(root="/ckpts"), 1
    old = torch.log(torch.full((2, 3), 0.2))
    batch = Batch({"old_log_probs": old, "rollout_log_probs": old + math.log(2.0), "response_mask": torch.ones(2, 3)})
    trainer.cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "hf", "max_probs_diff": 0.05}}})
    assert trainer.check_rollout_sync(batch)["training/rollout_probs_diff_mean"] == pytest.approx(0.2)
    trainer.cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": "vllm", "max_probs_diff": 0.05}}})
    with pytest.raises(Exception, match="out of sync"):
        trainer.check_rollout_sync(batch)
