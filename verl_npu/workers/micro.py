"""Splitting a (mini-)batch into micro-batches that fit on one device.

Two policies, as in verl: a fixed number of rows per micro-batch
(`*_micro_batch_size_per_gpu`), or a token budget per micro-batch (`use_dynamic_bsz` with
`*_max_token_len_per_gpu`), which packs short sequences together and keeps long ones alone.
"""

from __future__ import annotations

import torch


def micro_batch_indices(
    attention_mask: torch.Tensor, *, micro_batch_size: int | None = None, max_token_len: int | None = None
) -> list[list[int]]:
    """Row indices of each micro-batch, covering every row exactly once, in order.

    With `max_token_len`, rows are taken in order and a micro-batch is closed when adding the
    next row would exceed the budget (a row longer than the budget is rejected earlier, in config
    validation: max_token_len >= prompt + response length).
    """
    n = attention_mask.shape[0]
    if max_token_len is None:
        size = micro_batch_size or n
        return [list(range(i, min(i + size, n))) for i in range(0, n, size)]
    lengths = attention_mask.sum(dim=1).tolist()
    groups: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, length in enumerate(lengths):
        if current and used + length > max_token_len:
            groups.append(current)
            current, used = [], 0
        current.append(i)
        used += int(length)
    if current:
        groups.append(current)
    return groups
