"""A newcomer's policy loss, in one file: plain REINFORCE, -A x log-prob, aggregated like the built-ins.
Named in a config by its file: actor_rollout_ref.actor.policy_loss.loss_mode=<this file>:toy_reinforce."""

from verl_npu.algorithms import agg_loss
from verl_npu.registry import POLICY_LOSSES


@POLICY_LOSSES.register("toy_reinforce", doc="-A x log-prob, no ratio and no clip (a test's toy)")
def toy_reinforce(
    log_prob,
    old_log_prob,
    advantages,
    response_mask,
    loss_agg_mode="token-mean",
    *,
    config=None,
    rollout_is_weights=None,
    clip_ratio_low=None,
    clip_ratio_high=None,
    clip_ratio_c=None,
    **agg,
):
    """pg_loss = agg(-A x log-prob); also logged as actor/toy_pg_loss, so a run shows this loss ran."""
    pg_loss = agg_loss(-advantages * log_prob, response_mask.to(log_prob.dtype), loss_agg_mode, **agg)
    return {"pg_loss": pg_loss, "toy_pg_loss": pg_loss.detach()}
