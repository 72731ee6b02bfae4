"""The schema's keys of asynchronous training (verl 0.9.1's V1 trainer modes, `trainer.v1.*`, and the standalone
rollout pool `actor_rollout_ref.rollout.nnodes / n_gpus_per_node`); `schema.SCHEMA` holds them with the rest.
The loop that reads them: `verl_npu.trainer.async_ppo` (docs/async.md). The V1 keys verl-npu does not build are
refused by name in `schema_verl_091`."""

from __future__ import annotations

from typing import Any

from verl_npu.config.key import INT, STR, Key

# A table: one call per key, kept one per line so that the keys read as rows (ruff format would put each
# argument on a line of its own).
# fmt: off

KEYS: list[Key] = []
V1, RO = "trainer.v1", "actor_rollout_ref.rollout"
#: why colocate_async is refused (docs/async.md, "What is refused")
COLOCATE_REFUSAL = (
    "use trainer.v1.trainer_mode=separate_async: its rollout processes take the trainer's own devices when the node "
    "has no others (docs/async.md, 'On accelerators'), which is the colocated overlap, with the weights in a second "
    "copy instead of the actor's module time-shared (measured on the CPU demos, generation and training on the same "
    "2 cores: a step 0.52-0.72 x sync's, bench/results/async_demos_all_seeds.md); or sync")


def _k(path: str, default: Any, type_: str, doc: str, **kw: Any) -> None:
    KEYS.append(Key(f"backend_config.{path}", default, type_, doc, **kw))


_k(f"{V1}.trainer_mode", "sync", STR, "sync: generate, then train, in turn (the default). separate_async: rollout "
   "processes of their own (rollout.nnodes x rollout.n_gpus_per_node, on the trainer's node) generate up to "
   "trainer.v1.sampler.max_off_policy_threshold model versions ahead while the trainer trains; weights are pushed to "
   "it after every step (parameter_sync_step mini-batch updates). colocate_async is refused (docs/async.md).",
   choices=("sync", "separate_async"), unsupported=("colocate_async",), instead=COLOCATE_REFUSAL)
_k(f"{V1}.separate_async.parameter_sync_step", 4, INT, "Mini-batch updates between two weight pushes to the rollout "
   "side (separate_async). verl's rule: data.train_batch_size = parameter_sync_step x actor.ppo_mini_batch_size, so "
   "one step is one sync cycle; pi_old stays fixed for the whole cycle.", min=1)
_k(f"{V1}.separate_async.num_warmup_batches", 1, INT, "Batches of data.train_batch_size prompts generated before the "
   "first training step of a run (separate_async); at most max_off_policy_threshold + 1 (no more can be generated "
   "before the first update without passing the bound).", min=1)
_k(f"{V1}.sampler.max_off_policy_threshold", 8, INT, "Most model versions between the generation of a group's first "
   "token and its update (separate_async): the rollout side generates at most this many versions ahead; 0 is the "
   "sync loop in a separate process, 1 the one-step-off pipeline (Trinity's sync_offset: 1).", min=0)
_k(f"{V1}.sampler.max_off_policy_strategy", "drop", STR, "What happens to a group that would pass "
   "max_off_policy_threshold (a late group): drop: evict it when it is staler than the threshold and reissue its "
   "prompt at the current version (one refill per evicted group; every prompt is still trained once); wait: the "
   "trainer waits for in-flight groups that reached the threshold and trains them in that step.",
   choices=("drop", "wait"))
_k(f"{RO}.nnodes", 0, INT, "Nodes of the standalone rollout pool (verl's separate_async layout): 0 with "
   "trainer_mode=sync (the engines are colocated with the actor); with separate_async 1: nnodes x n_gpus_per_node "
   "rollout processes start on the trainer's node, each on a device of its own when the node has enough, else "
   "sharing the trainer's (docs/async.md).", min=0)
_k(f"{RO}.n_gpus_per_node", None, INT, "Devices (processes on the CPU) per node of the standalone rollout pool "
   "(separate_async; null: 1): the number of rollout processes; a batch's prompts are split between them.", min=1)
