"""Data: the RL dataset, batching with a resumable position, and preprocessing to RL parquet.

- ``RLDataset(files, tokenizer, processor, data_cfg)``: RL parquet rows -> model inputs.
- ``collate_rows(items)`` / ``StatefulBatchLoader(ds, batch_size, shuffle, seed, drop_last)``.
- ``verl_npu.data.geometry3k`` / ``verl_npu.data.gsm8k``: source datasets -> RL parquet
  (``data_prep/*.py`` are thin CLIs over them); ``verl_npu.data.synthetic_geometry``: the
  offline polygon task. The file formats are described in docs/data_formats.md.
"""

from verl_npu.data.dataset import RLDataset, as_file_list, data_settings
from verl_npu.data.loader import StatefulBatchLoader, collate_rows

__all__ = ["RLDataset", "StatefulBatchLoader", "as_file_list", "collate_rows", "data_settings"]
