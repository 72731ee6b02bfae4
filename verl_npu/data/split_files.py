"""One parquet file a split (`<save_dir>/<split>.parquet`), all with one Arrow schema: the writer of the data
prep modules that build their rows themselves (`grid_env`, `search_r1`; the converters of source datasets
write through `prep.convert_splits`)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def write_split_files(
    save_dir,
    splits: Iterable[tuple[str, list[dict]]],
    schema: pa.Schema,
    *,
    overwrite: bool = True,
    progress: bool = False,
) -> dict:
    """Write each `(split, rows)` of `splits` to `<save_dir>/<split>.parquet` (the folder is created), one split
    at a time as `splits` yields them; returns {"paths": {split: path}, "rows": {split: n}} (the demo-data
    writer's contract, verl_npu/demo.py). With `overwrite=False` a file that exists already stops the run
    (FileExistsError naming it); `progress` prints a line a split."""
    save_dir = Path(os.path.expanduser(str(save_dir)))
    save_dir.mkdir(parents=True, exist_ok=True)
    paths, counts = {}, {}
    for split, rows in splits:
        path = save_dir / f"{split}.parquet"
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} exists; pass --overwrite to replace it or choose another --local-save-dir")
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        paths[split], counts[split] = str(path), len(rows)
        if progress:
            print(f"{split}: {len(rows)} rows -> {path}")
    return {"paths": paths, "rows": counts}
