"""The outcome advantage estimators of upstream verl 0.9.1 beyond grpo / rloo / reinforce++ / remax / gae.

Each has the estimator signature of ``verl_npu.algorithms`` (``fn(token_level_rewards, response_mask,
group_ids, config, **kw) -> (advantages, returns)``, both [B, T]) and registers itself in
``core.ADVANTAGE_ESTIMATORS`` when imported (the ``verl_npu.algorithms`` package imports this module).
``s_i = Σ_t r_{i,t}·mask_{i,t}`` is the score of row i (rewards on padding are ignored); a group g is
the rows with the same uid, of size n_g. Every advantage is broadcast over the row's response
tokens (0 on padding) and returns = advantages. This module imports torch and ``verl_npu.algorithms.core`` only.

``gdpo_advantage`` reads each reward component of every row (``reward_components``: what the reward
function returned besides ``score``, which the trainer passes from the step's reward extras).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import torch

from verl_npu.algorithms.core import (
    GRPO_EPS, _cfg_get, _groups, _sequence_scores, grpo_advantage, masked_whiten, register_advantage,
)
from verl_npu.errors import UserError


def _group_index(group_ids: Sequence[Hashable] | None, batch_size: int, device) -> tuple[torch.Tensor, int]:
    """Each row's group as an integer 0..G-1 (first-seen order) and G."""
    groups = _groups(group_ids, batch_size)
    index = torch.empty(batch_size, dtype=torch.long)
    for number, rows in enumerate(groups.values()):
        index[rows] = number
    return index.to(device), len(groups)


