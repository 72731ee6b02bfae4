"""Cross-key rules of ROLL's reward normalisation (`algorithm.reward_norm.*`, a verl-npu extension) and of the
optimal-token-baseline estimators, registered in `rules.RULES`.

Kept apart from `rules.py` so that each file stays small; `paths` (and so `loader`) imports this module,
which registers its rules.
"""

from __future__ import annotations

from collections.abc import Iterator

from verl_npu.config.rules import Ctx, _rule
from verl_npu.config.tree import ACTOR, ALGO, ROLL
from verl_npu.errors import Problem
from verl_npu.registry import estimator_spec

RN = ALGO + "reward_norm."


@_rule(
    "reward_norm_groups",
    (
        RN + "method",
        RN + "grouping",
        ROLL + "n",
        ALGO + "adv_estimator",
        ALGO + "norm_adv_by_std_in_grpo",
        RN + "clip",
        ALGO + "gdpo_reward_keys",
    ),
    "algorithm.reward_norm.method other than identity with grouping=state needs rollout.n >= 2 (a group of one "
    "response is normalised to 0); reward_norm is refused with adv_estimator=remax (its greedy baseline is a raw "
    "score); warnings where the estimator undoes it (grpo's own normalisation, gdpo with reward keys)",
)
def _reward_norm_groups(c: Ctx) -> Iterator[Problem]:
    method, grouping = c(RN + "method"), c(RN + "grouping")
    if method == "identity" and c(RN + "clip") is None:
        return
    if method != "identity" and grouping == "state" and int(c(ROLL + "n")) < 2:
        yield Problem(
            RN + "grouping",
            f"is state with rollout.n={c(ROLL + 'n')}: every group holds one response, "
            f"so reward_norm.method={method} would set every score to 0 (nothing to learn from)",
            "set actor_rollout_ref.rollout.n >= 2, or algorithm.reward_norm.grouping=batch "
            "(or inductive), or method=identity",
        )
    est = c(ALGO + "adv_estimator")
    spec = estimator_spec(est)
    if spec is not None and spec.needs_greedy_baseline:
        key = RN + ("method" if method != "identity" else "clip")
        yield Problem(
            key,
            f"is {c(key)}, but adv_estimator=remax subtracts the raw score of a greedy "
            "response, which no group normalises: the two scores would not be comparable",
            "set algorithm.reward_norm.method=identity (and clip=null), or use another estimator",
        )
    if spec is not None and spec.score_components and c(ALGO + "gdpo_reward_keys"):
        c.warnings.append(
            f"algorithm.reward_norm.method={method} has no effect with adv_estimator=gdpo and "
            "gdpo_reward_keys set: gdpo normalises the reward components, not the score"
        )
    by_std = bool(c(ALGO + "norm_adv_by_std_in_grpo"))
    if (
        spec is not None
        and spec.group_mean_std
        and c(RN + "clip") is None
        and (method == "mean" or (method == "mean_std" and by_std))
    ):
        c.warnings.append(
            f"algorithm.reward_norm.method={method} changes nothing with adv_estimator={est} and "
            f"norm_adv_by_std_in_grpo={str(by_std).lower()}: GRPO's own per-prompt normalisation undoes any shift "
            "(and, dividing by the std, any positive "
            "scale) shared within a prompt's group, up to its 1e-6 epsilons. Use asym_clip or "
            "reward_norm.clip, Dr.GRPO (norm_adv_by_std_in_grpo=false), or an estimator without its own "
            "normalisation (rloo, reinforce_plus_plus, gae, ...)"
        )


OTB = ("optimal_token_baseline", "tir_optimal_token_baseline")


@_rule(
    "otb_needs_sum_pi_squared",
    (ALGO + "adv_estimator", ACTOR + "calculate_sum_pi_squared"),
    "adv_estimator=optimal_token_baseline / tir_optimal_token_baseline needs actor.calculate_sum_pi_squared=true "
    "(as in verl)",
)
def _otb_needs_sum_pi_squared(c: Ctx) -> Iterator[Problem]:
    est = c(ALGO + "adv_estimator")
    if est in OTB and not c(ACTOR + "calculate_sum_pi_squared"):
        yield Problem(
            ACTOR + "calculate_sum_pi_squared",
            f"is false, but adv_estimator={est} weights its baseline "
            "by the actor's sum of squared token probabilities, which only this pass computes",
            "set actor_rollout_ref.actor.calculate_sum_pi_squared=true",
        )
