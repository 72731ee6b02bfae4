"""Batching with a resumable position: ``collate_rows`` and ``StatefulBatchLoader``.

The loader's order for epoch ``e`` is a pure function of ``(seed, e)`` (a permutation from
``numpy.random.default_rng([seed, e])`` when shuffling, else ``0..n-1``), so a run resumed from
``state_dict()`` sees exactly the batches it would have seen without the interruption.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

import numpy as np
import torch

# Per-row tensors of one fixed shape, stacked into [batch, ...]; everything else stays a list.
STACKED_KEYS = ("input_ids", "attention_mask")


def collate_rows(items: Sequence[dict]) -> dict:
    """One batch from dataset items: ``input_ids`` and ``attention_mask`` stacked on dim 0, every other
    key a Python list in row order (``None`` for rows that lack the key, e.g. ``multi_modal_data``
    of a text row in a mixed batch)."""
    if not items:
        raise ValueError("collate_rows needs at least one row")
    keys: list[str] = []
    for item in items:
        keys += [k for k in item if k not in keys]
    batch: dict[str, Any] = {}
    for k in keys:
        values = [item.get(k) for item in items]
        if k in STACKED_KEYS:
            batch[k] = torch.stack(values, dim=0)
        else:
            batch[k] = values
    return batch


class StatefulBatchLoader:
    """Batches of ``dataset`` in a seeded per-epoch order, with a position that can be saved and restored.

    Iterating yields the collated batches of epoch ``self.epoch`` starting at ``self.batch_index``,
    then moves to the next epoch and stops; so ``for batch in loader`` is one (rest of an) epoch.
    The position is advanced *before* each batch is handed out, so ``state_dict()`` taken while
    processing a batch points at the next one; after the last batch of epoch ``e`` it is
    ``{"epoch": e + 1, "batch_index": 0}`` (resuming at an epoch boundary does not skip an epoch).

    With ``drop_last`` the last partial batch of an epoch is skipped; ``len(loader)`` is the
    number of batches per epoch.
    """

    def __init__(self, dataset: Any, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self.batch_index = 0

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """Row indices of epoch ``epoch`` in visiting order (depends only on seed and epoch)."""
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, int(epoch)]).permutation(n)

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch``; a no-op when already in that epoch, so a restored mid-epoch
        position survives a trainer that calls ``set_epoch`` at the top of every epoch."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.batch_index = 0

    def batch_indices(self, epoch: int, batch_index: int) -> list[int]:
        """Row indices of batch ``batch_index`` of ``epoch``."""
        start = batch_index * self.batch_size
        return [int(i) for i in self.order(epoch)[start:start + self.batch_size]]

    def __iter__(self) -> Iterator[dict]:
        epoch = self.epoch
        num_batches = len(self)
        order = self.order(epoch)
        while self.epoch == epoch and self.batch_index < num_batches:
            start = self.batch_index * self.batch_size
            rows = [self.dataset[int(i)] for i in order[start:start + self.batch_size]]
            if self.batch_index + 1 >= num_batches:
                self.epoch, self.batch_index = epoch + 1, 0
            else:
                self.batch_index += 1
            yield collate_rows(rows)
        if self.epoch == epoch:  # entered at (or past) the end of the epoch: move on, yield nothing
            self.epoch, self.batch_index = epoch + 1, 0

    def state_dict(self) -> dict:
        """The position of the next batch: ``{"epoch": int, "batch_index": int}``."""
        return {"epoch": self.epoch, "batch_index": self.batch_index}

    def load_state_dict(self, state: dict) -> None:
        """Restore a position saved by ``state_dict``.

        Raises:
            ValueError: the state lacks a key or holds a negative position.
        """
        try:
            epoch, batch_index = int(state["epoch"]), int(state["batch_index"])
        except (KeyError, TypeError) as e:
            raise ValueError(f"loader state must be {{'epoch': int, 'batch_index': int}}, got {state!r}") from e
        if epoch < 0 or batch_index < 0:
            raise ValueError(f"loader state has a negative position: {state!r}")
        self.epoch, self.batch_index = epoch, batch_index
