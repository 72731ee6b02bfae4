"""Reward tables (geo3k, gsm8k, synthetic_geometry), the registry, custom rewards and batch scoring."""

from __future__ import annotations

import math

import pytest

from verl_npu.data.synthetic_geometry import generate_rows
from verl_npu.errors import UserError
from verl_npu.rewards import (
    RewardScorer,
    default_compute_score,
    load_reward_fn,
    register_reward,
    registered_data_sources,
)
from verl_npu.rewards import synthetic_geometry as synth

GEO = "hiyouga/geometry3k"

# (response, ground truth, accuracy, format)
GEO3K_TABLE = [
    ("<think>AB = 3</think> The answer is \\boxed{3}.", "3", 1, 1),
    ("<think>area</think>\\boxed{\\frac{1}{2}}", "1/2", 1, 1),
    ("<think>x</think>\\boxed{0.5}", "\\frac{1}{2}", 1, 1),
    ("<think>x</think>\\boxed{2\\sqrt{3}}", "2 \\sqrt{3}", 1, 1),
    ("<think>x</think>\\boxed{60^\\circ}", "60", 1, 1),
    ("<think>x</think>\\boxed{12 \\text{ cm}}", "12", 1, 1),
    ("<think>x</think>\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}", 1, 1),
    ("<think>x</think>\\boxed{2/4}", "1/2", 0, 1),  # unreduced fraction: mathruler says no
    ("<think>x</think>\\boxed{13}", "12", 0, 1),
    ("<think>\nmulti\nline\n</think>\nso \\boxed{5} done", "5", 1, 1),
    ("\\boxed{3}", "3", 1, 0),  # no <think>
    ("I think <think>x</think>\\boxed{3}", "3", 1, 0),  # must start with <think>
    ("<think>x</think> the answer is 3", "3", 0, 0),  # no box
    ("<think>x</think>\\boxed{3", "3", 0, 0),  # unclosed box
    ("<think>x \\boxed{3}", "3", 1, 0),  # think never closed
    ("<think>a</think>\\boxed{1} then \\boxed{3}", "3", 1, 1),  # the last box counts
    ("", "3", 0, 0),
]


@pytest.mark.parametrize("response, gt, acc, fmt", GEO3K_TABLE)
def test_geo3k_table(response, gt, acc, fmt):
    result = default_compute_score(GEO, response, gt)
    assert result == {"score": pytest.approx(0.9 * acc + 0.1 * fmt), "accuracy": acc, "format": fmt}


# (response, ground truth, strict, flexible)
GSM8K_TABLE = [
    ("3 + 1231 = 1234\n#### 1234", "1234", 1, 1),
    ("so #### 1,234", "1234", 1, 1),
    ("#### $18", "18", 1, 1),
    ("#### 72.0", "72", 1, 1),
    ("#### 72.", "72", 1, 1),
    ("The answer is 72.", "72", 0, 1),
    ("#### 70\nactually 72", "72", 0, 1),
    ("#### 72\nbecause 3 apples", "72", 1, 0),
    ("#### -5", "-5", 1, 1),
    ("#### 71", "72", 0, 0),
    ("no number here", "72", 0, 0),
    ("", "72", 0, 0),
]


@pytest.mark.parametrize("response, gt, strict, flexible", GSM8K_TABLE)
def test_gsm8k_table(response, gt, strict, flexible):
    assert default_compute_score("openai/gsm8k", response, gt) == {
        "score": strict,
        "strict_accuracy": strict,
        "flexible_accuracy": flexible,
    }


def test_gsm8k_reads_only_the_tail_and_flexible_method():
    from verl_npu.rewards import gsm8k

    long = "#### 72 " + "x" * 400
    assert gsm8k.compute_score("openai/gsm8k", long, "72")["strict_accuracy"] == 0
    assert gsm8k.compute_score("openai/gsm8k", "it is 72", "72", method="flexible")["score"] == 1


# (response, ground truth, accuracy, clean)
SYNTH_TABLE = [
    ("4", "4", 1, 1),  # the answer, then the end of turn (special tokens are not in the text)
    (" 4\n", "4", 1, 1),
    ("\\boxed{4}", "4", 1, 1),
    ("\\boxed{ 4 }", "4", 1, 1),
    ("4Find4", "4", 1, 0),  # right, but the response did not stop after the answer
    ("  4 sides", "4", 1, 0),
    ("<think>corners</think>\\boxed{5}", "5", 1, 0),
    ("3 or maybe \\boxed{6}", "6", 1, 0),  # the box wins over the first number
    ("\\boxed{4.0}", "4", 1, 1),
    ("5", "4", 0, 1),  # clean but wrong: no credit at all
    ("\\boxed{5}", "4", 0, 1),
    ("four", "4", 0, 0),
    ("", "4", 0, 0),
]


