"""The CPU demo's learning signal is real: a short run of the demo recipe reads the pictures.

Not timed. A shortened `tiny_geo3k` run (the demo's first 80 of 300 steps) must reach a greedy
validation accuracy on held-out pictures well above what any policy that ignores the image can
expect (1 in 4: the answers are balanced), and end with the run summary. The full demo's numbers
over seeds and thread counts are in bench/results/demo_learning.md.
"""

from __future__ import annotations

import json

import pytest

from verl_npu.config import load_recipe
from verl_npu.data.geometry3k import prepare_synthetic
from verl_npu.rewards.synthetic_geometry import BLIND_BEST_SCORE
from verl_npu.trainer.entry import run_training

#: 80 steps was at the edge: on the AMD EPYC machines CI runs on now, this seed's held-out accuracy is 0.25 at
#: step 80 and 0.75 from step 100 on (probed every 20 steps to 160); 120 leaves a margin on either side
STEPS = 120
#: blind accuracy is at most 0.25; the greedy policy must beat it by this much on held-out pictures
MARGIN = 0.15


@pytest.mark.slow
def test_short_demo_run_beats_the_image_blind_ceiling(tmp_path, tiny_vl_path):
    data = tmp_path / "data"
    prepare_synthetic(data, n_train=512, n_test=32, seed=0, image_size=56)
    out = tmp_path / "out"
    rc = load_recipe(
        "tiny_geo3k",
        [
            f"af_output_dir={out}",
            f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / 'test.parquet'}",
            f"trainer.total_training_steps={STEPS}",
            f"trainer.test_freq={STEPS}",
            "trainer.save_freq=0",
            "trainer.logger=[console]",
            # the demo's learning rate over these steps (its cosine decay spans 300 steps, not 80)
            "actor_rollout_ref.actor.optim.warmup_style=constant",
        ],
    )
    assert run_training(rc) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    accuracy = rows[-1]["val-aux/synthetic_geometry/accuracy/mean@1"]
    assert accuracy > 0.25 + MARGIN, (
        f"held-out accuracy {accuracy} after {STEPS} steps: the policy does not read the picture"
    )
    first = sum(r["critic/score/mean"] for r in rows[:10]) / 10
    last = sum(r["critic/score/mean"] for r in rows[-10:]) / 10
    assert last > BLIND_BEST_SCORE and last > 3 * first
    log = (out / "logs" / "run.log").read_text()
    assert "summary of the run in" in log and "ignores the picture scores at most 0.250" in log
