"""Another system's asynchronous settings -> verl 0.9.1's V1 keys as verl-npu builds them (docs/async.md): Trinity's
explorer/trainer split (`synchronizer.sync_offset` / `sync_interval`, separate explore and train processes) and
ROLL's `async_generation_ratio` become `trainer.v1.trainer_mode=separate_async` with a staleness bound
`trainer.v1.sampler.max_off_policy_threshold` (k: model versions between a group's generation and its update; k = 1
is the one-step-off pipeline) and `parameter_sync_step = data.train_batch_size / ppo_mini_batch_size` (verl's rule:
one training step is one sync cycle)."""

from __future__ import annotations

import math

from verl_npu.importers.ledger import Ledger

BC = "backend_config."
V1 = BC + "trainer.v1."
MINI = BC + "actor_rollout_ref.actor.ppo_mini_batch_size"


def versions_ahead(steps_ahead: float, steps_per_version: int) -> int:
    """Model versions a generation can lag when it runs `steps_ahead` of the other system's steps ahead and one
    version is `steps_per_version` of them: ceil(ahead / per_version), at least 1."""
    return max(1, math.ceil(float(steps_ahead) / max(int(steps_per_version), 1)))


def write_separate_async(led: Ledger, threshold: int, why: str) -> None:
    """The recipe keys of a `separate_async` run with staleness bound `threshold` (`why`: the input keys and the
    arithmetic, for the recipe's comments)."""
    system = led.system
    led.set(V1 + "trainer_mode", "separate_async", f"{system}: {why} (generation overlaps training)")
    led.set(V1 + "sampler.max_off_policy_threshold", threshold, f"{system}: {why}")
    batch, mini = led.recipe.get(BC + "data.train_batch_size"), led.recipe.get(MINI)
    if batch and mini:
        led.set(
            V1 + "separate_async.parameter_sync_step",
            max(1, int(batch) // int(mini)),
            f"data.train_batch_size / ppo_mini_batch_size = {batch} / {mini} (verl's rule: one step, one sync)",
        )
    for key in ("nnodes", "n_gpus_per_node"):
        led.set(
            f"{BC}actor_rollout_ref.rollout.{key}",
            1,
            f"{system}: the rollout side's own process (verl-npu's "
            "separate_async layout: one rollout process, docs/async.md)",
        )
    if BC + "algorithm.rollout_correction.rollout_is" not in led.recipe:
        led.set(
            BC + "algorithm.rollout_correction.rollout_is",
            "token",
            f"{system}: stale samples are weighted against the behaviour policy (decoupled PPO, docs/async.md); "
            "remove it for an uncorrected update",
        )
