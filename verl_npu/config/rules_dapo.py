"""Cross-key rules of DAPO's keys (dynamic sampling `algorithm.filter_groups.*` with `data.gen_batch_size`,
the `dapo` reward manager's overlong buffer `reward_model.reward_kwargs.*`), registered in `rules.RULES`.

Kept apart from `rules.py` so that each file stays small; `paths` (and so `loader`) imports this module,
which registers its rules.
"""

from __future__ import annotations

from collections.abc import Iterator

from verl_npu.config.rules import _WORLD, Ctx, _rule, prompts_split_over_rollout_groups
from verl_npu.config.tree import ACTOR, ALGO, BC, DATA, ROLL
from verl_npu.errors import Problem
from verl_npu.registry import REWARD_MANAGERS

FG = ALGO + "filter_groups."
RK = BC + "reward_model.reward_kwargs."
OB = RK + "overlong_buffer_cfg."
MANAGER = BC + "reward_model.reward_manager"
_GROUP_KEYS = (ROLL + "tensor_model_parallel_size", ROLL + "name", ACTOR + "ulysses_sequence_parallel_size")


@_rule(
    "dapo_filter_groups",
    (FG + "enable", FG + "metric", ROLL + "n", ALGO + "use_kl_in_reward", DATA + "gen_batch_size"),
    "algorithm.filter_groups.enable needs a metric and rollout.n >= 2; seq_final_reward is not available "
    "with use_kl_in_reward=true; data.gen_batch_size is read only with filter_groups.enable",
)
def _dapo_filter_groups(c: Ctx) -> Iterator[Problem]:
    if not c(FG + "enable"):
        if c(DATA + "gen_batch_size") is not None:
            c.warnings.append(
                f"data.gen_batch_size={c(DATA + 'gen_batch_size')} has no effect without "
                "algorithm.filter_groups.enable=true (the loader reads data.train_batch_size)"
            )
        return
    metric = c(FG + "metric")
    if not metric:
        yield Problem(
            FG + "metric",
            "must be set when algorithm.filter_groups.enable is true",
            "set algorithm.filter_groups.metric=reward (or acc, score, seq_reward, seq_final_reward, "
            "or the name of a reward extra)",
        )
    if int(c(ROLL + "n")) < 2:
        yield Problem(
            ROLL + "n",
            f"is {c(ROLL + 'n')}: with algorithm.filter_groups.enable every group must have "
            "at least 2 responses (a group of one has no variance, so nothing would be filtered)",
            "set actor_rollout_ref.rollout.n >= 2, or algorithm.filter_groups.enable=false",
        )
    if metric == "seq_final_reward" and c(ALGO + "use_kl_in_reward"):
        yield Problem(
            FG + "metric",
            "seq_final_reward (the reward after the KL penalty) is not known when groups "
            "are filtered here: the KL penalty is computed after filtering",
            "use metric=seq_reward (the reward before the KL penalty), or use_kl_in_reward=false",
        )


@_rule(
    "dapo_overlong_buffer",
    (OB + "enable", OB + "len", OB + "penalty_factor", RK + "max_resp_len", MANAGER, DATA + "max_response_length"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.enable needs reward_manager=dapo and 0 < len <= max_resp_len",
)
def _dapo_overlong_buffer(c: Ctx) -> Iterator[Problem]:
    if not c(OB + "enable"):
        return
    if not REWARD_MANAGERS.spec(c(MANAGER)).overlong_penalty:
        yield Problem(
            MANAGER,
            f"is {c(MANAGER)!r}, but only the dapo reward manager reads "
            "reward_kwargs.overlong_buffer_cfg (enable is true)",
            "set reward_model.reward_manager=dapo, or overlong_buffer_cfg.enable=false",
        )
    size = int(c(OB + "len"))
    max_len = c(RK + "max_resp_len")
    max_len = int(max_len if max_len is not None else c(DATA + "max_response_length"))
    if size <= 0:
        yield Problem(
            OB + "len",
            f"is {size}: the overlong buffer must be positive when it is enabled",
            "set reward_model.reward_kwargs.overlong_buffer_cfg.len to a positive number of tokens "
            "(DAPO's recipe: max_response_length / 4), or enable=false",
        )
    elif size > max_len:
        yield Problem(
            OB + "len",
            f"is {size}, longer than max_resp_len={max_len} (the response budget the buffer ends at)",
            f"set it to at most {max_len}",
        )


@_rule(
    "dapo_gen_batch_divisible_by_rollout_groups",
    (FG + "enable", DATA + "gen_batch_size") + _GROUP_KEYS + _WORLD,
    "with algorithm.filter_groups.enable, data.gen_batch_size must be divisible by the rollout data-parallel size "
    "(every rollout group samples an equal share of each generation batch)",
)
def _dapo_gen_batch_divisible(c: Ctx) -> Iterator[Problem]:
    gen = c(DATA + "gen_batch_size")
    if not c(FG + "enable") or gen is None:
        return
    yield from prompts_split_over_rollout_groups(c, DATA + "gen_batch_size", int(gen))
