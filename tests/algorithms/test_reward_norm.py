"""ROLL's reward normalisation (`algorithm.reward_norm.*`, verl-npu's keys; verl_npu/algorithms/reward_norm.py):
the formulas against values worked out by hand and an independent numpy reference, the groupings, the clip,
the config rules, and a tiny CPU run where it changes the rewards and advantages the actor trains on."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from run_helpers import step_metrics, text_data, text_run_overrides

from verl_npu import algorithms as A
from verl_npu.algorithms.reward_norm import apply_reward_norm, group_keys, normalize_group, normalize_scores
from verl_npu.config import load_recipe
from verl_npu.config.typed import section


def norm(tree):
    """The typed `algorithm.reward_norm` section of `tree` (other keys at the schema's defaults)."""
    return section("algorithm.reward_norm", tree)


ALGO = section("algorithm")  # the estimator's settings at the schema's defaults
from verl_npu.errors import ConfigErrors
from verl_npu.trainer.entry import run_training


def reference(scores, keys, method, clip=None):
    """ROLL's normalisation written out with numpy: per group, mean and unbiased std; a group whose std is
    at most 1e-6 (or of one row) gives 0; asym_clip clamps to [-1, 3]; then the reward clip."""
    scores = np.asarray(scores, dtype=np.float64)
    out = np.empty_like(scores)
    for key in dict.fromkeys(keys):
        rows = [i for i, k in enumerate(keys) if k == key]
        x = scores[rows]
        if method == "identity":
            y = x
        elif len(x) < 2:
            y = np.zeros_like(x)
        elif method == "mean":
            y = x - x.mean()
        else:
            std = x.std(ddof=1)
            y = (x - x.mean()) / (std + 1e-6) if std > 1e-6 else np.zeros_like(x)
            if method == "asym_clip":
                y = np.clip(y, -1.0, 3.0)
        out[rows] = y
    return np.clip(out, -clip, clip) if clip is not None else out


def test_mean_std_by_hand():
    out = normalize_group(torch.tensor([0.0, 1.0, 1.0, 2.0], dtype=torch.float64), "mean_std")
    z = 1.0 / (math.sqrt(2.0 / 3.0) + 1e-6)  # mean 1, unbiased std sqrt(2/3)
    torch.testing.assert_close(out, torch.tensor([-z, 0.0, 0.0, z], dtype=torch.float64))


def test_asym_clip_clamps_both_sides_by_hand():
    # one outlier among 16: its z-score is 15 / sqrt(16) = 3.75 (above 3), the others -0.25
    high = normalize_group(torch.tensor([0.0] * 15 + [1.0], dtype=torch.float64), "asym_clip")
    assert float(high[-1]) == 3.0 and torch.allclose(
        high[:-1], torch.full((15,), -0.25, dtype=torch.float64), atol=1e-5
    )
    low = normalize_group(torch.tensor([1.0] * 15 + [0.0], dtype=torch.float64), "asym_clip")
    assert float(low[-1]) == -1.0 and torch.allclose(low[:-1], torch.full((15,), 0.25, dtype=torch.float64), atol=1e-5)
    # mean_std keeps the outlier's full z-score
    assert float(normalize_group(torch.tensor([0.0] * 15 + [1.0]), "mean_std")[-1]) == pytest.approx(3.75, rel=1e-5)


@pytest.mark.parametrize("method", ["mean", "mean_std", "asym_clip"])
def test_equal_scores_and_groups_of_one_give_zero(method):
    assert normalize_group(torch.tensor([0.7, 0.7, 0.7]), method).abs().max() == 0
    assert normalize_group(torch.tensor([5.0]), method).tolist() == [0.0]


def test_identity_keeps_scores():
    x = torch.tensor([0.2, -3.0, 7.0])
    assert torch.equal(normalize_group(x, "identity"), x)


@pytest.mark.parametrize("method", ["identity", "mean", "mean_std", "asym_clip"])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_normalize_scores_matches_the_numpy_reference(method, clip):
    g = torch.Generator().manual_seed(3)
    scores = torch.round(torch.randn(24, generator=g, dtype=torch.float64) * 3) / 2  # ties included
    scores[16:20] = 1.5  # one all-equal group
    keys = [i // 4 for i in range(20)] + ["single", "x", "x", "y"]
    ours, metrics = normalize_scores(scores, keys, method, clip)
    np.testing.assert_allclose(ours.numpy(), reference(scores.numpy(), keys, method, clip), atol=1e-12)
    assert metrics["critic/reward_norm/groups"] == len(set(keys))
    if clip is not None:
        unclipped, _ = normalize_scores(scores, keys, method)
        assert metrics["critic/reward_clip_frac"] == pytest.approx(float((unclipped.abs() > clip).float().mean()))
        assert float(ours.abs().max()) <= clip


def test_groupings_pick_uid_batch_or_data_source():
    uids, sources = ["a", "a", "b", "b"], ["gsm8k", "geo", "gsm8k", "gsm8k"]
    assert group_keys("state", uids, sources) == uids
    assert len(set(group_keys("batch", uids, sources))) == 1
    assert group_keys("inductive", uids, sources) == sources
    scores = torch.tensor([0.0, 1.0, 2.0, 4.0], dtype=torch.float64)
    by = {
        g: normalize_scores(scores, group_keys(g, uids, sources), "mean")[0].tolist()
        for g in ("state", "batch", "inductive")
    }
    assert by["state"] == [-0.5, 0.5, -1.0, 1.0]
    assert by["batch"] == [-1.75, -0.75, 0.25, 2.25]
    assert by["inductive"] == [-2.0, 0.0, 0.0, 2.0]  # gsm8k rows 0, 2, 3 (mean 2); geo alone: 0


def test_apply_reward_norm_puts_the_normalised_score_on_the_last_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    scores = torch.zeros(4, 4)
    scores[0, 2], scores[1, 0], scores[2, 1], scores[3, 3] = 1.0, 0.0, 1.0, 0.0
    cfg = norm({"grouping": "state", "method": "mean_std", "clip": None})
    out, metrics = apply_reward_norm(scores, mask, cfg, uids=["a", "a", "b", "b"])
    z = 0.5 / (math.sqrt(0.5) + 1e-6)  # scores 1 and 0: mean 0.5, unbiased std sqrt(0.5)
    expected = torch.zeros(4, 4)
    expected[0, 2], expected[1, 0], expected[2, 1], expected[3, 3] = z, -z, z, -z
    torch.testing.assert_close(out, expected)
    # the default (identity, no clip) returns the scores themselves, and None means the same
    assert (
        apply_reward_norm(
            scores, mask, norm({"grouping": "state", "method": "identity", "clip": None}), uids=list("aabb")
        )[0]
        is scores
    )
    assert apply_reward_norm(scores, mask, None, uids=list("aabb")) == (scores, {})
    assert A.apply_reward_norm is apply_reward_norm


def test_clip_alone_clamps_raw_scores():
    mask = torch.ones(3, 2)
    scores = torch.tensor([[0.0, 5.0], [0.0, -0.2], [0.0, -9.0]])
    out, metrics = apply_reward_norm(
        scores, mask, norm({"method": "identity", "grouping": "batch", "clip": 1.0}), uids=["a", "b", "c"]
    )
    assert out[:, 1].tolist() == pytest.approx([1.0, -0.2, -1.0]) and out[:, 0].abs().sum() == 0
    assert metrics["critic/reward_clip_frac"] == pytest.approx(2 / 3)


# ---- config --------------------------------------------------------------------------------------------------
def test_defaults_and_roll_values_are_accepted():
    rc = load_recipe("tiny_gsm8k", [])
    assert dict(rc.backend.algorithm.reward_norm) == {"method": "identity", "grouping": "state", "clip": None}
    for grouping in ("state", "batch", "inductive"):
        for method in ("identity", "mean", "mean_std", "asym_clip"):
            load_recipe(
                "tiny_gsm8k",
                [
                    f"algorithm.reward_norm.grouping={grouping}",
                    f"algorithm.reward_norm.method={method}",
                    "algorithm.reward_norm.clip=5",
                ],
            )


@pytest.mark.parametrize(
    "overrides,key,fragment",
    [
        (["algorithm.reward_norm.method=zscore"], "algorithm.reward_norm.method", "not one of"),
        (["algorithm.reward_norm.grouping=group"], "algorithm.reward_norm.grouping", "not one of"),
        (["algorithm.reward_norm.clip=0"], "algorithm.reward_norm.clip", "> 0"),
        (
            [
                "algorithm.reward_norm.method=mean_std",
                "actor_rollout_ref.rollout.n=1",
                "algorithm.adv_estimator=reinforce_plus_plus",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            ],
            "algorithm.reward_norm.grouping",
            "every group holds one response",
        ),
        (
            ["algorithm.reward_norm.method=asym_clip", "algorithm.adv_estimator=remax"],
            "algorithm.reward_norm.method",
            "greedy",
        ),
        (["algorithm.reward_norm.clip=1.0", "algorithm.adv_estimator=remax"], "algorithm.reward_norm.clip", "greedy"),
    ],
)
def test_bad_values_are_refused_by_key_with_a_fix(overrides, key, fragment):
    with pytest.raises(ConfigErrors) as err:
        load_recipe("tiny_gsm8k", overrides)
    problems = [p for p in err.value.problems if p.key == "backend_config." + key]
    assert problems and fragment in problems[0].message and problems[0].fix, str(err.value)


def test_batch_grouping_with_n_1_is_fine_and_grpo_no_op_warns():
    load_recipe(
        "tiny_gsm8k",
        [
            "algorithm.reward_norm.method=mean_std",
            "algorithm.reward_norm.grouping=batch",
            "actor_rollout_ref.rollout.n=1",
            "algorithm.adv_estimator=reinforce_plus_plus",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        ],
    )
    rc = load_recipe("tiny_gsm8k", ["algorithm.reward_norm.method=mean_std"])
    assert any("changes nothing with adv_estimator=grpo" in w for w in rc.warnings)
    rc = load_recipe("tiny_gsm8k", ["algorithm.reward_norm.method=asym_clip"])
    assert not any("reward_norm" in w for w in rc.warnings)


def test_grpo_undoes_mean_std_but_not_asym_clip():
    """The composition the warning describes: GRPO (std-normalised) on state- or batch-normalised scores
    gives GRPO's own advantages; asym_clip changes them."""
    g = torch.Generator().manual_seed(5)
    mask = torch.ones(16, 3, dtype=torch.float64)
    scores = torch.zeros(16, 3, dtype=torch.float64)
    scores[:, -1] = torch.randn(16, generator=g, dtype=torch.float64) * 3
    scores[15, -1] = 40.0  # an outlier asym_clip clamps
    uids = [i // 8 for i in range(16)]
    plain = A.compute_advantages("grpo", token_level_rewards=scores, response_mask=mask, group_ids=uids, config=ALGO)[0]
    for grouping in ("state", "batch"):
        normed, _ = apply_reward_norm(scores, mask, norm({"grouping": grouping, "method": "mean_std"}), uids=uids)
        again = A.compute_advantages(
            "grpo", token_level_rewards=normed, response_mask=mask, group_ids=uids, config=ALGO
        )[0]
        torch.testing.assert_close(again, plain, atol=1e-5, rtol=1e-5)
    clipped, _ = apply_reward_norm(scores, mask, norm({"grouping": "batch", "method": "asym_clip"}), uids=uids)
    changed = A.compute_advantages(
        "grpo", token_level_rewards=clipped, response_mask=mask, group_ids=uids, config=ALGO
    )[0]
    assert float((changed - plain).abs().max()) > 0.01  # the clamped outlier moves its group (1e-5 above)


# ---- a tiny CPU run --------------------------------------------------------------------------------------------
def test_a_run_trains_on_the_normalised_rewards(tmp_path):
    """Two 1-step runs of the tiny text model from the same seed (Dr.GRPO: no std division, so the scale of
    the rewards reaches the advantages): the same responses and raw scores; with reward_norm (batch, asym_clip,
    clip 2) the rewards and advantages logged are those of the dumped scores normalised by the formula."""
    data = text_data(tmp_path / "data", rows=8)
    rows = {}
    for name, extra in (
        ("plain", {}),
        (
            "normed",
            {
                "algorithm.reward_norm.grouping": "batch",
                "algorithm.reward_norm.method": "asym_clip",
                "algorithm.reward_norm.clip": 2.0,
            },
        ),
    ):
        overrides = text_run_overrides(
            tmp_path / name,
            data,
            **{
                "trainer.total_training_steps": 1,
                "algorithm.norm_adv_by_std_in_grpo": "false",
                "actor_rollout_ref.rollout.n": 4,
                "trainer.rollout_data_dir": tmp_path / f"{name}_rollouts",
                **extra,
            },
        )
        assert run_training(load_recipe("tiny_gsm8k", overrides)) == 0
        rows[name] = step_metrics(tmp_path / name)[1]
    plain, normed = rows["plain"], rows["normed"]
    dumped = [json.loads(line) for line in (tmp_path / "normed_rollouts" / "1.jsonl").read_text().splitlines()]
    assert [r["score"] for r in dumped] == [
        json.loads(line)["score"] for line in (tmp_path / "plain_rollouts" / "1.jsonl").read_text().splitlines()
    ]
    scores = np.array([r["score"] for r in dumped])
    assert len(set(scores.tolist())) > 1, "the varied reward gave one value: nothing to normalise"
    expected = reference(scores, [0] * len(scores), "asym_clip", 2.0)
    for stat, fn in (("mean", np.mean), ("max", np.max), ("min", np.min)):
        assert normed[f"critic/score/{stat}"] == pytest.approx(plain[f"critic/score/{stat}"])
        assert normed[f"critic/rewards/{stat}"] == pytest.approx(float(fn(expected)), abs=1e-5)
    # Dr.GRPO: A_i = r_i - mean of its prompt's rewards, the same on every response token
    uids = [r["uid"] for r in dumped]
    adv = np.array(
        [expected[i] - np.mean([expected[j] for j in range(len(uids)) if uids[j] == u]) for i, u in enumerate(uids)]
    )
    assert normed["critic/advantages/max"] == pytest.approx(float(adv.max()), abs=1e-5)
    assert normed["critic/advantages/min"] == pytest.approx(float(adv.min()), abs=1e-5)
    assert normed["critic/advantages/max"] != pytest.approx(plain["critic/advantages/max"], abs=1e-4)
    assert normed["critic/reward_norm/groups"] == 1.0


def test_the_kl_penalty_applies_to_the_normalised_scores(tmp_path):
    """With use_kl_in_reward the penalty is subtracted from the normalised score (ROLL's order): at step 1 the
    actor is the reference (KL 0), so the rewards are the batch-standardised scores, mean 0."""
    data = text_data(tmp_path / "data", rows=8)
    overrides = text_run_overrides(
        tmp_path / "out",
        data,
        **{
            "trainer.total_training_steps": 1,
            "actor_rollout_ref.rollout.n": 4,
            "algorithm.use_kl_in_reward": "true",
            "algorithm.reward_norm.grouping": "batch",
            "algorithm.reward_norm.method": "mean_std",
            "algorithm.adv_estimator": "reinforce_plus_plus",
        },
    )
    assert run_training(load_recipe("tiny_gsm8k", overrides)) == 0
    row = step_metrics(tmp_path / "out")[1]
    assert row["critic/score/max"] > row["critic/score/min"]
    assert abs(row["critic/rewards/mean"]) < 1e-5 and row["critic/rewards/max"] > 0.5
    assert row["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-6) and "actor/reward_kl_penalty_coeff" in row
