"""Cross-key rules of asynchronous training (`trainer.v1.trainer_mode=separate_async`, verl 0.9.1's V1 keys),
registered in `rules.RULES`. What the loop does with them: `verl_npu.trainer.async_ppo`, docs/async.md.

Kept apart from `rules.py` so that each file stays small; `paths` (and so `loader`) imports this module, which
registers its rules.
"""

from __future__ import annotations

from collections.abc import Iterator

from verl_npu.config.rules import Ctx, _rule
from verl_npu.config.tree import ACTOR, ALGO, BC, DATA, ROLL, TRAINER
from verl_npu.errors import Problem
from verl_npu.registry import ROLLOUT_ENGINES, estimator_spec

MODE = TRAINER + "v1.trainer_mode"
SYNC_STEP = TRAINER + "v1.separate_async.parameter_sync_step"
WARMUP = TRAINER + "v1.separate_async.num_warmup_batches"
THRESHOLD = TRAINER + "v1.sampler.max_off_policy_threshold"
POOL_NODES, POOL_PER_NODE = ROLL + "nnodes", ROLL + "n_gpus_per_node"
MINI, TBS = ACTOR + "ppo_mini_batch_size", DATA + "train_batch_size"
RC = ALGO + "rollout_correction."
#: what separate_async does not run with yet: key -> (its value that is refused, what it is, what to do instead)
_NOT_WITH_ASYNC = {
    ROLL + "name": (
        # the rollout side samples on a module copy of its own (hf), or steps a serving engine between weight
        # updates (partial rollout: vllm)
        lambda v: (
            not (
                getattr(ROLLOUT_ENGINES.find(v), "on_actor_module", False)
                or getattr(ROLLOUT_ENGINES.find(v), "partial_rollout", False)
            )
        ),
        "the {v} engine as the rollout side (separate_async runs the hf and vllm engines in this version)",
        "set actor_rollout_ref.rollout.name=hf or vllm, or trainer.v1.trainer_mode=sync to keep {v}",
    ),
    ALGO + "adv_estimator": (
        lambda v: getattr(estimator_spec(v), "needs_greedy_baseline", False),
        "remax's greedy baseline in separate_async (it generates on the trainer's devices)",
        "use grpo (or another estimator), or trainer_mode=sync",
    ),
    BC + "actor_rollout_ref.model.lora_rank": (
        lambda v: v not in (0, None),
        "LoRA in separate_async (the rollout side loads whole weights)",
        "set model.lora_rank=0, or trainer_mode=sync",
    ),
    ROLL + "calculate_log_probs": (
        lambda v: v is False,
        "separate_async without the rollout side's log-probs (they are the behaviour policy)",
        "set actor_rollout_ref.rollout.calculate_log_probs=true (or leave it unset)",
    ),
}


def _short(key: str) -> str:
    return key.removeprefix(BC)


@_rule(
    "async_batch_rule",
    (MODE, SYNC_STEP, MINI, TBS),
    "separate_async: data.train_batch_size = trainer.v1.separate_async.parameter_sync_step x "
    "actor.ppo_mini_batch_size (verl's rule: one step is one weight-sync cycle)",
)
def _batch_rule(c: Ctx) -> Iterator[Problem]:
    if c(MODE) != "separate_async":
        return
    sync_step, mini, batch = c(SYNC_STEP), c(MINI), c(TBS)
    if None in (sync_step, mini, batch) or batch == sync_step * mini:
        return
    fits = batch // mini if mini and batch % mini == 0 else None
    yield Problem(
        SYNC_STEP,
        f"is {sync_step}, but data.train_batch_size ({batch}) must equal parameter_sync_step x "
        f"actor_rollout_ref.actor.ppo_mini_batch_size ({sync_step} x {mini} = {sync_step * mini}) in "
        "separate_async (one step is one weight-sync cycle)",
        (
            f"set trainer.v1.separate_async.parameter_sync_step={fits}"
            if fits
            else f"set data.train_batch_size={sync_step * mini}"
        )
        + " (or change ppo_mini_batch_size)",
    )