@pytest.mark.parametrize("response, gt, acc, clean", SYNTH_TABLE)
def test_synthetic_geometry_table(response, gt, acc, clean):
    result = default_compute_score("synthetic_geometry", response, gt)
    assert result == {"score": pytest.approx(acc * (0.8 + 0.2 * clean)), "accuracy": acc, "clean": clean}


def test_image_blind_policy_scores_at_most_025_on_balanced_answers():
    truths = [r["answer"] for r in generate_rows(40, seed=5, image_size=32)]
    best = max(
        sum(synth.compute_score("synthetic_geometry", guess, t)["score"] for t in truths) / len(truths)
        for guess in ("3", "4", "5", "6", "\\boxed{4}", "4 sides")
    )
    assert best == pytest.approx(synth.BLIND_BEST_SCORE) == pytest.approx(0.25)
    # ending cleanly is worth nothing without the right answer: no image-blind habit pays
    assert synth.compute_score("synthetic_geometry", "7", "4")["score"] == 0


def test_unknown_data_source_is_named():
    with pytest.raises(UserError, match=r"data_source 'my/dataset'.*custom_reward_function.path"):
        default_compute_score("my/dataset", "x", "y")


def test_register_reward_adds_a_data_source():
    @register_reward("test/constant")
    def constant(data_source, solution_str, ground_truth, extra_info=None):
        return 0.25

    assert "test/constant" in registered_data_sources()
    assert default_compute_score("test/constant", "x", "y") == 0.25


def test_load_custom_reward_with_kwargs(tmp_path):
    f = tmp_path / "my_reward.py"
    f.write_text(
        "def length_reward(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):\n"
        "    return {'score': scale * len(solution_str), 'matched': solution_str == ground_truth}\n"
    )
    fn = load_reward_fn({"path": str(f), "name": "length_reward", "reward_kwargs": {"scale": 0.5}})
    assert fn("any", "abcd", "abcd") == {"score": 2.0, "matched": True}
    assert fn.name == f"length_reward in {f}" and fn.timeout_s == 30.0
    assert load_reward_fn({"path": None, "name": "compute_score"}).fn is default_compute_score
    assert load_reward_fn(None).fn is default_compute_score


def test_bad_custom_reward_names_file_and_function(tmp_path):
    missing = tmp_path / "nope.py"
    with pytest.raises(UserError, match=f"custom_reward_function.path: file {missing} does not exist"):
        load_reward_fn({"path": str(missing)})
    f = tmp_path / "r.py"
    f.write_text("def other(a, b, c, d=None):\n    return 0.0\n")
    with pytest.raises(UserError, match=r"r.py has no function 'compute_score' \(functions there: other\)"):
        load_reward_fn({"path": str(f)})
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_xyz\n")
    with pytest.raises(UserError, match=r"importing .*broken.py failed \(ModuleNotFoundError"):
        load_reward_fn({"path": str(broken), "name": "compute_score"})


def test_scorer_returns_scores_and_aligned_sub_scores():
    scorer = RewardScorer(load_reward_fn(None))
    scores, extras = scorer.score(
        ["<think>a</think>\\boxed{3}", "#### 4", "4", "<think>a</think>\\boxed{9}"],
        [GEO, "openai/gsm8k", "synthetic_geometry", GEO],
        ["3", "4", "4", "3"],
        [{}, {}, {}, {}],
    )
    assert scores == pytest.approx([1.0, 1.0, 1.0, 0.1])
    assert extras["accuracy"][0] == 1 and math.isnan(extras["accuracy"][1]) and extras["accuracy"][3] == 0
    assert math.isnan(extras["format"][2]) and extras["clean"][2] == 1 and extras["format"][3] == 1
    assert extras["strict_accuracy"][1] == 1 and math.isnan(extras["strict_accuracy"][0])
    assert all(len(v) == 4 for v in extras.values())


