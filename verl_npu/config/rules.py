"""Validation's cross-key rules (batch relations, parallel sizes, sampling, resume, lengths); the rules of
other areas live beside it in `rules_<area>.py` (the vLLM engine arguments in `rules_vllm.py`) and
register in the same `RULES`. The per-key checks (one key's value on its own) are in `key_checks.py`.

Every rule is registered in `RULES` with the keys it involves, so `verl-npu explain KEY` can
list the rules of a key. Rules see the config after derivation; a rule whose inputs already
have a per-key problem is skipped so that one mistake is reported once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from verl_npu.config.modelinfo import model_heads
from verl_npu.config.schema import TP_SIZES
from verl_npu.config.schema_deprecated import DEPRECATED_WARN_ONLY
from verl_npu.config.tree import (
    ACTOR,
    ALGO,
    BC,
    DATA,
    REF,
    ROLL,
    TRAINER,
    SkipRule,
    get,  # noqa: F401 - callers read one value as rules.get
    get_unless_bad,
)
from verl_npu.errors import Problem
from verl_npu.registry import ADVANTAGE_ESTIMATORS, METRIC_SINKS, ROLLOUT_ENGINES, estimator_spec


# ------------------------------------------------------------------ cross-key rules
class Ctx:
    """What a rule sees: the derived config, the user-set keys and the keys already in error."""

    def __init__(self, cfg: DictConfig, user_keys: frozenset[str], bad: set[str]):
        self.cfg, self.user_keys, self.bad = cfg, user_keys, bad
        self.warnings: list[str] = []

    def __call__(self, path: str) -> Any:
        return get_unless_bad(self.cfg, path, self.bad)

    @property
    def world(self) -> int:
        return int(self(TRAINER + "nnodes")) * int(self(TRAINER + "n_gpus_per_node"))

    @property
    def seq_len(self) -> int:
        return int(self(DATA + "max_prompt_length")) + int(self(DATA + "max_response_length"))


@dataclass(frozen=True)
class Rule:
    """A cross-key rule: the keys it involves, what it requires in words, and its check."""

    name: str
    keys: tuple[str, ...]
    text: str
    check: Callable[[Ctx], Iterator[Problem]]


RULES: list[Rule] = []


def _rule(name: str, keys: tuple[str, ...], text: str):
    def register(fn: Callable[[Ctx], Iterator[Problem]]):
        RULES.append(Rule(name, keys, text, fn))
        return fn

    return register


_WORLD = (TRAINER + "nnodes", TRAINER + "n_gpus_per_node")
_N, _TBS, _MINI = ROLL + "n", DATA + "train_batch_size", ACTOR + "ppo_mini_batch_size"
_MICRO, _DYN = ACTOR + "ppo_micro_batch_size_per_gpu", ACTOR + "use_dynamic_bsz"
_LENS = (DATA + "max_prompt_length", DATA + "max_response_length")


@_rule("train_ge_mini", (_TBS, _MINI), "data.train_batch_size must be >= actor.ppo_mini_batch_size")
def _train_ge_mini(c: Ctx) -> Iterator[Problem]:
    if c(_TBS) < c(_MINI):
        yield Problem(
            _MINI,
            f"ppo_mini_batch_size {c(_MINI)} is larger than data.train_batch_size {c(_TBS)}",
            "lower ppo_mini_batch_size or raise data.train_batch_size",
        )


def _responses_split_evenly(c: Ctx, key: str, name: str) -> Iterator[Problem]:
    """`name` x rollout.n responses must split evenly over the devices (the problem is reported at `key`)."""
    total = c(key) * c(_N)
    if total % c.world:
        yield Problem(
            key,
            f"{name} x rollout.n = {total} responses cannot be split evenly over {c.world} devices",
            f"make {name} x n a multiple of {c.world}",
        )


@_rule(
    "train_divisible",
    (_TBS, _N) + _WORLD,
    "data.train_batch_size x rollout.n must be divisible by the device count (nnodes x n_gpus_per_node)",
)
def _train_divisible(c: Ctx) -> Iterator[Problem]:
    yield from _responses_split_evenly(c, _TBS, "train_batch_size")


@_rule(
    "mini_divisible",
    (_MINI, _N) + _WORLD,
    "actor.ppo_mini_batch_size x rollout.n must be divisible by the device count",
)
def _mini_divisible(c: Ctx) -> Iterator[Problem]:
    yield from _responses_split_evenly(c, _MINI, "ppo_mini_batch_size")


@_rule(
    "micro_required",
    (_DYN, _MICRO, ROLL + "log_prob_micro_batch_size_per_gpu", REF + "log_prob_micro_batch_size_per_gpu"),
    "without use_dynamic_bsz, every *_micro_batch_size_per_gpu in use must be set",
)
def _micro_required(c: Ctx) -> Iterator[Problem]:
    if c(_DYN):
        return
    needed = [_MICRO, ROLL + "log_prob_micro_batch_size_per_gpu"]
    if c(ACTOR + "use_kl_loss") or c(ALGO + "use_kl_in_reward"):
        needed.append(REF + "log_prob_micro_batch_size_per_gpu")  # the reference model runs only with KL
    for key in needed:
        if c(key) is None:
            yield Problem(
                key,
                "is not set and actor.use_dynamic_bsz is false",
                f"set {key.removeprefix(BC)}=1 (or more), or turn on actor.use_dynamic_bsz",
            )


@_rule(
    "micro_divides",
    (_MINI, _N, _MICRO, _DYN) + _WORLD,
    "without use_dynamic_bsz, the per-device mini batch (ppo_mini_batch_size x n / devices) must be "
    "divisible by ppo_micro_batch_size_per_gpu",
)
def _micro_divides(c: Ctx) -> Iterator[Problem]:
    micro, total = c(_MICRO), c(_MINI) * c(_N)
    if c(_DYN) or micro is None or total % c.world:
        return
    per_device = total // c.world
    if per_device % micro:
        yield Problem(
            _MICRO,
            f"the per-device mini batch is {per_device} responses "
            f"({c(_MINI)} x n={c(_N)} / {c.world} devices), not divisible by {micro}",
            f"use a ppo_micro_batch_size_per_gpu that divides {per_device}",
        )


_CRITIC = BC + "critic."
_CRITIC_KEYS = tuple(
    _CRITIC + k
    for k in (
        "enable",
        "ppo_mini_batch_size",
        "ppo_micro_batch_size_per_gpu",
        "use_dynamic_bsz",
        "ppo_max_token_len_per_gpu",
        "forward_max_token_len_per_gpu",
    )
)


@_rule(
    "critic_batches",
    _CRITIC_KEYS + (ALGO + "adv_estimator", _TBS, _N, _MINI, _MICRO, _DYN) + _LENS + _WORLD,
    "with a critic: gae needs critic.enable unset or true; critic.ppo_mini_batch_size (null: the actor's) <= "
    "data.train_batch_size and x rollout.n divisible by the device count; without use_dynamic_bsz its micro "
    "batch divides the per-device mini batch; with it, its token budgets hold one sequence",
)
def _critic_batches(c: Ctx) -> Iterator[Problem]:
    gae = bool(getattr(estimator_spec(c(ALGO + "adv_estimator")), "needs_critic", False))
    if gae and c(_CRITIC + "enable") is False:
        yield Problem(
            _CRITIC + "enable",
            "is false but algorithm.adv_estimator=gae needs a critic's values",
            "leave critic.enable unset (or true), or use a critic-free estimator",
        )
    if not (gae or c(_CRITIC + "enable")):
        return
    mini_key = _CRITIC + "ppo_mini_batch_size" if c(_CRITIC + "ppo_mini_batch_size") is not None else _MINI
    mini, total = c(mini_key), c(mini_key) * c(_N)
    if mini > c(_TBS):
        yield Problem(
            mini_key,
            f"the critic's mini batch {mini} is larger than data.train_batch_size {c(_TBS)}",
            "lower critic.ppo_mini_batch_size or raise data.train_batch_size",
        )
    if total % c.world:
        yield Problem(
            mini_key,
            f"the critic's mini batch x rollout.n = {total} responses cannot be split evenly over {c.world} devices",
            f"make critic.ppo_mini_batch_size x n a multiple of {c.world}",
        )
        return
    dynamic = c(_CRITIC + "use_dynamic_bsz")
    if not (c(_DYN) if dynamic is None else dynamic):
        micro_key = _CRITIC + "ppo_micro_batch_size_per_gpu"
        micro = c(micro_key) if c(micro_key) is not None else c(_MICRO)
        if micro is not None and (total // c.world) % micro:
            yield Problem(
                micro_key,
                f"the critic's per-device mini batch is {total // c.world} responses, not "
                f"divisible by its micro batch {micro}",
                "use a micro batch size that divides it",
            )
        return
    for key in (_CRITIC + "ppo_max_token_len_per_gpu", _CRITIC + "forward_max_token_len_per_gpu"):
        if c(key) is not None and c(key) < c.seq_len:
            yield Problem(
                key,
                f"{c(key)} tokens cannot hold one sequence of max_prompt_length + max_response_length = {c.seq_len}",
                f"set it to at least {c.seq_len}",
            )


_TOKEN_KEYS = (
    ACTOR + "ppo_max_token_len_per_gpu",
    ROLL + "log_prob_max_token_len_per_gpu",
    REF + "log_prob_max_token_len_per_gpu",
)


_SP = ACTOR + "ulysses_sequence_parallel_size"


@_rule(
    "dynamic_token_len",
    (_DYN,) + _TOKEN_KEYS + _LENS + (_SP,),
    "with use_dynamic_bsz, every *max_token_len_per_gpu x actor.ulysses_sequence_parallel_size must be >= "
    "max_prompt_length + max_response_length (the budget is per device; with Ulysses each device holds 1/sp "
    "of a sequence, as in verl)",
)
def _dynamic_token_len(c: Ctx) -> Iterator[Problem]:
    if not c(_DYN):
        return
    sp = int(c(_SP) or 1)
    need = -(-c.seq_len // sp)
    for key in _TOKEN_KEYS:
        if c(key) < need:
            held = f"{c(key)} tokens per device" + (f" (x {sp} Ulysses ranks)" if sp > 1 else "")
            yield Problem(
                key,
                f"{held} cannot hold one sequence of max_prompt_length + max_response_length = {c.seq_len}",
                f"set it to at least {need}",
            )


@_rule(
    "dynamic_consistent",
    (_DYN, ROLL + "log_prob_use_dynamic_bsz", REF + "log_prob_use_dynamic_bsz"),
    "rollout/ref log_prob_use_dynamic_bsz must equal actor.use_dynamic_bsz",
)
def _dynamic_consistent(c: Ctx) -> Iterator[Problem]:
    for key in (ROLL + "log_prob_use_dynamic_bsz", REF + "log_prob_use_dynamic_bsz"):
        if c(key) != c(_DYN):
            yield Problem(
                key,
                f"is {c(key)} but actor.use_dynamic_bsz is {c(_DYN)}",
                "remove it (it follows actor.use_dynamic_bsz) or set both the same",
            )


@_rule(
    "group_needs_n",
    (ALGO + "adv_estimator", _N),
    "estimators that compare responses within a group ("
    + ", ".join(s.name for s in ADVANTAGE_ESTIMATORS.specs.values() if s.needs_group)
    + "): rollout.n must be >= 2",
)
def _group_needs_n(c: Ctx) -> Iterator[Problem]:
    est = c(ALGO + "adv_estimator")
    if getattr(estimator_spec(est), "needs_group", False) and c(_N) < 2:
        yield Problem(
            _N,
            f"adv_estimator={est} needs at least 2 responses per prompt, got n={c(_N)}",
            "set actor_rollout_ref.rollout.n=4 (or more)",
        )


@_rule(
    "gdpo_weights",
    (ALGO + "gdpo_reward_keys", ALGO + "gdpo_reward_weights"),
    "algorithm.gdpo_reward_weights needs one weight per algorithm.gdpo_reward_keys entry",
)
def _gdpo_weights(c: Ctx) -> Iterator[Problem]:
    keys, weights = c(ALGO + "gdpo_reward_keys"), c(ALGO + "gdpo_reward_weights")
    if weights is not None and len(weights) != len(keys or [None]):
        yield Problem(
            ALGO + "gdpo_reward_weights",
            f"has {len(weights)} weight(s) for {len(keys or [None])} reward component(s) ({keys or 'the score alone'})",
            "give one weight per gdpo_reward_keys entry",
        )


@_rule(
    "logger_library",
    (TRAINER + "logger",),
    "every tracker in trainer.logger (wandb, mlflow, swanlab) needs its library: pip install 'verl-npu[NAME]'",
)
def _logger_library(c: Ctx) -> Iterator[Problem]:
    loggers = c(TRAINER + "logger")
    for name in [loggers] if isinstance(loggers, str) else list(loggers or ()):
        problem = METRIC_SINKS.specs[name].missing_library() if name in METRIC_SINKS.specs else None
        if problem:
            what, _, fix = problem.partition(": ")
            yield Problem(TRAINER + "logger", f"{name}: {what}", fix)


@_rule(
    "sampling_temperature",
    (ROLL + "do_sample", ROLL + "temperature", ROLL + "val_kwargs.do_sample", ROLL + "val_kwargs.temperature"),
    "do_sample=true needs temperature > 0 (temperature 0 is greedy: set do_sample=false)",
)
def _sampling_temperature(c: Ctx) -> Iterator[Problem]:
    for base in (ROLL, ROLL + "val_kwargs."):
        if c(base + "do_sample") and c(base + "temperature") == 0:
            yield Problem(
                base + "temperature",
                "is 0 while do_sample is true",
                "set temperature > 0, or do_sample=false for greedy decoding",
            )


@_rule(
    "resume_path",
    (TRAINER + "resume_mode", TRAINER + "resume_from_path"),
    "resume_mode=resume_path needs resume_from_path naming a global_step_N checkpoint folder",
)
def _resume_path(c: Ctx) -> Iterator[Problem]:
    if c(TRAINER + "resume_mode") != "resume_path":
        return
    path = c(TRAINER + "resume_from_path")
    if not path or not re.fullmatch(r"global_step_\d+", Path(str(path).rstrip("/")).name):
        yield Problem(
            TRAINER + "resume_from_path",
            f"must name a global_step_N folder, got {path!r}",
            "point it at <checkpoints>/global_step_N, or use resume_mode=auto",
        )


_TP, _NAME = ROLL + "tensor_model_parallel_size", ROLL + "name"


@_rule(
    "tp_divides",
    (_TP, _NAME, TRAINER + "v1.trainer_mode") + _WORLD,
    "rollout.tensor_model_parallel_size (1, 2, 4 or 8) must divide trainer.n_gpus_per_node, so a TP group of "
    "consecutive ranks never spans nodes (and so divides the device count); engines without tensor "
    "parallelism (hf) need 1; with separate_async the engines are on the rollout pool (rules_async)",
)
def _tp_divides(c: Ctx) -> Iterator[Problem]:
    tp, name, per_node = c(_TP), c(_NAME), c(TRAINER + "n_gpus_per_node")
    if not ROLLOUT_ENGINES.spec(name).tensor_parallel:
        if tp != 1:
            yield Problem(_TP, f"is {tp} but the {name} rollout has no tensor parallelism", "set it to 1 or remove it")
    elif per_node % tp and c(TRAINER + "v1.trainer_mode") != "separate_async":
        fits = ", ".join(str(t) for t in TP_SIZES if per_node % t == 0)
        yield Problem(
            _TP,
            f"{tp} does not divide trainer.n_gpus_per_node={per_node}: the ranks of one rollout "
            "engine (a TP group of consecutive ranks) must sit on one node",
            f"use one of {fits}, or change trainer.n_gpus_per_node",
        )


def rollout_groups(c: Ctx) -> tuple[int, str]:
    """(ranks per rollout group, what sets it): a TP group for tensor-parallel engines, else the
    actor's Ulysses SP group (those engines sample on the actor's own module)."""
    if ROLLOUT_ENGINES.spec(c(_NAME)).tensor_parallel:
        return c(_TP), f"rollout.tensor_model_parallel_size={c(_TP)}"
    sp = c(ACTOR + "ulysses_sequence_parallel_size")
    return sp, f"actor.ulysses_sequence_parallel_size={sp}"


@_rule(
    "train_divisible_by_rollout_groups",
    (_TBS, _TP, _NAME, ACTOR + "ulysses_sequence_parallel_size") + _WORLD,
    "data.train_batch_size must be divisible by the rollout data-parallel size: device count / "
    "tensor_model_parallel_size (vllm), or / the actor's Ulysses SP size (hf); every rollout group samples "
    "an equal share of the prompts",
)
def _train_divisible_by_rollout_groups(c: Ctx) -> Iterator[Problem]:
    yield from prompts_split_over_rollout_groups(c, _TBS, c(_TBS))


def prompts_split_over_rollout_groups(c: Ctx, key: str, prompts: int) -> Iterator[Problem]:
    """The problem (reported at `key`) when `prompts` cannot be split evenly over the rollout groups; none when
    the group size does not divide the device count (tp_divides / sp_divides report that)."""
    size, why = rollout_groups(c)
    if c.world % size:
        return
    groups = c.world // size
    if prompts % groups:
        yield Problem(
            key,
            f"{prompts} prompts cannot be split evenly over the {groups} rollout groups ({c.world} devices / {why})",
            f"make {key.removeprefix(BC)} a multiple of {groups}",
        )


_SP_KEYS = (ACTOR + "ulysses_sequence_parallel_size", REF + "ulysses_sequence_parallel_size")


@_rule("sp_divides", _SP_KEYS + _WORLD, "ulysses_sequence_parallel_size must divide the device count")
def _sp_divides(c: Ctx) -> Iterator[Problem]:
    for key in _SP_KEYS:
        if c.world % c(key):
            yield Problem(key, f"{c(key)} does not divide the {c.world} devices", f"use a divisor of {c.world}")


@_rule(
    "sp_needs_rmpad",
    _SP_KEYS + (BC + "actor_rollout_ref.model.use_remove_padding",),
    "ulysses_sequence_parallel_size > 1 needs model.use_remove_padding=true",
)
def _sp_needs_rmpad(c: Ctx) -> Iterator[Problem]:
    if max(c(k) for k in _SP_KEYS) > 1 and not c(BC + "actor_rollout_ref.model.use_remove_padding"):
        yield Problem(
            BC + "actor_rollout_ref.model.use_remove_padding",
            "is false but sequence parallelism is on",
            "set actor_rollout_ref.model.use_remove_padding=true or the SP size to 1",
        )


@_rule(
    "sp_heads",
    _SP_KEYS + (BC + "actor_rollout_ref.model.path",),
    "the SP size must divide the model's attention heads (checked when the model config is readable)",
)
def _sp_heads(c: Ctx) -> Iterator[Problem]:
    heads = model_heads(c(BC + "actor_rollout_ref.model.path"))
    if heads is None:
        return
    for key in _SP_KEYS:
        sp = c(key)
        if sp > 1 and (heads[0] % sp or (heads[1] % sp and sp % heads[1])):
            yield Problem(
                key,
                f"{sp} does not fit the model's {heads[0]} attention / {heads[1]} key-value heads",
                "use a size that divides the attention heads",
            )


@_rule(
    "batched_tokens",
    (ROLL + "max_num_batched_tokens", ROLL + "max_model_len") + _LENS,
    "rollout.max_num_batched_tokens and max_model_len must be >= max_prompt_length + max_response_length",
)
def _batched_tokens(c: Ctx) -> Iterator[Problem]:
    for key in (ROLL + "max_num_batched_tokens", ROLL + "max_model_len"):
        if c(key) is not None and c(key) < c.seq_len:
            yield Problem(
                key,
                f"{c(key)} is below max_prompt_length + max_response_length = {c.seq_len}",
                f"remove it (derived) or set it to at least {c.seq_len}",
            )


def _device(c: Ctx):
    """The device the run plans for (`device.configured_device`: trainer.device, or what this machine
    has; torch is not imported), or None when trainer.device names no device kind."""
    from verl_npu.device import configured_device

    return configured_device(c(TRAINER + "device"))


@_rule(
    "rollout_lengths",
    (ROLL + "prompt_length", ROLL + "response_length") + _LENS,
    "rollout.prompt_length/response_length must equal data.max_prompt_length/max_response_length",
)
def _rollout_lengths(c: Ctx) -> Iterator[Problem]:
    for key, src in ((ROLL + "prompt_length", _LENS[0]), (ROLL + "response_length", _LENS[1])):
        if c(key) != c(src):
            yield Problem(
                key,
                f"{c(key)} differs from {src.removeprefix(BC)}={c(src)}",
                f"remove it (it follows {src.removeprefix(BC)})",
            )


@_rule("pixels", (DATA + "min_pixels", DATA + "max_pixels"), "data.min_pixels must be <= data.max_pixels")
def _pixels(c: Ctx) -> Iterator[Problem]:
    if c(DATA + "min_pixels") > c(DATA + "max_pixels"):
        yield Problem(
            DATA + "min_pixels",
            f"{c(DATA + 'min_pixels')} is above max_pixels {c(DATA + 'max_pixels')}",
            "lower min_pixels or raise max_pixels",
        )


@_rule(
    "warnings",
    (DATA + "val_batch_size", ACTOR + "use_kl_loss", ALGO + "use_kl_in_reward"),
    "data.val_batch_size set, or KL both in the loss and in the reward, only warns",
)
def _warnings(c: Ctx) -> Iterator[Problem]:
    for key, why in DEPRECATED_WARN_ONLY.items():
        if c(key) is not None:
            c.warnings.append(f"{key} is deprecated in verl: {why}")
    if c(ACTOR + "use_kl_loss") and c(ALGO + "use_kl_in_reward"):
        c.warnings.append("KL is applied twice: actor.use_kl_loss and algorithm.use_kl_in_reward are both true")
    return iter(())


# ---- what the trainer does not implement yet (valid verl settings, refused by name before anything starts)
_SP_ACTOR, _SP_REF = ACTOR + "ulysses_sequence_parallel_size", REF + "ulysses_sequence_parallel_size"


@_rule(
    "trainer_ref_sp",
    (_SP_ACTOR, _SP_REF),
    "the reference model shares the actor's Ulysses groups: ref.ulysses_sequence_parallel_size must equal the actor's",
)
def _trainer_ref_sp(c: Ctx) -> Iterator[Problem]:
    if c(_SP_REF) != c(_SP_ACTOR):
        yield Problem(
            _SP_REF,
            f"is {c(_SP_REF)} but the actor's is {c(_SP_ACTOR)}: the reference model shares the actor's SP groups",
            f"set both to {c(_SP_ACTOR)}",
        )


@_rule(
    "trainer_full_kl_in_reward",
    (ALGO + "use_kl_in_reward", ALGO + "kl_penalty"),
    "algorithm.kl_penalty=full is not implemented for KL in the reward (use_kl_in_reward=true)",
)
def _trainer_full_kl(c: Ctx) -> Iterator[Problem]:
    if c(ALGO + "use_kl_in_reward") and c(ALGO + "kl_penalty") == "full":
        yield Problem(
            ALGO + "kl_penalty", "'full' is not implemented for KL in the reward", "use kl, abs, mse or low_var_kl"
        )


def check_relations(cfg: DictConfig, user_keys: frozenset[str], bad: set[str]) -> tuple[list[Problem], list[str]]:
    """Run every cross-key rule; returns (problems, warnings)."""
    ctx = Ctx(cfg, user_keys, bad)
    problems: list[Problem] = []
    for rule in RULES:
        try:
            problems += list(rule.check(ctx))
        except SkipRule:
            continue
    return problems, ctx.warnings