def _broadcast(per_row: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    advantages = per_row.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_advantage("opo")
def opo_advantage(token_level_rewards, response_mask, group_ids, config=None, **_unused):
    """OPO (optimal baseline for on-policy RL, arXiv 2505.23585): the length-weighted group mean as baseline.

    ``len_i = Σ_t mask_{i,t}``; for a group of n_g ≥ 2 rows ``b_g = Σ_{j∈g} len_j·s_j / Σ_{j∈g} len_j``,
    for a group of one ``b_g = 0``; ``A_i = s_i - b_g``.
    """
    scores = _sequence_scores(token_level_rewards, response_mask)
    lengths = response_mask.sum(dim=-1)
    advantages = scores.clone()
    for rows in _groups(group_ids, scores.shape[0]).values():
        if len(rows) > 1:
            index = torch.tensor(rows, device=scores.device)
            baseline = (lengths[index] * scores[index]).sum() / lengths[index].sum()
            advantages[index] = scores[index] - baseline
    return _broadcast(advantages, response_mask)


@register_advantage("grpo_passk")
def grpo_passk_advantage(token_level_rewards, response_mask, group_ids, config=None, **_unused):
    """Pass@k GRPO (arXiv 2503.19595): only the best response of each group gets an advantage.

    Per group (at least 2 rows, else ValueError): ``r1 ≥ r2`` the two largest scores; the row with the
    largest score gets ``A = r1 - r2``, divided by ``std_g + 1e-6`` (unbiased std of the group's scores)
    when ``norm_adv_by_std_in_grpo`` (config, default true); every other row gets 0. With a tie for the
    largest score ``A = 0`` whichever row holds it.
    """
    norm_by_std = bool(_cfg_get(config, "norm_adv_by_std_in_grpo", True))
    scores = _sequence_scores(token_level_rewards, response_mask)
    advantages = torch.zeros_like(scores)
    for gid, rows in _groups(group_ids, scores.shape[0]).items():
        if len(rows) < 2:
            raise ValueError(f"grpo_passk needs at least 2 responses per prompt; group {gid!r} has {len(rows)}")
        index = torch.tensor(rows, device=scores.device)
        group = scores[index]
        top = torch.topk(group, 2)
        gap = top.values[0] - top.values[1]
        if norm_by_std:
            gap = gap / (group.std(unbiased=True) + GRPO_EPS)
        advantages[index[top.indices[0]]] = gap
    return _broadcast(advantages, response_mask)


@register_advantage("gpg")
def gpg_advantage(token_level_rewards, response_mask, group_ids, config=None, **_unused):
    """GPG's advantage (arXiv 2504.02546): group-centred score scaled by the batch's share of non-zero scores.

    ``α = B / max(#{i : s_i ≠ 0}, 1)`` over the whole batch of B rows; ``mean_g`` = the group's mean
    score (0 for a group of one); ``A_i = α·(s_i - mean_g)`` (no division by the std; verl's
    normaliser f_norm is 1).
    """
    scores = _sequence_scores(token_level_rewards, response_mask)
    alpha = scores.shape[0] / max(int(torch.count_nonzero(scores)), 1)
    centred = scores.clone()
    for rows in _groups(group_ids, scores.shape[0]).values():
        if len(rows) > 1:
            index = torch.tensor(rows, device=scores.device)
            centred[index] = scores[index] - scores[index].mean()
    return _broadcast(alpha * centred, response_mask)


@register_advantage("rloo_vectorized")
def rloo_vectorized_advantage(token_level_rewards, response_mask, group_ids, config=None, **_unused):
    """RLOO computed with scatter sums: ``A_i = (n_g·s_i - Σ_{j∈g} s_j) / (n_g - 1)`` (= s_i minus the mean
    of the other rows of its group) for n_g ≥ 2; a group of one row gets ``A = 0`` (unlike ``rloo``,
    which gives it ``s_i``, as in verl).
    """
    scores = _sequence_scores(token_level_rewards, response_mask)
    index, count = _group_index(group_ids, scores.shape[0], scores.device)
    sizes = torch.bincount(index, minlength=count).to(scores.dtype)[index]
    sums = torch.zeros(count, dtype=scores.dtype, device=scores.device).index_add_(0, index, scores)[index]
    advantages = torch.where(sizes > 1, (sizes * scores - sums) / (sizes - 1).clamp(min=1), torch.zeros_like(scores))
    return _broadcast(advantages, response_mask)


@register_advantage("grpo_vectorized")
def grpo_vectorized_advantage(token_level_rewards, response_mask, group_ids, config=None, **_unused):
    """GRPO computed with scatter sums; the group statistics in float32 (as verl's vectorised path).

    Per group: ``mean_g = Σ s / n_g``, ``std_g = sqrt(max(Σ (s - mean_g)² / max(n_g - 1, 1), 0))`` (unbiased);
    a group of one uses mean 0 and std 1. ``A_i = (s_i - mean_g) / (std_g + 1e-6)`` with
    ``norm_adv_by_std_in_grpo`` (config, default true), else ``s_i - mean_g``.
    """
    norm_by_std = bool(_cfg_get(config, "norm_adv_by_std_in_grpo", True))
    scores = _sequence_scores(token_level_rewards, response_mask)
    index, count = _group_index(group_ids, scores.shape[0], scores.device)
    values = scores.to(torch.float32)
    sizes = torch.zeros(count, dtype=torch.float32, device=scores.device).index_add_(0, index, torch.ones_like(values))
    mean = torch.zeros_like(sizes).index_add_(0, index, values) / sizes.clamp(min=1.0)
    squares = torch.zeros_like(sizes).index_add_(0, index, (values - mean[index]) ** 2)
    std = torch.sqrt(torch.clamp(squares / (sizes - 1.0).clamp(min=1.0), min=0.0))
    single = sizes == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    centred = scores - mean[index].to(scores.dtype)
    advantages = centred / (std[index].to(scores.dtype) + GRPO_EPS) if norm_by_std else centred
    return _broadcast(advantages, response_mask)


@register_advantage("gdpo")
def gdpo_advantage(token_level_rewards, response_mask, group_ids, config=None, *,
                   reward_components: Mapping[str, Sequence[float]] | None = None, **_unused):
    """GDPO (group reward-decoupled normalisation, arXiv 2601.05242): GRPO per reward component, then summed.

    With ``algorithm.gdpo_reward_keys`` = [k_1..k_K] (config) and ``reward_components[k]`` the per-row
    value of component k (what the reward function returned under that key), each component is put
    on the row's last response token (``r^k_{i,T_i-1} = c^k_i``, T_i = Σ_t mask) and
    ``A^k = grpo_advantage(r^k)`` (with ``norm_adv_by_std_in_grpo``); with ``gdpo_reward_weights``
    [w_1..w_K] (default all 1) ``A_sum = Σ_k w_k·A^k``. Without keys the one component is
    ``token_level_rewards``. ``advantages = masked_whiten(A_sum, mask)·mask`` over the batch.
    """
    keys = list(_cfg_get(config, "gdpo_reward_keys", None) or [])
    if keys:
        if reward_components is None or any(key not in reward_components for key in keys):
            have = sorted(reward_components or {})
            raise UserError(f"algorithm.gdpo_reward_keys {keys} must all be keys of the dict your reward function "
                            f"returns besides 'score'; it returned {have or 'no other key'}: return them, or "
                            "fix gdpo_reward_keys")
        last = (response_mask.sum(dim=-1).long() - 1).clamp(min=0)
        rows = torch.arange(response_mask.shape[0], device=response_mask.device)
        components = []
        for key in keys:
            missing = sum(1 for value in reward_components[key] if value != value)  # NaN: a row without it
            if missing:
                raise UserError(f"algorithm.gdpo_reward_keys: {missing} of {len(reward_components[key])} rows' "
                                f"rewards have no {key!r}; every row's reward dict must hold every gdpo key")
            placed = torch.zeros_like(token_level_rewards)
            placed[rows, last] = torch.as_tensor(reward_components[key], dtype=placed.dtype, device=placed.device)
            components.append(placed)
    else:
        components = [token_level_rewards]
    weights = list(_cfg_get(config, "gdpo_reward_weights", None) or [1.0] * len(components))
    if len(weights) != len(components):
        raise UserError(f"algorithm.gdpo_reward_weights has {len(weights)} weights for {len(components)} "
                        "gdpo_reward_keys: give one weight per key")
    total = sum(float(w) * grpo_advantage(c, response_mask, group_ids, config)[0] for w, c in zip(weights, components))
    advantages = masked_whiten(total, response_mask) * response_mask
    return advantages, advantages
