"""The end-of-run summary (verl_npu.trainer.summary), read from a run folder's real files."""

from __future__ import annotations

import json

from verl_npu.trainer.summary import run_summary


def write_rows(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_summary_compares_first_and_last_steps_and_names_the_outputs(tmp_path):
    rows = [
        {"step": s, "critic/score/mean": 0.02 if s <= 10 else 0.9, "response_length/clip_ratio": 0.5}
        for s in range(1, 31)
    ]
    rows[-1].update(
        {
            "response_length/clip_ratio": 0.0,
            "val-core/synthetic_geometry/reward/mean@1": 0.95,
            "val-aux/synthetic_geometry/accuracy/mean@1": 1.0,
        }
    )
    rows[9]["val-core/synthetic_geometry/reward/mean@1"] = 0.1  # an earlier validation: not the last one
    out = tmp_path / "run"
    write_rows(out, rows)
    (out / "training_curves.png").write_bytes(b"png")
    text = "\n".join(run_summary(out, tensorboard_dir=out / "tensorboard"))
    assert "first 10 steps 0.020 -> last 10 steps 0.900 (45.0x)" in text
    assert "validation (synthetic_geometry, step 30): reward 0.950, accuracy 1.000" in text
    assert "ignores the picture scores at most 0.250" in text
    assert "no end of turn), last step: 0%" in text
    assert f"training curves: {out / 'training_curves.png'}" in text
    assert f"tensorboard --logdir {out / 'tensorboard'}" in text


def test_summary_without_tensorboard_or_builtin_reward_claims_neither(tmp_path):
    write_rows(
        tmp_path,
        [
            {
                "step": 1,
                "critic/score/mean": 0.0,
                "val-core/my_task/reward/mean@1": 0.5,
                "val-core/synthetic_geometry/reward/mean@1": 0.5,
            }
        ],
    )
    text = "\n".join(run_summary(tmp_path, tensorboard_dir=None, builtin_rewards=False))
    assert "first 1 steps 0.000 -> last 1 steps 0.000" in text and "x)" not in text  # no ratio from a zero
    assert "validation (my_task, step 1): reward 0.500" in text
    assert "ignores" not in text and "TensorBoard" not in text and "training curves" not in text


def test_summary_names_a_data_source_with_a_slash_whole(tmp_path):
    """verl's data sources are hub names (openai/gsm8k, hiyouga/geometry3k): the summary must not cut them
    at the first slash and lose the reward."""
    write_rows(
        tmp_path,
        [
            {
                "step": 2,
                "critic/score/mean": 0.1,
                "val-core/openai/gsm8k/reward/mean@1": 0.25,
                "val-aux/openai/gsm8k/accuracy/mean@1": 0.5,
            }
        ],
    )
    text = "\n".join(run_summary(tmp_path, tensorboard_dir=None))
    assert "validation (openai/gsm8k, step 2): reward 0.250, accuracy 0.500" in text
    assert "validation (openai," not in text
