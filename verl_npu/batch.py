"""`Batch`: the unit of data that flows between the controller and the workers.

A batch is a set of rows. Each row has tensor fields (stored stacked, dim 0 = row) and
per-row Python objects (images, ground truths, dicts of processor outputs, ...). Every
operation keeps the two aligned.

A batch a worker method is sent (`only`) remembers which of the controller's columns it was not sent
(`withheld`): reading one of them raises `UndeclaredColumn` instead of finding nothing, so a method that
forgot to declare a column in `@reads` fails at its first read, on one process as across Ray (the names
travel with the pickled batch). A column the controller does not have either still reads as absent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


class UndeclaredColumn(RuntimeError):
    """A worker method read a column of the controller's batch that it does not declare in `@reads`, so it
    was not sent (a bug in verl-npu, not a user error)."""


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    lists: dict[str, list] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    # the columns of the controller's batch this one was not sent (`only`) and the method it was sent to:
    # reading one raises; reshaping keeps them, a plain `Batch(...)` starts without
    withheld: frozenset = field(default=frozenset(), repr=False, compare=False)
    reader: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        sizes = {k: v.shape[0] for k, v in self.tensors.items()}
        sizes.update({k: len(v) for k, v in self.lists.items()})
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Batch fields disagree on the number of rows: {sizes}")

    # ---- access -------------------------------------------------------------------------
    def __len__(self) -> int:
        for v in self.tensors.values():
            return int(v.shape[0])
        for v in self.lists.values():
            return len(v)
        return 0

    def __getitem__(self, key: str):
        if key in self.tensors:
            return self.tensors[key]
        if key in self.lists:
            return self.lists[key]
        self._refuse_withheld(key)
        raise KeyError(key)

    def __contains__(self, key: str) -> bool:
        if key in self.tensors or key in self.lists:
            return True
        self._refuse_withheld(key)
        return False

    def _refuse_withheld(self, key: str) -> None:
        if key in self.withheld:
            raise UndeclaredColumn(
                f"{self.reader or 'a worker method'} read column {key!r}, which the controller's batch has but "
                f"was not sent to it: add it to @reads(...) of {self.reader or 'the method'} "
                f"(verl_npu.batch.reads); it was sent {sorted(set(self.tensors) | set(self.lists))}"
            )

    def only(self, columns: Iterable[str], reader: str = "") -> Batch:
        """The columns among `columns` that this batch has (in its own order, the same objects), without `meta`:
        what a worker call is sent (see `reads`). Its other columns are `withheld`: a read of one names
        `reader` (the method) and raises `UndeclaredColumn`."""
        wanted = set(columns)
        have = set(self.tensors) | set(self.lists)
        return Batch(
            {k: v for k, v in self.tensors.items() if k in wanted},
            {k: v for k, v in self.lists.items() if k in wanted},
            withheld=frozenset((have | self.withheld) - wanted),
            reader=reader or self.reader,
        )

    def released(self) -> Batch:
        """The same columns and meta, nothing withheld: what a worker returns becomes the controller's."""
        return Batch(dict(self.tensors), dict(self.lists), dict(self.meta))

    def _like(self, tensors: dict, lists: dict, meta: dict) -> Batch:
        """A batch of these fields that withholds what this one withholds (reshaping a sent batch)."""
        return Batch(tensors, lists, meta, withheld=self.withheld, reader=self.reader)

    def get(self, key: str, default=None):
        return self[key] if key in self else default

    def set(self, key: str, value) -> None:
        """Add or replace a field; tensors go to `tensors`, anything else to `lists`."""
        n = len(self) if (self.tensors or self.lists) else None
        rows = value.shape[0] if isinstance(value, torch.Tensor) else len(value)
        if n is not None and rows != n and key not in self.tensors and key not in self.lists:
            raise ValueError(f"field {key!r} has {rows} rows, batch has {n}")
        if key in self.withheld:  # the method's own column now: it reads what it wrote
            self.withheld = self.withheld - {key}
        if isinstance(value, torch.Tensor):
            self.lists.pop(key, None)
            self.tensors[key] = value
        else:
            self.tensors.pop(key, None)
            self.lists[key] = list(value)

    def update(self, other: Batch) -> Batch:
        for k, v in other.tensors.items():
            self.set(k, v)
        for k, v in other.lists.items():
            self.set(k, v)
        self.meta.update(other.meta)
        return self

    # ---- reshaping ----------------------------------------------------------------------
    def select(self, index: Sequence[int] | torch.Tensor) -> Batch:
        """Rows `index`, in that order."""
        idx = torch.as_tensor(index, dtype=torch.long)
        rows = idx.tolist()
        return self._like(
            {k: v[idx.to(v.device)] for k, v in self.tensors.items()},
            {k: [v[i] for i in rows] for k, v in self.lists.items()},
            dict(self.meta),
        )

    def slice(self, start: int, stop: int) -> Batch:
        return self._like(
            {k: v[start:stop] for k, v in self.tensors.items()},
            {k: v[start:stop] for k, v in self.lists.items()},
            dict(self.meta),
        )

    def split(self, size: int) -> list[Batch]:
        """Consecutive chunks of `size` rows (the last may be shorter)."""
        return [self.slice(i, i + size) for i in range(0, len(self), size)]

    def chunk(self, parts: int) -> list[Batch]:
        """`parts` equal consecutive chunks; the row count must divide evenly (one per rank)."""
        if len(self) % parts:
            raise ValueError(f"cannot split {len(self)} rows into {parts} equal parts")
        return self.split(len(self) // parts)

    def repeat_interleave(self, n: int) -> Batch:
        """Each row repeated n times in place: rows a, b -> a, a, b, b (n=2)."""
        return self._like(
            {k: v.repeat_interleave(n, dim=0) for k, v in self.tensors.items()},
            {k: [x for x in v for _ in range(n)] for k, v in self.lists.items()},
            dict(self.meta),
        )

    def to(self, device: torch.device | str) -> Batch:
        return self._like({k: v.to(device) for k, v in self.tensors.items()}, dict(self.lists), dict(self.meta))

    @staticmethod
    def concat(batches: Iterable[Batch]) -> Batch:
        batches = [b for b in batches if len(b) or b.tensors or b.lists]
        if not batches:
            return Batch()
        first = batches[0]
        return first._like(
            {k: torch.cat([b.tensors[k] for b in batches], dim=0) for k in first.tensors},
            {k: [x for b in batches for x in b.lists[k]] for k in first.lists},
            dict(first.meta),
        )


def reads(*columns: str, trimmed: bool = True):
    """Declare the columns a worker method reads from its batch (a decorator, next to the method): the
    worker group sends it only those of them that the batch has (`Batch.only`), so the texts, images
    and extra_info a phase does not read stay on the controller, and a read of any other column the batch
    has raises `UndeclaredColumn` (a column no batch has reads as absent). A method without it is sent the
    whole batch.
    `trimmed`: the method's forwards drop the left padding every row shares anyway (the engine's
    micro-batches), so it is sent without it (`trim_left_padding`; results are per response token, which
    it does not move); False for the rollout, whose rows become the controller's batch."""

    def declare(method):
        method.reads = frozenset(columns)
        method.trimmed = trimmed
        return method

    return declare


def trim_left_padding(batch: Batch) -> Batch:
    """Drop leading columns that are padding in every row (prompts are left-padded); the
    response columns at the right are never touched, so response indexing is unchanged."""
    mask = batch["attention_mask"]
    used_cols = mask.any(dim=0).nonzero()
    first = int(used_cols[0]) if used_cols.numel() else 0
    if first == 0:
        return batch
    out = batch._like(dict(batch.tensors), dict(batch.lists), dict(batch.meta))
    out.set("input_ids", batch["input_ids"][:, first:])
    out.set("attention_mask", mask[:, first:])
    return out
