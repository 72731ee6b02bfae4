"""A newcomer's rollout-correction modes, in one file: an importance-weight level and a rejection option.
Registered by naming this file in $VERL_NPU_PLUGINS; picked with algorithm.rollout_correction.rollout_is=toy_half
and rollout_rs=toy_seq_min_k3."""

import torch

from verl_npu.registry import ROLLOUT_CORRECTIONS


@ROLLOUT_CORRECTIONS.register(
    "toy_half",
    option="rollout_is",
    per_token=True,
    doc="one weight per token, exp(log-ratio / 2) truncated (a test's toy)",
)
def toy_half_weights(log_ratio, mask):
    """(statistic, raw weights): the halved log-ratio and its exp, per token."""
    half = log_ratio / 2
    return half, torch.exp(half.clamp(-20, 20))


@ROLLOUT_CORRECTIONS.register("toy_seq_min_k3", option="rollout_rs", statistic="k3")
def toy_min_statistic(values, mask, valid_token):
    """per response, the smallest over its tokens (a test's toy)"""
    low = values.masked_fill(~valid_token, float("inf")).min(dim=-1).values
    low = torch.where(low == float("inf"), torch.zeros_like(low), low)
    return low.unsqueeze(-1).expand_as(mask), low
