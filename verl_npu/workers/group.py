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
    rollout_group: int = 1  # ranks [i*g, (i+1)*g) share one rollout engine (vLLM TP) and its prompts

    @property
    def dp_size(self) -> int:
        """Data-parallel size: how many different shards a batch is split into."""
        return self.world_size // self.sp_size

    @property
    def rollout_dp_size(self) -> int:
        """How many different prompt shards a rollout is split into (world / rollout group)."""
        return self.world_size // self.rollout_group

    @abstractmethod
    def broadcast(self, method: str, *args, **kwargs) -> list[Any]:
        """Call `method` on every worker with the same arguments; results in rank order."""

    @abstractmethod
    def scatter(self, method: str, chunks: list[Batch], *args, **kwargs) -> list[Any]:
        """Call `method` on worker r with chunks[r]; results in rank order."""

    def _shards(self, batch: Batch, group: int | None = None) -> list[Batch]:
        """One chunk per rank: equal chunks, one per group of `group` consecutive ranks (default:
        the SP group), each repeated for every rank of its group."""
        group = self.sp_size if group is None else group
        chunks = batch.chunk(self.world_size // group)
        return [chunks[rank // group] for rank in range(self.world_size)]

    def dispatch(self, method: str, batch: Batch, *args, group: int | None = None, **kwargs) -> Batch:
        group = self.sp_size if group is None else group
        results = self.scatter(method, self._shards(batch, group), *args, **kwargs)
        return Batch.concat(results[::group])  # the ranks of a group return the same rows

    # ---- the worker API, spelled out for readers of the trainer ----------------------------
    def init_model(self) -> dict:
        return self.broadcast("init_model")[0]

    def generate_sequences(self, prompts: Batch, params) -> Batch:
        # every rank of a rollout (TP) group gets the same prompts; one output per group
        return self.dispatch("generate_sequences", prompts, params, group=self.rollout_group)

    def compute_log_prob(self, batch: Batch) -> Batch:
        return self.dispatch("compute_log_prob", batch)

    def old_log_prob_pass_reasons(self) -> list[str]:
        """Why the separate old-log-prob pass is needed (rank 0's answer; every rank has the same
        config and model); empty when the update computes the old log-probs itself."""
        return self.broadcast("old_log_prob_pass_reasons")[0]

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        return self.dispatch("compute_ref_log_prob", batch)

    def update_actor(self, batch: Batch) -> dict[str, float]:
        per_rank = self.scatter("update_actor", self._shards(batch))
        keys = per_rank[0].keys()
        return {k: sum(m[k] for m in per_rank) / len(per_rank) for k in keys}

    def save_checkpoint(self, actor_dir: str) -> None:
        self.broadcast("save_checkpoint", actor_dir)

    def load_checkpoint(self, actor_dir: str) -> None:
        self.broadcast("load_checkpoint", actor_dir)

    def parameter_snapshot(self) -> dict:
        """Rank 0's view of the full parameters (see `parameter_snapshots` for every rank's)."""
        return self.parameter_snapshots()[0]

    def parameter_snapshots(self) -> list[dict]:
        """Every rank's own view of the full parameters, in rank order."""
        return self.broadcast("parameter_snapshot")

    def rollout_weights_digests(self) -> list[dict]:
        """Every rank's rollout-engine weight digest (empty for engines that share the actor's)."""
        return self.broadcast("rollout_weights_digest")

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
