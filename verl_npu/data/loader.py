"""Batching with a resumable position: ``collate_rows`` and ``StatefulBatchLoader`` (it yields `Batch`es).

The loader's order for epoch ``e`` is a pure function of ``(seed, e)`` (a permutation from
``numpy.random.default_rng([seed, e])`` when shuffling, else ``0..n-1``), so a run resumed from
``state_dict()`` sees exactly the batches it would have seen without the interruption. The
position is kept in samples, not batches, so a resume with another batch size continues at the
same prompt.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from verl_npu.batch import Batch

# Per-row tensors of one fixed shape, stacked into [batch, ...]; everything else stays a list.
STACKED_KEYS = ("input_ids", "attention_mask")

logger = logging.getLogger("verl_npu")


def collate_rows(items: Sequence[dict]) -> Batch:
    """One `Batch` from dataset items: ``input_ids`` and ``attention_mask`` stacked on dim 0 (its
    tensors), every other key a Python list in row order (``None`` for rows that lack the key, e.g.
    ``multi_modal_data`` of a text row in a mixed batch)."""
    if not items:
        raise ValueError("collate_rows needs at least one row")
    keys: list[str] = []
    for item in items:
        keys += [k for k in item if k not in keys]
    tensors: dict[str, torch.Tensor] = {}
    lists: dict[str, list] = {}
    for k in keys:
        values = [item.get(k) for item in items]
        if k in STACKED_KEYS:
            tensors[k] = torch.stack(values, dim=0)
        else:
            lists[k] = values
    return Batch(tensors, lists)


class StatefulBatchLoader:
    """Batches of ``dataset`` in a seeded per-epoch order, with a position that can be saved and restored.

    The position is ``(epoch, sample_index)``: the next batch is rows ``sample_index ..
    sample_index + batch_size - 1`` of epoch ``epoch``'s order. Iterating yields the collated
    batches of the current epoch from there, then moves to the next epoch and stops; so
    ``for batch in loader`` is one (rest of an) epoch. The position is advanced *before* each
    batch is handed out, so ``state_dict()`` taken while processing a batch points at the next
    one; after the last batch of epoch ``e`` it is epoch ``e + 1``, sample 0 (resuming at an epoch
    boundary does not skip an epoch).

    With ``drop_last`` the last partial batch of an epoch is skipped; ``len(loader)`` is the
    number of batches per epoch.

    Resuming with another batch size (``data.train_batch_size`` changed between runs) continues
    at the same sample of the same epoch order: the order depends on the seed, the epoch and the
    number of rows, never on the batch size, so no prompt is skipped or repeated. A changed seed,
    ``shuffle`` or number of rows changes the order itself: the position is kept (same epoch,
    same sample count) with a warning, since the prompts before it are no longer the ones seen.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        num_workers: int = 0,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.num_workers = int(num_workers)  # data.dataloader_num_workers: threads preparing a batch's rows
        self.epoch = 0
        self.sample_index = 0

    @property
    def batch_index(self) -> int:
        """The next batch's number within the epoch (``sample_index // batch_size``)."""
        return self.sample_index // self.batch_size

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """Row indices of epoch ``epoch`` in visiting order (depends only on seed, epoch and the
        number of rows; never on the batch size)."""
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, int(epoch)]).permutation(n)

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch``; a no-op when already in that epoch, so a restored mid-epoch
        position survives a trainer that calls ``set_epoch`` at the top of every epoch."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.sample_index = 0

    def _has_batch_at(self, start: int, n: int) -> bool:
        return start + self.batch_size <= n if self.drop_last else start < n

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.epoch
        order = self.order(epoch)
        n = len(order)
        while self.epoch == epoch and self._has_batch_at(self.sample_index, n):
            start = self.sample_index
            stop = min(start + self.batch_size, n)
            rows = self._rows([int(i) for i in order[start:stop]])
            if self._has_batch_at(stop, n):
                self.sample_index = stop
            else:
                self.epoch, self.sample_index = epoch + 1, 0
            yield collate_rows(rows)
        if self.epoch == epoch:  # entered at (or past) the end of the epoch: move on, yield nothing
            self.epoch, self.sample_index = epoch + 1, 0

    def _rows(self, indices: list[int]) -> list:
        """`dataset[i]` for each index, in order: one by one, or on `num_workers` threads (tokenizing
        and image resizing release the GIL in large part); the rows are the same either way."""
        if self.num_workers <= 0 or len(indices) < 2:
            return [self.dataset[i] for i in indices]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(self.num_workers, len(indices))) as pool:
            return list(pool.map(self.dataset.__getitem__, indices))

    def state_dict(self) -> dict:
        """The position of the next batch, in samples, with what the order depends on (all ints
        and bools, JSON-safe): ``{"epoch", "sample_index", "batch_size", "batch_index",
        "num_rows", "seed", "shuffle"}``. ``batch_index`` is informational."""
        return {
            "epoch": self.epoch,
            "sample_index": self.sample_index,
            "batch_size": self.batch_size,
            "batch_index": self.batch_index,
            "num_rows": len(self.dataset),
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a position saved by ``state_dict``: the same epoch and the same sample, whatever
        the batch size is now. An older state ``{"epoch", "batch_index"}`` (position in batches,
        before the position was kept in samples) is read as batches of the current batch size.

        Raises:
            ValueError: the state lacks a key or holds a negative position.
        """
        try:
            epoch = int(state["epoch"])
            if "sample_index" in state:
                sample_index = int(state["sample_index"])
            else:
                sample_index = int(state["batch_index"]) * self.batch_size
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"loader state must be {{'epoch': int, 'sample_index': int, ...}} (or an older "
                f"{{'epoch': int, 'batch_index': int}}), got {state!r}"
            ) from e
        if epoch < 0 or sample_index < 0:
            raise ValueError(f"loader state has a negative position: {state!r}")
        if "sample_index" not in state:
            logger.info(
                "data position saved in batches (an older checkpoint): batch %d of epoch %d read as sample "
                "%d with the current batch size %d",
                int(state["batch_index"]),
                epoch,
                sample_index,
                self.batch_size,
            )
        saved_bs = state.get("batch_size")
        if saved_bs is not None and int(saved_bs) != self.batch_size:
            logger.warning(
                "data.train_batch_size is %d, the checkpoint was saved with %d: continuing at the same "
                "sample (%d of epoch %d), so no prompt is skipped or repeated; the steps per epoch change "
                "to %d",
                self.batch_size,
                int(saved_bs),
                sample_index,
                epoch,
                len(self),
            )
        changed = [
            f"{key} {state[key]!r} -> {now!r}"
            for key, now in (("num_rows", len(self.dataset)), ("seed", self.seed), ("shuffle", self.shuffle))
            if key in state and state[key] != now
        ]
        if changed:
            logger.warning(
                "the data order changed since the checkpoint (%s): resuming at sample %d of epoch %d of "
                "the new order; this epoch's remaining prompts differ from the ones an uninterrupted run "
                "would see",
                ", ".join(changed),
                sample_index,
                epoch,
            )
        if not self._has_batch_at(sample_index, len(self.dataset)):
            epoch, sample_index = epoch + 1, 0  # nothing left of that epoch (fewer rows now)
        self.epoch, self.sample_index = epoch, sample_index
