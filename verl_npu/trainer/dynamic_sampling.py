"""DAPO's dynamic sampling (`algorithm.filter_groups.*` with `data.gen_batch_size`), as one training step uses it.

With `algorithm.filter_groups.enable` the training loader hands out batches of `data.gen_batch_size`
prompts (null: `data.train_batch_size`). One step then:

1. generates and scores one such batch (`rollout.n` responses per prompt; a group is the responses of one
   prompt, one `uid`);
2. drops every group whose per-response `filter_groups.metric` has zero population std over the group
   (a group of one response is never dropped, as in verl 0.9.1); a group whose values include NaN
   (a reward extra missing for some response) is kept;
3. while fewer than `data.train_batch_size` groups are kept, draws the next batch from the loader
   (into the next epoch when this one is used up) and repeats; when `max_num_gen_batches` (> 0)
   batches were generated and still too few groups are kept, raises `TooFewGroups` (a UserError naming
   the keys and the fixes), as verl's DAPO recipe raises at its limit;
4. returns exactly the first `data.train_batch_size` kept groups, in generation order.

The loader's position advances over every batch drawn, so a checkpoint saved after the step counts
every prompt consumed and a resumed run continues with the next unseen batch.

The metric of a response: `reward`, `seq_reward`, `seq_final_reward`: its summed `token_level_scores`
(the score after the dapo overlong penalty, before any KL penalty: KL in the reward comes after
filtering here); `score` and `acc`: the reward extra of that name when the reward function returns it,
else the summed score; any other name: that reward extra (a missing one is a UserError listing those
there are).

Metrics (verl's names): `train/num_gen_batches` (batches generated this step, verl's DAPO recipe),
`training/filter_groups/evicted_samples` (responses in dropped groups) and
`training/filter_groups/discarded_surplus_samples` (responses of kept groups beyond train_batch_size)
(verl 0.9.1's replay buffer); verl-npu's own: `training/filter_groups/kept_groups` (groups that passed the filter, surplus included)
and `training/filter_groups/dropped_groups` (over all batches of the step).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from verl_npu.batch import Batch
from verl_npu.errors import UserError

log = logging.getLogger("verl_npu")

#: metrics that read the summed token-level score of a response (before any KL penalty)
SEQUENCE_SCORE_METRICS = ("reward", "seq_reward", "seq_final_reward")


class TooFewGroups(UserError):
    """`algorithm.filter_groups.max_num_gen_batches` batches were generated without enough kept groups."""


def metric_values(batch: Batch, metric: str) -> list[float]:
    """The per-response value of `metric` for a scored batch (see the module docstring)."""
    extras = batch.meta.get("reward_extras", {})
    if metric not in SEQUENCE_SCORE_METRICS:
        if metric in extras:
            return [float(v) for v in extras[metric]]
        if metric not in ("score", "acc"):
            raise UserError(
                f"algorithm.filter_groups.metric={metric!r} is not a reward extra of this run (extras: "
                f"{', '.join(sorted(extras)) or 'none'}): use reward, seq_reward, score or acc, or a key of the "
                "dict your reward function returns"
            )
    return batch["token_level_scores"].sum(-1).tolist()


def zero_variance_groups(uids: list, values: list[float]) -> set:
    """The uids whose groups have more than one response and a population std of exactly 0."""
    by_uid: dict = {}
    for uid, value in zip(uids, values):
        by_uid.setdefault(uid, []).append(value)
    return {
        uid
        for uid, vals in by_uid.items()
        if len(vals) > 1 and not any(math.isnan(v) for v in vals) and float(np.std(vals)) == 0.0
    }


def select_rows(batch: Batch, index: list[int]) -> Batch:
    """`batch.select(index)` with the per-response reward extras (kept in `meta`) selected too."""
    out = batch.select(index)
    extras = batch.meta.get("reward_extras", {})
    out.meta["reward_extras"] = {k: [v[i] for i in index] for k, v in extras.items()}
    return out


def concat_rows(batches: list[Batch]) -> Batch:
    """`Batch.concat` with the reward extras concatenated (NaN where a batch lacks an extra)."""
    out = Batch.concat(batches)
    names = sorted({k for b in batches for k in b.meta.get("reward_extras", {})})
    out.meta["reward_extras"] = {
        k: [v for b in batches for v in b.meta["reward_extras"].get(k, [math.nan] * len(b))] for k in names
    }
    return out


@dataclass
class DynamicSampler:
    """Collects `train_batch_size` groups of non-zero metric variance for one step (module docstring)."""

    train_batch_size: int
    metric: str
    max_num_gen_batches: int

    @classmethod
    def from_config(cls, cfg) -> DynamicSampler | None:
        """The sampler of `cfg` (the typed backend config), or None without algorithm.filter_groups.enable
        (the config's rules make `metric` set whenever it is enabled)."""
        fg = cfg.algorithm.filter_groups
        if not fg.enable:
            return None
        return cls(cfg.data.train_batch_size, fg.metric, fg.max_num_gen_batches)

    def collect(
        self,
        first: Batch,
        next_prompts: Callable[[], Batch],
        generate_and_score: Callable[[Batch, int], Batch],
        step: int,
    ) -> tuple[Batch, dict[str, float]]:
        """Generate (`generate_and_score(prompts, k)` for the k-th batch of the step, k from 0) from
        `first` and then from `next_prompts()` until `train_batch_size` groups are kept; returns the
        first `train_batch_size` kept groups and the step's sampling metrics."""
        kept: list[Batch] = []
        kept_groups = passed_groups = dropped_groups = evicted = 0
        prompts, k = first, 0
        while True:
            batch = generate_and_score(prompts, k)
            k += 1
            uids = list(batch["uid"])
            dropped = zero_variance_groups(uids, metric_values(batch, self.metric))
            groups = list(dict.fromkeys(uids))
            dropped_groups += len(dropped)
            evicted += sum(uid in dropped for uid in uids)
            kept_uids = [u for u in groups if u not in dropped][: max(self.train_batch_size - kept_groups, 0)]
            passed_groups += len(groups) - len(dropped)
            take = set(kept_uids)
            if take:
                kept.append(select_rows(batch, [i for i, u in enumerate(uids) if u in take]))
            kept_groups += len(kept_uids)
            if kept_groups >= self.train_batch_size:
                break
            if 0 < self.max_num_gen_batches <= k:
                raise TooFewGroups(
                    f"step {step}: dynamic sampling generated algorithm.filter_groups.max_num_gen_batches={k} "
                    f"batches of {len(groups)} prompts and kept only {kept_groups} of the data.train_batch_size="
                    f"{self.train_batch_size} groups it needs ({dropped_groups} groups had zero std of "
                    f"filter_groups.metric={self.metric!r}). The prompts are too easy or too hard for the model: "
                    "raise max_num_gen_batches (0 or less: no limit) or data.gen_batch_size, lower "
                    "data.train_batch_size, raise rollout.n, or use other data"
                )
            prompts = next_prompts()
        surplus_samples = (passed_groups - kept_groups) * (len(uids) // max(len(groups), 1))  # x rollout.n
        metrics = {
            "train/num_gen_batches": float(k),
            "training/filter_groups/evicted_samples": float(evicted),
            "training/filter_groups/discarded_surplus_samples": float(surplus_samples),
            "training/filter_groups/kept_groups": float(passed_groups),
            "training/filter_groups/dropped_groups": float(dropped_groups),
        }
        log.info(
            "dynamic sampling, step %d: %d generation batch(es); %d groups kept, %d dropped (zero std of %s); "
            "training on %d groups",
            step,
            k,
            passed_groups,
            dropped_groups,
            self.metric,
            self.train_batch_size,
        )
        return concat_rows(kept), metrics
