"""Tracker, curves PNG, progress bar and run log, with real files (JSONL, TensorBoard events, PNG)."""

from __future__ import annotations

import io
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from verl_npu.trainer.tracking import (
    ProgressBar,
    Tracker,
    dump_jsonl,
    format_console_line,
    plot_training_curves,
    setup_run_logging,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _step_metrics(step: int) -> dict:
    return {
        "training/global_step": step,
        "training/epoch": 0,
        "critic/score/mean": 0.1 * step,
        "response_length/mean": 20.0 + step,
        "actor/pg_loss": -0.01 * step,
        "actor/kl_loss": 0.001 * step,
        "timing_s/step": 1.5,
    }


def _scalars(tb_dir: Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_metrics_jsonl_rows(tmp_path):
    with Tracker(tmp_path, ["file"], "proj", "exp") as tracker:
        tracker.log({"a": 1, "b": np.float32(0.5), "c": torch.tensor(2.0)}, step=1)
        tracker.log({"a": float("nan"), "b": float("inf"), "c": -float("inf")}, step=2)
        with pytest.raises(TypeError, match="'bad'"):
            tracker.log({"bad": "text"}, step=3)
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text  # strict JSON
    rows = _rows(tmp_path / "metrics.jsonl")
    assert rows == [{"step": 1, "a": 1.0, "b": 0.5, "c": 2.0}, {"step": 2, "a": None, "b": None, "c": None}]
    assert not (tmp_path / "tensorboard").exists()


def test_unknown_logger_rejected(tmp_path):
    with pytest.raises(ValueError, match="clearml"):
        Tracker(tmp_path, ["console", "clearml"], "p", "e")


def test_resume_drops_rows_after_resume_step(tmp_path):
    with Tracker(tmp_path, ["file"], "p", "e") as tracker:
        for step in range(1, 6):
            tracker.log(_step_metrics(step), step)
    # The crashed run also left a line cut in half by the kill.
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 6, "critic/sc')
    with Tracker(tmp_path, ["file"], "p", "e", resume_step=3) as tracker:
        for step in (4, 5):
            tracker.log({**_step_metrics(step), "critic/score/mean": 9.0}, step)
    rows = _rows(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # no duplicate step
    assert [r["critic/score/mean"] for r in rows] == pytest.approx([0.1, 0.2, 0.3, 9.0, 9.0])


def test_fresh_start_moves_old_metrics_aside(tmp_path):
    with Tracker(tmp_path, ["file"], "p", "e") as tracker:
        tracker.log({"x": 1.0}, 1)
    with Tracker(tmp_path, ["file"], "p", "e", resume_step=0) as tracker:
        tracker.log({"x": 2.0}, 1)
    assert _rows(tmp_path / "metrics.jsonl") == [{"step": 1, "x": 2.0}]
    previous = list(tmp_path.glob("metrics.previous-*.jsonl"))
    assert len(previous) == 1 and _rows(previous[0]) == [{"step": 1, "x": 1.0}]


def test_tensorboard_scalars_text_and_resume_purge(tmp_path):
    with Tracker(tmp_path, ["tensorboard"], "p", "e") as tracker:
        for step in range(1, 5):
            tracker.log(_step_metrics(step), step)
        tracker.log_text("val/generations", "Q: 1+1?\nA: 2", step=4)
    tb_dir = tmp_path / "tensorboard"
    assert list(tb_dir.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert set(_step_metrics(1)) <= tags
    assert [s for s, _ in _scalars(tb_dir, "critic/score/mean")] == [1, 2, 3, 4]
    assert "val/generations/text_summary" in acc.Tags()["tensors"]  # add_text is a text tensor

    # Resume at step 2: the crashed run's steps 3 and 4 must be replaced, not shown twice.
    with Tracker(tmp_path, ["tensorboard"], "p", "e", resume_step=2) as tracker:
        for step in (3, 4):
            tracker.log({"critic/score/mean": 5.0}, step)
    values = _scalars(tb_dir, "critic/score/mean")
    assert [s for s, _ in values] == [1, 2, 3, 4]
    assert [v for _, v in values] == pytest.approx([0.1, 0.2, 5.0, 5.0])


@pytest.fixture
def restore_run_logger():
    """setup_run_logging changes the process-wide "verl_npu" logger; put it back for other tests."""
    run_logger = logging.getLogger("verl_npu")
    saved = (list(run_logger.handlers), run_logger.propagate, run_logger.level)
    yield
    for handler in list(run_logger.handlers):
        if handler not in saved[0]:
            run_logger.removeHandler(handler)
            handler.close()
    run_logger.propagate, run_logger.level = saved[1], saved[2]


def test_console_line_and_run_log(tmp_path, restore_run_logger):
    run_logger = setup_run_logging(tmp_path)
    setup_run_logging(tmp_path)  # a second call must not duplicate handlers
    assert sum(getattr(h, "_verl_npu_run_handler", False) for h in run_logger.handlers) == 2
    with Tracker(tmp_path, ["console"], "p", "e") as tracker:
        tracker.log({**_step_metrics(7), "val-core/synthetic_geo/reward/mean@1": 0.75}, 7)
        tracker.log_text("val/generations", "sample output", 7)
    logging.getLogger("verl_npu.trainer").info("child logger line")
    for handler in run_logger.handlers:
        handler.flush()
    log_text = (tmp_path / "logs" / "run.log").read_text()
    assert "step 7 | score 0.7 | resp_len 27" in log_text
    assert "val synthetic_geo 0.75" in log_text
    assert "sample output" in log_text
    assert "child logger line" in log_text
    assert log_text.count("child logger line") == 1


def test_format_console_line_skips_absent_keys():
    line = format_console_line({"critic/score/mean": 0.5, "actor/grad_norm": 1.25}, 3)
    assert line == "step 3 | score 0.5 | grad_norm 1.25"


def test_training_curves_png(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    with Tracker(tmp_path, ["file"], "p", "e") as tracker:
        for step in range(1, 8):
            row = _step_metrics(step)
            if step % 3 == 0:
                row["val-core/geo/reward/mean@1"] = 0.2 * step
            if step == 5:
                row["actor/pg_loss"] = math.nan
            tracker.log(row, step)
    out = tmp_path / "training_curves.png"
    plot_training_curves(metrics, out)
    data = out.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 5000
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # temp file gone
    from PIL import Image

    with Image.open(out) as img:
        img.verify()
    # Redraw on a missing / empty file: still a valid PNG (panels say "no data yet").
    plot_training_curves(tmp_path / "absent.jsonl", out)
    assert out.read_bytes()[:8] == PNG_SIGNATURE


def test_dump_jsonl_appends(tmp_path):
    path = tmp_path / "rollout_data" / "1.jsonl"
    dump_jsonl(path, [{"input": "q", "score": np.float64(0.5), "ids": torch.tensor([1, 2])}])
    dump_jsonl(path, [{"input": "q2", "score": float("nan"), "gts": ["a", Path("b")]}])
    assert _rows(path) == [
        {"input": "q", "score": 0.5, "ids": [1, 2]},
        {"input": "q2", "score": None, "gts": ["a", "b"]},
    ]


def test_progress_bar_resume_and_reward():
    out = io.StringIO()
    bar = ProgressBar(total=10, initial=4, disable=False, file=out)
    assert "4/10" in out.getvalue()  # a resumed run starts at its step, not 0
    bar.update(5, 0.25)
    bar.update(7, None)  # no reward this step: keeps showing the last one
    bar.close()
    text = out.getvalue()
    assert "7/10" in text and "reward=0.250" in text
    assert bar.step == 7 and bar.reward == 0.25
    quiet = ProgressBar(total=3)  # not a TTY under pytest: disabled, still tracks the step
    quiet.update(2, 1.0)
    assert quiet.step == 2
    quiet.close()


def test_kl_panel_plots_what_the_run_has():
    from verl_npu.trainer.tracking import kl_panel

    def rows(**series):
        return [
            {"training/global_step": i + 1, **{k.replace("__", "/"): v[i] for k, v in series.items()}} for i in range(2)
        ]

    assert kl_panel(rows(actor__kl_loss=[0.1, 0.2], actor__ppo_kl=[0.0, 0.3])) == ("KL", [("actor/kl_loss",) * 2])
    assert kl_panel(rows(actor__kl_loss=[0.0, 0.0], actor__ppo_kl=[0.0, 0.3]))[1] == [("actor/ppo_kl",) * 2]
    title, series = kl_panel(rows(actor__ppo_kl=[0.0, 0.0], actor__entropy=[2.0, 1.5]))  # the demos' case
    assert title == "entropy (no KL in this run)" and series == [("actor/entropy", "actor/entropy")]


def test_curve_redraws_keep_drawing_under_their_share_of_the_run(monkeypatch):
    """training_curves.png is redrawn every CURVES_EVERY steps only while drawing stays under CURVES_SHARE of the
    time (a tiny model's step is shorter than a redraw), and always at the last step."""
    from verl_npu.trainer import tracking

    drawn: list[int] = []
    monkeypatch.setattr(tracking, "plot_training_curves", lambda step: (time.sleep(0.02), drawn.append(step)))
    curves = tracking.CurveRedraws()
    assert not curves.due(5, False) and curves.due(10, False)
    curves.draw(10)
    assert not curves.due(20, False)  # 0.02 s of drawing asks for 0.02 / CURVES_SHARE = 0.4 s before the next
    assert curves.due(23, True)  # the last step always
    time.sleep(0.02 / tracking.CURVES_SHARE + 0.05)
    assert curves.due(30, False) and not curves.due(31, False)
    curves.draw(30)
    assert drawn == [10, 30]
