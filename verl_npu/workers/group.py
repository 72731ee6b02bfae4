"""Worker groups: how the single controller drives its workers.

The trainer only ever talks to a `WorkerGroup`. A group has `world_size` workers (one per
device); `dispatch` splits a batch into one equal chunk per rank, runs the method on every
worker, and concatenates the results in rank order; `broadcast` runs a method with the same
arguments everywhere. `LocalWorkerGroup` runs one worker in this process (no Ray, fast start:
the CPU demo); `RayWorkerGroup` (verl_npu.workers.ray_group) runs one Ray actor per device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from verl_npu.batch import Batch


class WorkerGroup(ABC):
    world_size: int = 1
    sp_size: int = 1  # Ulysses: ranks [i*sp, (i+1)*sp) hold the same data shard

    @property
    def dp_size(self) -> int:
        """Data-parallel size: how many different shards a batch is split into."""
        return self.world_size // self.sp_size

    @abstractmethod
    def broadcast(self, method: str, *args, **kwargs) -> list[Any]:
        """Call `method` on every worker with the same arguments; results in rank order."""

    @abstractmethod
    def scatter(self, method: str, chunks: list[Batch], *args, **kwargs) -> list[Any]:
        """Call `method` on worker r with chunks[r]; results in rank order."""

    def _shards(self, batch: Batch) -> list[Batch]:
        """One chunk per rank: equal data-parallel chunks, each repeated for its SP group."""
        chunks = batch.chunk(self.dp_size)
        return [chunks[rank // self.sp_size] for rank in range(self.world_size)]

    def dispatch(self, method: str, batch: Batch, *args, **kwargs) -> Batch:
        results = self.scatter(method, self._shards(batch), *args, **kwargs)
        return Batch.concat(results[:: self.sp_size])  # SP peers return the same rows

    # ---- the worker API, spelled out for readers of the trainer ----------------------------
    def init_model(self) -> dict:
        return self.broadcast("init_model")[0]

    def generate_sequences(self, prompts: Batch, params) -> Batch:
        return self.dispatch("generate_sequences", prompts, params)

    def compute_log_prob(self, batch: Batch) -> Batch:
        return self.dispatch("compute_log_prob", batch)

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        return self.dispatch("compute_ref_log_prob", batch)

    def update_actor(self, batch: Batch) -> dict[str, float]:
        per_rank = self.scatter("update_actor", self._shards(batch))
        keys = per_rank[0].keys()
        return {k: sum(m[k] for m in per_rank) / len(per_rank) for k in keys}

    def save_checkpoint(self, actor_dir: str, save_hf: bool = True) -> None:
        self.broadcast("save_checkpoint", actor_dir, save_hf)

    def load_checkpoint(self, actor_dir: str) -> None:
        self.broadcast("load_checkpoint", actor_dir)

    def parameter_snapshot(self) -> dict:
        return self.broadcast("parameter_snapshot")[0]

    def shutdown(self) -> None:
        """Release the workers (and their devices)."""


class LocalWorkerGroup(WorkerGroup):
    """One worker in the controller's own process."""

    def __init__(self, worker):
        self.worker = worker
        self.world_size = 1

    def broadcast(self, method: str, *args, **kwargs) -> list[Any]:
        return [getattr(self.worker, method)(*args, **kwargs)]

    def scatter(self, method: str, chunks: list[Batch], *args, **kwargs) -> list[Any]:
        assert len(chunks) == 1
        return [getattr(self.worker, method)(chunks[0], *args, **kwargs)]
