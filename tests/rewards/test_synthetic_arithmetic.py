"""The synthetic arithmetic task's reward (data_source synthetic_arithmetic): registered, 0.8 for a right
answer with trailing text, 1.0 for a right answer alone (a bare number or GSM8K's `#### n`), and what a
question-blind policy can get."""

from __future__ import annotations

import random

import pytest

from verl_npu.data import synthetic_arithmetic
from verl_npu.rewards import default_compute_score, registered_data_sources
from verl_npu.rewards import synthetic_arithmetic as reward


def score(response: str, truth: str = "7") -> dict:
    return default_compute_score("synthetic_arithmetic", response, truth)


def test_registered_under_its_data_source():
    assert "synthetic_arithmetic" in registered_data_sources()
    assert synthetic_arithmetic.DATA_SOURCE == "synthetic_arithmetic"


@pytest.mark.parametrize(
    "response, expected",
    [  # (score, accuracy, clean, format)
        ("#### 7", (1.0, 1.0, 1.0, 1.0)),  # GSM8K's format alone, right
        ("####7", (1.0, 1.0, 1.0, 1.0)),
        ("7", (1.0, 1.0, 1.0, 0.0)),  # a bare right number, the end of the turn right after it
        (" 7 ", (1.0, 1.0, 1.0, 0.0)),  # white space aside
        ("7<|im_end|>", (0.8, 1.0, 0.0, 0.0)),  # decoded without special tokens this is "7": here it is text
        ("3 + 4 = 7\n#### 7", (0.8, 1.0, 0.0, 1.0)),  # right, with more than the answer
        ("x 7 4", (0.8, 1.0, 0.0, 0.0)),  # the first number is the answer; trailing text
        ("7 +", (0.8, 1.0, 0.0, 0.0)),
        ("77", (0.0, 0.0, 1.0, 0.0)),  # the number 77: wrong, though nothing else was written
        ("4 7", (0.0, 0.0, 0.0, 0.0)),
        ("4 #### 7", (0.8, 1.0, 0.0, 1.0)),  # the number after the last #### wins over the first number
        ("7 #### 4", (0.0, 0.0, 0.0, 1.0)),  # the format, a wrong answer: no credit for form alone
        ("#### .", (0.0, 0.0, 0.0, 0.0)),  # '####' without a number is no format
        ("7.0", (1.0, 1.0, 1.0, 0.0)),
        ("", (0.0, 0.0, 0.0, 0.0)),
        ("seven", (0.0, 0.0, 0.0, 0.0)),
    ],
)
def test_scores(response, expected):
    result = score(response)
    assert (result["score"], result["accuracy"], result["clean"], result["format"]) == pytest.approx(expected)


def test_a_random_policy_gets_some_credit_and_a_blind_one_stays_below_the_bound():
    """What the demo relies on: random tokens sometimes score, and a policy that ignores the
    question cannot beat BLIND_BEST_SCORE."""
    assert reward.MAX_NUMBER == synthetic_arithmetic.MAX_NUMBER
    rows = synthetic_arithmetic.generate_rows(1000, seed=0)
    truths = [r["answer"].rsplit("#### ", 1)[1] for r in rows]
    rng = random.Random(0)
    vocabulary = [str(d) for d in range(10)] + ["a", "the", " ", "?", "#", "."] * 20  # mostly non-digits
    random_scores = [score("".join(rng.choice(vocabulary) for _ in range(3)), t)["score"] for t in truths]
    assert 0.0 < sum(random_scores) / len(random_scores) < 0.1
    best_blind = max(sum(score(f"#### {c}", t)["score"] for t in truths) / len(truths) for c in range(10))
    assert best_blind == pytest.approx(reward.BLIND_BEST_SCORE) and reward.BLIND_BEST_SCORE == pytest.approx(0.2)
    # reading the question pays: the right answer alone scores 1 on every row
    assert all(score(f"#### {t}", t)["score"] == 1.0 and score(t, t)["score"] == 1.0 for t in truths)


@pytest.mark.slow
def test_tiny_gsm8k_recipe_trains_on_the_synthetic_task(tmp_path, tiny_lm_path):
    """The text demo's recipe, shortened to 2 steps: synthetic GSM8K-format data through the GSM8K
    conversion, the tiny Qwen2, the synthetic_arithmetic reward and its sub-scores in metrics.jsonl."""
    import json

    from verl_npu.config import load_recipe
    from verl_npu.data.gsm8k import prepare_synthetic
    from verl_npu.trainer.entry import run_training

    data = prepare_synthetic(tmp_path / "data", n_train=8, n_test=4, seed=0)
    rc = load_recipe(
        "tiny_gsm8k",
        [
            f"af_output_dir={tmp_path / 'out'}",
            f"data.train_files={data['train']}",
            f"data.val_files={data['test']}",
            "data.train_batch_size=4",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "trainer.total_training_steps=2",
            "trainer.test_freq=2",
            "trainer.save_freq=-1",
            "trainer.logger=[console]",
        ],
    )
    assert str(rc.backend.actor_rollout_ref.model.path) == "tiny://qwen2"
    assert run_training(rc) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("critic/score/mean") is not None]
    assert len(train) == 2
    for row in train:
        assert 0.0 <= row["critic/score/mean"] <= 1.0
        assert row["critic/score/accuracy/mean"] is not None and row["critic/score/clean/mean"] is not None
        assert row["critic/score/format/mean"] is not None
    assert any("val-core/synthetic_arithmetic/reward/mean@1" in r for r in rows)


def test_the_text_demo_makes_its_own_data_on_first_run(tmp_path, monkeypatch, tiny_cache):
    """`bash launch/run_recipe.sh tiny_gsm8k` goes the VL demo's way: its default data paths
    (data/tiny_gsm8k/, relative to the current folder) get synthetic arithmetic on the first run."""
    import pyarrow.parquet as pq

    from verl_npu import demo
    from verl_npu.config import check_paths, load_recipe

    monkeypatch.setattr(demo, "DEMO_TRAIN_ROWS", 20)
    monkeypatch.chdir(tmp_path)
    rc = load_recipe("tiny_gsm8k", [f"af_output_dir={tmp_path / 'out'}"])
    assert demo.may_make_demo_data(rc)
    made = demo.prepare_assets(rc)
    assert any("synthetic arithmetic" in line for line in made), made
    rows = pq.read_table(tmp_path / "data" / "tiny_gsm8k" / "train.parquet").to_pylist()
    assert len(rows) == 20 and {r["data_source"] for r in rows} == {"synthetic_arithmetic"}
    assert (tmp_path / "data" / "tiny_gsm8k" / "test.parquet").is_file() and check_paths(rc) == []