def test_scorer_reports_a_raising_reward_with_row_and_source():
    def flaky(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "boom":
            raise ZeroDivisionError("division by zero")
        return 1.0

    with pytest.raises(
        UserError,
        match=r"reward of data file t.parquet row 7 \(data_source 'src/b', response 1 of "
        r"the batch\).*flaky raised ZeroDivisionError: division by zero",
    ):
        RewardScorer(flaky).score(
            ["ok", "boom"],
            ["src/a", "src/b"],
            ["x", "y"],
            [{}, {}],
            rows=["data file t.parquet row 3", "data file t.parquet row 7"],
        )
    with pytest.raises(UserError, match=r"dataset row 4 \(data_source 'unknown/ds', response 0.*no reward function"):
        RewardScorer().score(["x"], ["unknown/ds"], ["y"], [{}], rows=[4])


@pytest.mark.parametrize(
    "result, message", [({"accuracy": 1.0}, "without 'score'"), ("high", "not a number"), (float("nan"), "non-finite")]
)
def test_scorer_rejects_malformed_results(result, message):
    with pytest.raises(UserError, match=message):
        RewardScorer(lambda *a: result).score(["x"], ["s"], ["y"], [{}])


# ---- the ground truth as the parquet stores it (verl's behaviour) ------------------------------------
@pytest.mark.parametrize(
    "source, response, gt, score",
    [
        ("openai/gsm8k", "so #### 18", 18, 1.0),  # a number column: read as its text
        ("openai/gsm8k", "so #### 18", 18.0, 1.0),
        ("openai/gsm8k", "so #### 18", 17, 0.0),
        ("synthetic_arithmetic", "18", 18, 1.0),
        ("hiyouga/geometry3k", "<think>x</think>\\boxed{4}", 4, 1.0),
        ("synthetic_geometry", "4", 4, 1.0),
        ("searchR1_nq", "<answer>Kyoto</answer>", {"target": ["Osaka", "Kyoto"]}, 1.0),  # verl's dict
        ("searchR1_nq", "<answer>Kyoto</answer>", ["Kyoto"], 1.0),
        ("searchR1_nq", "<answer>Nara</answer>", {"target": ["Kyoto"]}, 0.0),
    ],
)
def test_builtin_rewards_read_a_ground_truth_that_is_not_text(source, response, gt, score):
    result = default_compute_score(source, response, gt)
    assert (result["score"] if isinstance(result, dict) else result) == score


RECORDING_REWARD = """
import json

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    with open({log!r}, "a") as f:
        f.write(json.dumps({{"type": type(ground_truth).__name__, "value": ground_truth,
                            "split": (extra_info or {{}}).get("split")}}) + "\\n")
    return float(len(solution_str) % 3) / 2.0
"""


@pytest.mark.slow
def test_a_dict_and_a_list_ground_truth_reach_a_custom_reward_unchanged(tmp_path, tiny_cache):
    """verl passes `reward_model.ground_truth` as stored: a dict (parquet struct) and a list (parquet list)
    reach compute_score as a dict and a list, in training and in validation, and the dumps write them as
    JSON objects and arrays."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    from run_helpers import text_run_overrides

    from verl_npu.config import load_recipe
    from verl_npu.trainer.entry import run_training

    truths = {
        "dict": {"target": ["Kyoto", "Osaka"], "year": 794},
        "list": [3, 4],
    }  # as stored: pyarrow makes [3, 4.5] doubles
    for name, gt in truths.items():
        rows = [
            {
                "data_source": "my/source",
                "prompt": [{"role": "user", "content": f"Question {i}?"}],
                "reward_model": {"style": "rule", "ground_truth": gt},
                "extra_info": {"split": "train" if i < 4 else "test", "index": i},
            }
            for i in range(8)
        ]
        pq.write_table(pa.Table.from_pylist(rows[:4]), tmp_path / f"{name}_train.parquet")
        pq.write_table(pa.Table.from_pylist(rows[4:]), tmp_path / f"{name}_test.parquet")
    log = tmp_path / "seen.jsonl"
    reward = tmp_path / "recording_reward.py"
    reward.write_text(RECORDING_REWARD.format(log=str(log)))
    out = tmp_path / "out"
    rc = load_recipe(
        "tiny_gsm8k",
        text_run_overrides(
            out,
            tmp_path,
            **{
                "custom_reward_function.path": reward,
                "data.train_files": f"[{tmp_path / 'dict_train.parquet'},{tmp_path / 'list_train.parquet'}]",
                "data.val_files": f"[{tmp_path / 'dict_test.parquet'},{tmp_path / 'list_test.parquet'}]",
                "trainer.val_before_train": "true",
                "trainer.rollout_data_dir": tmp_path / "rollouts",
                "trainer.validation_data_dir": tmp_path / "val_dumps",
                "trainer.log_val_generations": 2,
            },
        ),
    )
    assert run_training(rc) == 0
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    for split in ("train", "test"):
        kinds = {(s["type"], json.dumps(s["value"])) for s in seen if s["split"] == split}
        assert kinds == {("dict", json.dumps(truths["dict"])), ("list", json.dumps(truths["list"]))}, (split, kinds)
    for folder in ("rollouts", "val_dumps"):
        dumped = [
            json.loads(line)["ground_truth"]
            for f in sorted((tmp_path / folder).glob("*.jsonl"))
            for line in f.read_text().splitlines()
        ]
        assert dumped and all(gt in truths.values() for gt in dumped), (folder, dumped[:3])
        assert {type(gt) for gt in dumped} == {dict, list}, folder
