"""A newcomer's advantage estimator, in one file: every response token gets the advantage 0.5, whatever the
score. Named in a config by its file: algorithm.adv_estimator=<this file>:toy_constant."""

import torch

from verl_npu.registry import ADVANTAGE_ESTIMATORS


@ADVANTAGE_ESTIMATORS.register("toy_constant", needs_group=False, doc="0.5 on every response token (a test's toy)")
def toy_constant(token_level_rewards, response_mask, group_ids, config=None, **_unused):
    """advantages = returns = 0.5 x response_mask."""
    advantages = torch.full_like(token_level_rewards, 0.5) * response_mask
    return advantages, advantages
