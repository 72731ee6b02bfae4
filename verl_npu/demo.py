"""Assets of demo recipes, made on first use: tiny local models and synthetic data.

Rule: a recipe whose model is a `tiny://` model is a demo recipe; when its train/val parquet
files are missing, synthetic geometry data is written there (the same thing
`python data_prep/geometry3k.py --synthetic N --local-save-dir DIR` does). Real recipes never get
data made up for them: a missing file stays an error.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("verl_npu")

DEMO_TRAIN_ROWS = 512
DEMO_TEST_ROWS = 64


def prepare_assets(rc) -> list[str]:
    """Make what a demo recipe needs; returns a line per thing made."""
    from verl_npu.data import as_file_list
    from verl_npu.models.tiny import is_tiny_uri

    data = rc.backend.data
    model_path = str(rc.backend.actor_rollout_ref.model.path)
    if not is_tiny_uri(model_path):
        return []
    made = []
    train, val = as_file_list(data.train_files), as_file_list(data.val_files)
    if any(not Path(f).exists() for f in train + val):
        if len(train) != 1 or len(val) != 1 or Path(train[0]).parent != Path(val[0]).parent:
            return made
        from verl_npu.data.geometry3k import prepare_synthetic

        save_dir = Path(train[0]).parent
        result = prepare_synthetic(save_dir, DEMO_TRAIN_ROWS, DEMO_TEST_ROWS, seed=int(data.seed), image_size=56)
        # prepare_synthetic writes train.parquet / test.parquet; the recipe names them
        for want, made_path in ((train[0], result["paths"]["train"]), (val[0], result["paths"]["test"])):
            if Path(want).resolve() != Path(made_path).resolve():
                Path(made_path).replace(want)
        made.append(f"synthetic geometry data in {save_dir} ({DEMO_TRAIN_ROWS} train / {DEMO_TEST_ROWS} test rows)")
    from verl_npu.models.tiny import materialize

    made.append(f"tiny model {model_path} at {materialize(model_path)}")
    for line in made:
        log.info("demo assets: %s", line)
    return made
