"""`trainer.balance_batch`: reorder rows so every data-parallel rank gets a similar token count."""

from __future__ import annotations

import torch


def balance_for_ranks(attention_mask: torch.Tensor, world_size: int) -> list[int]:
    """A row order whose `world_size` equal consecutive chunks have near-equal token totals.

    Greedy longest-first: rows sorted by length (descending) each go to the rank with the fewest
    tokens among ranks that still have room (every rank gets exactly N / world_size rows). With
    one rank the order is unchanged.
    """
    n = attention_mask.shape[0]
    if world_size <= 1:
        return list(range(n))
    if n % world_size:
        raise ValueError(f"{n} rows cannot be split evenly over {world_size} ranks")
    per_rank = n // world_size
    lengths = attention_mask.sum(dim=1).tolist()
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    totals = [0] * world_size
    for i in order:
        open_ranks = [r for r in range(world_size) if len(ranks[r]) < per_rank]
        r = min(open_ranks, key=lambda r: (totals[r], r))
        ranks[r].append(i)
        totals[r] += lengths[i]
    return [i for rank_rows in ranks for i in sorted(rank_rows)]
