"""Worker groups: how the single controller drives its workers.

The trainer only ever talks to a `WorkerGroup`. A group has `world_size` workers (one per
device); `dispatch` splits a batch into one equal chunk per rank, runs the method on every
worker, and concatenates the results in rank order; `broadcast` runs a method with the same
arguments everywhere. Each rank hosts one worker per role the config needs
(`verl_npu.workers.roles`: "actor", "critic", "reward_model"); `role=` picks whose method runs (default: the
actor). `LocalWorkerGroup` runs one worker in this process (no Ray, fast start:
the CPU demo); `RayWorkerGroup` (verl_npu.workers.ray_group) runs one Ray actor per device.

A call is sent only the columns its worker method reads (`@reads(...)` on the method,
`verl_npu.batch.reads`); what comes back is merged into the controller's batch by the trainer. A
rollout is sent its prompts' columns that the engine reads, and the rows it returns get the rest of
the prompts' columns here, repeated per sample, as if they had made the trip.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from verl_npu.batch import Batch, trim_left_padding
from verl_npu.registry import ROLES, role_with_method
from verl_npu.workers.engine import EXTREMES, TrainResult


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
    def broadcast(self, method: str, *args, role: str = "actor", **kwargs) -> list[Any]:
        """Call `method` of role `role` on every rank with the same arguments; results in rank order."""

    @abstractmethod
    def scatter(self, method: str, chunks: list[Batch], *args, role: str = "actor", **kwargs) -> list[Any]:
        """Call `method` of role `role` on rank r with chunks[r]; results in rank order."""

    @property
    def roles(self) -> list[str]:
        """The roles every rank hosts (the actor first)."""
        return ["actor"]

    def serves(self, method: str) -> bool:
        """Whether one of the roles this group hosts declares `method` (its `RoleSpec.methods`)."""
        return any(method in ROLES.spec(role).methods for role in self.roles)

    def _shards(self, batch: Batch, group: int | None = None) -> list[Batch]:
        """One chunk per rank: equal chunks, one per group of `group` consecutive ranks (default:
        the SP group), each repeated for every rank of its group."""
        group = self.sp_size if group is None else group
        chunks = batch.chunk(self.world_size // group)
        return [chunks[rank // group] for rank in range(self.world_size)]

    def worker_class(self, role: str) -> type:
        """The class of role `role`'s workers (whose methods declare the columns they read)."""
        return ROLES.load(role)

    def sent(self, method: str, batch: Batch, role: str = "actor") -> Batch:
        """What a call of `method` of `role` is sent of `batch`: the columns the method declares it reads
        (`verl_npu.batch.reads`), without the left padding all rows share when it is declared `trimmed`, or
        the whole batch when it declares nothing. A read of one of the batch's other columns raises
        (`UndeclaredColumn`, naming the method)."""
        worker_class = self.worker_class(role)
        declared = getattr(worker_class, method, None)
        columns = getattr(declared, "reads", None)
        if columns is None:
            return batch
        sent = batch.only(columns, reader=f"{worker_class.__name__}.{method}")
        return trim_left_padding(sent) if declared.trimmed and "attention_mask" in sent.tensors else sent

    def dispatch(
        self, method: str, batch: Batch, *args, group: int | None = None, role: str = "actor", **kwargs
    ) -> Batch:
        group = self.sp_size if group is None else group
        results = self.scatter(method, self._shards(self.sent(method, batch, role), group), *args, role=role, **kwargs)
        # the ranks of a group return the same rows; what they return is the controller's, nothing withheld
        return Batch.concat(results[::group]).released()

    # ---- the worker API, spelled out for readers of the trainer ----------------------------
    def init_model(self) -> dict:
        """Load every role's model (actor first); the actor's summary, plus `critic_num_params` etc."""
        info = self.broadcast("init_model")[0]
        for role in self.roles[1:]:
            info.update({f"{role}_{k}": v for k, v in self.broadcast("init_model", role=role)[0].items()})
        return info

    def generate_sequences(self, prompts: Batch, params) -> Batch:
        """`params.n` rows per prompt (prompt i's samples at rows i*n .. i*n+n-1): what the engine returned,
        with the prompts' columns it was not sent (texts, ground truths, extra_info) repeated per sample."""
        # every rank of a rollout (TP) group gets the same prompts; one output per group
        out = self.dispatch("generate_sequences", prompts, params, group=self.rollout_group)
        return prompts.repeat_interleave(params.n).update(out)

    def compute_log_prob(self, batch: Batch) -> Batch:
        return self.dispatch("compute_log_prob", batch)

    def old_log_prob_pass_reasons(self) -> list[str]:
        """Why the separate old-log-prob pass is needed (rank 0's answer; every rank has the same
        config and model); empty when the update computes the old log-probs itself."""
        return self.broadcast("old_log_prob_pass_reasons")[0]

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        return self.dispatch("compute_ref_log_prob", batch)

    def update_actor(self, batch: Batch, old_log_probs=None) -> TrainResult:
        """The actor's update: its metrics, and with `old_log_probs=OldLogProbs.UPDATE_FORWARD` (the
        old-log-prob pass skipped as redundant) the update forward's `entropys` as a column
        (`TrainResult.columns`). `old_log_probs`: where the old log-probs come from (default: the batch's)."""
        return self.update(
            role_with_method("update_actor"),
            "update_actor",
            batch,
            *(() if old_log_probs is None else (old_log_probs,)),
        )

    def update(self, role: str, method: str, batch: Batch, *args) -> TrainResult:
        """Run a training method of `role` on every rank's shard: the metrics averaged over ranks (the minima and
        maxima of `engine.EXTREMES`: their min / max), and the
        columns the update's forward kept (`TrainResult.columns`, rows in `batch`'s order; usually none)."""
        per_rank = self.scatter(method, self._shards(self.sent(method, batch, role)), *args, role=role)
        keys = per_rank[0].keys()
        columns = Batch.concat([getattr(r, "columns", Batch()) for r in per_rank[:: self.sp_size]]).released()
        return TrainResult(
            {
                k: EXTREMES[k]([m[k] for m in per_rank])
                if k in EXTREMES
                else sum(m[k] for m in per_rank) / len(per_rank)
                for k in keys
            },
            columns,
        )

    def compute_values(self, batch: Batch) -> Batch:
        """The critic's values of the response tokens (`values` [B, T])."""
        return self.dispatch("compute_values", batch, role=role_with_method("compute_values"))

    def update_critic(self, batch: Batch) -> TrainResult:
        return self.update(role_with_method("update_critic"), "update_critic", batch)

    def compute_rm_score(self, batch: Batch) -> Batch:
        """The reward model's scores (`rm_scores` [B, T], on each row's last response token); a
        batch that does not split evenly over the ranks is padded with copies of its first row,
        whose scores are dropped again."""
        pad = (-len(batch)) % self.dp_size
        padded = Batch.concat([batch, batch.select([0] * pad)]) if pad else batch
        out = self.dispatch("compute_rm_score", padded, role=role_with_method("compute_rm_score"))
        return out.slice(0, len(batch)) if pad else out

    def save_checkpoint(self, actor_dir: str, role: str = "actor") -> None:
        self.broadcast("save_checkpoint", actor_dir, role=role)

    def load_checkpoint(self, actor_dir: str, role: str = "actor") -> None:
        self.broadcast("load_checkpoint", actor_dir, role=role)

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
    """One rank in the controller's own process: one worker per role ({role: worker}, or the
    actor worker alone). With `one_rank_group` the workers were built sharded over a process group
    of this process alone (FSDP2 on one rank, for offloading); `shutdown` stops later workers from
    being sharded, and the group itself stays for the process (`parallel.start_one_rank_group`)."""

    def __init__(self, workers, one_rank_group: bool = False):
        self.workers = dict(workers) if isinstance(workers, dict) else {"actor": workers}
        self.worker = self.workers["actor"]
        self.world_size = 1
        self.one_rank_group = one_rank_group

    @property
    def roles(self) -> list[str]:
        return list(self.workers)

    def worker_class(self, role: str) -> type:
        return type(self.workers[role])

    def broadcast(self, method: str, *args, role: str = "actor", **kwargs) -> list[Any]:
        return [getattr(self.workers[role], method)(*args, **kwargs)]

    def scatter(self, method: str, chunks: list[Batch], *args, role: str = "actor", **kwargs) -> list[Any]:
        assert len(chunks) == 1
        return [getattr(self.workers[role], method)(chunks[0], *args, **kwargs)]

    def shutdown(self) -> None:
        if self.one_rank_group:
            from verl_npu.workers.parallel import stop_one_rank_group

            self.one_rank_group = False
            stop_one_rank_group()
