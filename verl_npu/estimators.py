"""Advantage estimators by name (`algorithm.adv_estimator`): what the config may name.

The names, their group needs and one-line meanings live here, in a module that imports nothing
heavy, so the config schema takes its choices from this registry; the tensor functions are
registered under the same names in `verl_npu.algorithms.ADVANTAGE_ESTIMATORS` (a test checks the
two agree).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EstimatorSpec:
    name: str
    needs_group: bool   # compares responses to the same prompt: rollout.n must be >= 2
    doc: str
    needs_critic: bool = False  # advantages from a critic's values: the critic role is built


ESTIMATORS: dict[str, EstimatorSpec] = {}

#: estimators upstream verl has and verl-npu does not: refused by name, with the reason (none left: every
#: estimator of verl 0.9.1 is implemented).
UNSUPPORTED_ESTIMATORS: tuple[str, ...] = ()
UNSUPPORTED_REASONS: dict[str, str] = {}


def register_estimator(name: str, *, needs_group: bool, doc: str, needs_critic: bool = False) -> None:
    if name in ESTIMATORS:
        raise ValueError(f"advantage estimator {name!r} is registered twice")
    ESTIMATORS[name] = EstimatorSpec(name, needs_group, doc, needs_critic)


register_estimator("grpo", needs_group=True, doc="group-normalised sequence score")
register_estimator("rloo", needs_group=True, doc="score minus the leave-one-out group mean")
register_estimator("reinforce_plus_plus", needs_group=False, doc="discounted return, whitened over the batch")
register_estimator("reinforce_plus_plus_baseline", needs_group=False,
                   doc="score minus the group mean, whitened over the batch")
register_estimator("gae", needs_group=False, doc="generalised advantage estimation from a critic's values "
                   "(gamma, lam), whitened over the batch; trains a critic", needs_critic=True)
register_estimator("remax", needs_group=False, doc="return minus the score of a greedy response")
register_estimator("opo", needs_group=True, doc="score minus the length-weighted group mean score")
register_estimator("grpo_passk", needs_group=True, doc="pass@k: only the best response of a group gets "
                   "(best - second best) score, divided by the group std with norm_adv_by_std_in_grpo")
register_estimator("gpg", needs_group=True, doc="score minus the group mean, times batch size / non-zero scores")
register_estimator("rloo_vectorized", needs_group=True, doc="rloo with scatter sums; a group of one gets 0")
register_estimator("grpo_vectorized", needs_group=True, doc="grpo with scatter sums (group statistics in float32)")
register_estimator("optimal_token_baseline", needs_group=True, doc="reward-to-go minus a per-token group baseline "
                   "weighted by the path variance 1 - 2 pi + sum pi^2 accumulated so far (needs "
                   "actor.calculate_sum_pi_squared=true)")
register_estimator("tir_optimal_token_baseline", needs_group=True, doc="optimal_token_baseline with positions "
                   "counted over response-mask tokens (multi-turn masks); the same as optimal_token_baseline here")
register_estimator("gdpo", needs_group=True, doc="GRPO per reward component (algorithm.gdpo_reward_keys: keys of the "
                   "reward function's dict), weighted (gdpo_reward_weights), summed, whitened over the batch")


#: ROLL's reward normalisation (`algorithm.reward_norm.*`, a verl-npu extension; tensor code in
#: `verl_npu.algorithms.reward_norm`): which rows are normalised together, and how.
REWARD_NORM_GROUPINGS = {
    "state": "the rollout.n responses of one prompt (the same uid; ROLL: state / traj_group_id)",
    "batch": "every response of the step (ROLL: batch)",
    "inductive": "every response with the same data_source (ROLL: inductive / tags, the environment tag)",
}
REWARD_NORM_METHODS = {
    "identity": "scores unchanged (the default: no normalisation)",
    "mean": "score minus the group mean",
    "mean_std": "(score - group mean) / (group std + 1e-6); 0 for a group whose std is at most 1e-6",
    "asym_clip": "mean_std, then clamped to [-1, 3]",
}


def needs_critic(cfg) -> bool:
    """A critic is trained when the advantage estimator reads values (gae) or critic.enable is true.
    `cfg` is the backend (verl-schema) config, as a DictConfig or a plain dict."""
    def at(tree, *keys):
        for key in keys:
            tree = tree.get(key) if hasattr(tree, "get") else None
        return tree

    spec = ESTIMATORS.get(str(at(cfg, "algorithm", "adv_estimator")))
    return bool(at(cfg, "critic", "enable")) or bool(spec is not None and spec.needs_critic)