@_rule(
    "async_layout",
    (
        MODE,
        POOL_NODES,
        POOL_PER_NODE,
        WARMUP,
        THRESHOLD,
        TRAINER + "nnodes",
        TRAINER + "n_gpus_per_node",
        ALGO + "filter_groups.enable",
        DATA + "gen_batch_size",
        ROLL + "tensor_model_parallel_size",
        ROLL + "multi_turn.enable",
        *_NOT_WITH_ASYNC,
    ),
    "separate_async: rollout.nnodes = 1 (the rollout processes start on the trainer's node), trainer.nnodes = 1, "
    "num_warmup_batches <= max_off_policy_threshold + 1, data.gen_batch_size null or train_batch_size with "
    "dynamic sampling, rollout.n_gpus_per_node a multiple of a vllm engine's tensor_model_parallel_size, the vllm "
    "rollout side single-turn without dynamic sampling and with one trainer worker, and none of: a rollout engine "
    "other than hf or vllm, remax, LoRA; rollout.nnodes is 0 in sync mode",
)
def _layout(c: Ctx) -> Iterator[Problem]:
    nodes, per_node = c(POOL_NODES), c(POOL_PER_NODE)
    if c(MODE) != "separate_async":
        if nodes:
            yield Problem(
                POOL_NODES,
                f"is {nodes}, but the standalone rollout pool is used only with trainer.v1.trainer_mode=separate_async",
                "set trainer.v1.trainer_mode=separate_async, "
                "or actor_rollout_ref.rollout.nnodes=0 (the engines colocated with the actor)",
            )
        return
    if not nodes:
        yield Problem(
            POOL_NODES,
            "is 0, but separate_async generates on a standalone rollout pool",
            "set actor_rollout_ref.rollout.nnodes=1 and actor_rollout_ref.rollout.n_gpus_per_node=1",
        )
    elif nodes > 1:
        yield Problem(
            POOL_NODES,
            f"is {nodes}, but the rollout processes start on the trainer's node in this "
            "version (a rollout pool on other nodes is not built)",
            f"set actor_rollout_ref.rollout.nnodes=1 and actor_rollout_ref.rollout.n_gpus_per_node="
            f"{nodes * (per_node or 1)} (that many rollout processes on this node)",
        )
    trainer_nodes = c(TRAINER + "nnodes")
    if trainer_nodes is not None and trainer_nodes > 1:
        yield Problem(
            TRAINER + "nnodes",
            f"is {trainer_nodes}: separate_async trains on the workers of one node in "
            "this version (its rollout processes start beside them)",
            "set trainer.nnodes=1 (with trainer.n_gpus_per_node trainer workers), or trainer.v1.trainer_mode=sync",
        )
    warmup, threshold = c(WARMUP), c(THRESHOLD)
    if warmup is not None and threshold is not None and warmup > threshold + 1:
        yield Problem(
            WARMUP,
            f"is {warmup}, but only max_off_policy_threshold + 1 = {threshold + 1} batches can be "
            "generated before the first update without passing the staleness bound",
            f"set trainer.v1.separate_async.num_warmup_batches <= {threshold + 1}, or raise "
            "trainer.v1.sampler.max_off_policy_threshold",
        )
    gen_batch, batch = c(DATA + "gen_batch_size"), c(TBS)
    if c(ALGO + "filter_groups.enable") and gen_batch is not None and gen_batch != batch:
        yield Problem(
            DATA + "gen_batch_size",
            f"is {gen_batch}, but separate_async issues data.train_batch_size "
            f"({batch}) prompts per step and refills each filtered group with one new prompt on the "
            "rollout stream (docs/async.md, 'Dynamic sampling')",
            f"set data.gen_batch_size=null (or {batch}), or trainer.v1.trainer_mode=sync",
        )
    spec = ROLLOUT_ENGINES.find(c(ROLL + "name"))
    tp = c(ROLL + "tensor_model_parallel_size") if spec is not None and spec.tensor_parallel else 1
    if isinstance(tp, int) and tp > 1 and (per_node or 1) % tp:
        yield Problem(
            POOL_PER_NODE,
            f"is {per_node or 1}, but each rollout engine spans "
            f"rollout.tensor_model_parallel_size={tp} devices (one rollout process each)",
            f"set actor_rollout_ref.rollout.n_gpus_per_node to a multiple of {tp} "
            f"(e.g. {tp}: one engine), or lower tensor_model_parallel_size",
        )
    custom_loops = c(ROLL + "agent.agent_loop_config_path")
    if spec is not None and getattr(spec, "partial_rollout", False) and custom_loops:
        # the built-in agent loop's turns are stepped and carry each token's version (PartialTurns); a custom
        # loop's rows are built by its own code, without them
        yield Problem(
            ROLL + "agent.agent_loop_config_path",
            f"custom agent loops ({custom_loops}) with the {spec.name} engine as the rollout side of separate_async: "
            "its partial rollout records each token's policy version for the built-in agent loop only",
            "set actor_rollout_ref.rollout.name=hf for custom agent loops in separate_async, or "
            "trainer.v1.trainer_mode=sync",
        )
    for key, (refused, what, instead) in _NOT_WITH_ASYNC.items():
        value = c(key)
        if refused(value):
            yield Problem(key, f"verl-npu does not support {what.format(v=value)} yet", instead.format(v=value))
    corrected = c(RC + "bypass_mode") is True or c(RC + "rollout_is") is not None
    if threshold and not corrected:
        c.warnings.append(
            f"trainer.v1.sampler.max_off_policy_threshold={threshold} trains on responses of older "
            "weights without an importance correction: consider algorithm.rollout_correction."
            "rollout_is=token (decoupled PPO) or bypass_mode=true (docs/async.md)"
        )
