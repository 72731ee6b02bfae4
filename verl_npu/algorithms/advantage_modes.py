"""The outcome advantage estimators of upstream verl 0.9.1 beyond grpo / rloo / reinforce++ / remax / gae.

Each has the estimator signature of ``verl_npu.algorithms`` (``fn(token_level_rewards, response_mask,
group_ids, config, **kw) -> (advantages, returns)``, both [B, T]) and registers itself in
``core.ADVANTAGE_ESTIMATORS`` when imported (the ``verl_npu.algorithms`` package imports this module).
``s_i = Σ_t r_{i,t}·mask_{i,t}`` is the score of row i (rewards on padding are ignored); a group g is
the rows with the same uid, of size n_g. Every advantage is broadcast over the row's response
tokens (0 on padding) and returns = advantages. This module imports torch and ``verl_npu.algorithms.core`` only.

``optimal_token_baseline`` / ``tir_optimal_token_baseline`` give a baseline per token and read the actor's
``old_log_probs`` and ``sum_pi_squared`` (keyword arguments; the trainer passes them with
``actor.calculate_sum_pi_squared``), and ``rollout_is_weights`` when the batch has them.

``gdpo_advantage`` reads each reward component of every row (``reward_components``: what the reward
function returned besides ``score``, which the trainer passes from the step's reward extras).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import torch

from verl_npu.algorithms.core import GRPO_EPS, _groups, _sequence_scores, grpo_advantage, masked_whiten
from verl_npu.errors import UserError
from verl_npu.registry import ADVANTAGE_ESTIMATORS


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


@ADVANTAGE_ESTIMATORS.register("opo", needs_group=True)
def opo_advantage(token_level_rewards, response_mask, group_ids, config=None, **_unused):
    """score minus the length-weighted group mean score

    OPO (optimal baseline for on-policy RL, arXiv 2505.23585): the length-weighted group mean as baseline.

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


@ADVANTAGE_ESTIMATORS.register("grpo_passk", needs_group=True)
def grpo_passk_advantage(token_level_rewards, response_mask, group_ids, config=None, **_unused):
    """pass@k: only the best response of a group gets (best - second best) score, divided by the group std with
    norm_adv_by_std_in_grpo

    Pass@k GRPO (arXiv 2503.19595): only the best response of each group gets an advantage.

    Per group (at least 2 rows, else ValueError): ``r1 ≥ r2`` the two largest scores; the row with the
    largest score gets ``A = r1 - r2``, divided by ``std_g + 1e-6`` (unbiased std of the group's scores)
    when ``norm_adv_by_std_in_grpo`` (config, default true); every other row gets 0. With a tie for the
    largest score ``A = 0`` whichever row holds it.
    """
    norm_by_std = config.norm_adv_by_std_in_grpo
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


@ADVANTAGE_ESTIMATORS.register("gpg", needs_group=True)
def gpg_advantage(token_level_rewards, response_mask, group_ids, config=None, **_unused):
    """score minus the group mean, times batch size / non-zero scores

    GPG's advantage (arXiv 2504.02546): group-centred score scaled by the batch's share of non-zero scores.

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


@ADVANTAGE_ESTIMATORS.register("rloo_vectorized", needs_group=True)
def rloo_vectorized_advantage(token_level_rewards, response_mask, group_ids, config=None, **_unused):
    """rloo with scatter sums; a group of one gets 0

    RLOO computed with scatter sums: ``A_i = (n_g·s_i - Σ_{j∈g} s_j) / (n_g - 1)`` (= s_i minus the mean
    of the other rows of its group) for n_g ≥ 2; a group of one row gets ``A = 0`` (unlike ``rloo``,
    which gives it ``s_i``, as in verl).
    """
    scores = _sequence_scores(token_level_rewards, response_mask)
    index, count = _group_index(group_ids, scores.shape[0], scores.device)
    sizes = torch.bincount(index, minlength=count).to(scores.dtype)[index]
    sums = torch.zeros(count, dtype=scores.dtype, device=scores.device).index_add_(0, index, scores)[index]
    advantages = torch.where(sizes > 1, (sizes * scores - sums) / (sizes - 1).clamp(min=1), torch.zeros_like(scores))
    return _broadcast(advantages, response_mask)


@ADVANTAGE_ESTIMATORS.register("grpo_vectorized", needs_group=True, group_mean_std=True)
def grpo_vectorized_advantage(token_level_rewards, response_mask, group_ids, config=None, **_unused):
    """grpo with scatter sums (group statistics in float32)

    GRPO computed with scatter sums; the group statistics in float32 (as verl's vectorised path).

    Per group: ``mean_g = Σ s / n_g``, ``std_g = sqrt(max(Σ (s - mean_g)² / max(n_g - 1, 1), 0))`` (unbiased);
    a group of one uses mean 0 and std 1. ``A_i = (s_i - mean_g) / (std_g + 1e-6)`` with
    ``norm_adv_by_std_in_grpo`` (config, default true), else ``s_i - mean_g``.
    """
    norm_by_std = config.norm_adv_by_std_in_grpo
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


@ADVANTAGE_ESTIMATORS.register("gdpo", needs_group=True, score_components=True)
def gdpo_advantage(
    token_level_rewards,
    response_mask,
    group_ids,
    config=None,
    *,
    reward_components: Mapping[str, Sequence[float]] | None = None,
    **_unused,
):
    """GRPO per reward component (algorithm.gdpo_reward_keys: keys of the reward function's dict), weighted
    (gdpo_reward_weights), summed, whitened over the batch

    GDPO (group reward-decoupled normalisation, arXiv 2601.05242): GRPO per reward component, then summed.

    With ``algorithm.gdpo_reward_keys`` = [k_1..k_K] (config) and ``reward_components[k]`` the per-row
    value of component k (what the reward function returned under that key), each component is put
    on the row's last response token (``r^k_{i,T_i-1} = c^k_i``, T_i = Σ_t mask) and
    ``A^k = grpo_advantage(r^k)`` (with ``norm_adv_by_std_in_grpo``); with ``gdpo_reward_weights``
    [w_1..w_K] (default all 1) ``A_sum = Σ_k w_k·A^k``. Without keys the one component is
    ``token_level_rewards``. ``advantages = masked_whiten(A_sum, mask)·mask`` over the batch.
    """
    keys = list(config.gdpo_reward_keys or [])
    if keys:
        if reward_components is None or any(key not in reward_components for key in keys):
            have = sorted(reward_components or {})
            raise UserError(
                f"algorithm.gdpo_reward_keys {keys} must all be keys of the dict your reward function "
                f"returns besides 'score'; it returned {have or 'no other key'}: return them, or "
                "fix gdpo_reward_keys"
            )
        last = (response_mask.sum(dim=-1).long() - 1).clamp(min=0)
        rows = torch.arange(response_mask.shape[0], device=response_mask.device)
        components = []
        for key in keys:
            missing = sum(1 for value in reward_components[key] if value != value)  # NaN: a row without it
            if missing:
                raise UserError(
                    f"algorithm.gdpo_reward_keys: {missing} of {len(reward_components[key])} rows' "
                    f"rewards have no {key!r}; every row's reward dict must hold every gdpo key"
                )
            placed = torch.zeros_like(token_level_rewards)
            placed[rows, last] = torch.as_tensor(reward_components[key], dtype=placed.dtype, device=placed.device)
            components.append(placed)
    else:
        components = [token_level_rewards]
    weights = list(config.gdpo_reward_weights or [1.0] * len(components))
    if len(weights) != len(components):
        raise UserError(
            f"algorithm.gdpo_reward_weights has {len(weights)} weights for {len(components)} "
            "gdpo_reward_keys: give one weight per key"
        )
    total = sum(float(w) * grpo_advantage(c, response_mask, group_ids, config)[0] for w, c in zip(weights, components))
    advantages = masked_whiten(total, response_mask) * response_mask
    return advantages, advantages


# ----------------------------------------------------------------------------- optimal token baseline
OTB_EPS = 1e-8


def _reward_to_go(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``G_{i,t} = Σ_{t' ≥ t} r_{i,t'}·mask_{i,t'}`` [B, T]."""
    return (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)


def _otb(
    token_level_rewards,
    response_mask,
    group_ids,
    *,
    by_token_index: bool,
    old_log_probs=None,
    sum_pi_squared=None,
    rollout_is_weights=None,
    handle_zero_tail: bool = True,
    **_unused,
):
    """The optimal token baseline on columns (``by_token_index`` false) or on each row's k-th response token
    (true: the rows' masks need not start at column 0 nor be contiguous); see the two estimators, whose keyword
    inputs (``old_log_probs``, ``sum_pi_squared``, ``rollout_is_weights``, ``handle_zero_tail``) land here."""
    if old_log_probs is None or sum_pi_squared is None:
        raise UserError(
            "optimal_token_baseline needs the actor's old log-probs and sum of squared token "
            "probabilities: set actor_rollout_ref.actor.calculate_sum_pi_squared=true"
        )
    returns = _reward_to_go(token_level_rewards, response_mask)
    w = 1.0 - 2.0 * torch.exp(old_log_probs.to(returns.dtype)) + sum_pi_squared.to(returns.dtype)
    if rollout_is_weights is not None:
        w = w * rollout_is_weights.to(returns.dtype) ** 2
    path = (w * response_mask).cumsum(-1)  # W_{i,t} = Σ_{t' ≤ t} w_{i,t'}·mask
    lengths = response_mask.sum(-1).long()
    valid = response_mask.bool()
    if by_token_index:  # row i's k-th response token at column k: G and W gathered there, 0 past the row's end
        width = int(lengths.max()) if lengths.numel() else 0
        g_cols, w_cols = returns.new_zeros(len(lengths), width), returns.new_zeros(len(lengths), width)
        for i in range(len(lengths)):
            g_cols[i, : lengths[i]], w_cols[i, : lengths[i]] = returns[i, valid[i]], path[i, valid[i]]
        live = (torch.arange(width, device=returns.device) < lengths.unsqueeze(-1)).to(returns.dtype)
    else:
        g_cols, w_cols, live = returns, path, response_mask
    baselines = torch.zeros_like(g_cols)
    groups = _groups(group_ids, returns.shape[0])
    for rows in groups.values():
        if by_token_index:
            rows = [r for r in rows if lengths[r] > 0]  # an empty response is in no group
        if len(rows) < 2:
            continue  # a group of one: baseline 0, A = G
        index = torch.tensor(rows, device=returns.device)
        weight = w_cols[index] * live[index]
        baselines[index] = ((g_cols[index] * weight).sum(0) / (weight.sum(0) + OTB_EPS)).to(baselines.dtype)
        if handle_zero_tail:
            group_lengths = lengths[index]
            ordered = torch.sort(group_lengths).values
            longest, second = int(ordered[-1]), int(ordered[-2])
            if longest > second and int((group_lengths == longest).sum()) == 1:
                baselines[rows[int(torch.argmax(group_lengths))], second:] = 0.0
    advantages = (g_cols - baselines) * live
    if by_token_index:
        scattered = torch.zeros_like(returns)
        for i in range(len(lengths)):
            scattered[i, valid[i]] = advantages[i, : lengths[i]]
        advantages = scattered
    return advantages * response_mask, returns


@ADVANTAGE_ESTIMATORS.register("optimal_token_baseline", needs_group=True, inputs=("old_log_probs", "sum_pi_squared"))
def optimal_token_baseline_advantage(token_level_rewards, response_mask, group_ids, config=None, **inputs):
    """reward-to-go minus a per-token group baseline weighted by the path variance 1 - 2 pi + sum pi^2 accumulated so
    far (needs actor.calculate_sum_pi_squared=true)

    Optimal token baseline (OTB): a baseline per prompt group and per response position, weighted by how much
    policy-gradient variance each response has accumulated up to that position.

    With ``π_{i,t} = exp(old_log_prob_{i,t})`` (the sampled token's probability) and ``Σπ²_{i,t}`` (the sum of
    squared probabilities of the whole vocabulary at that position, the actor's ``sum_pi_squared``):
    ``w_{i,t} = 1 - 2π_{i,t} + Σπ²_{i,t}`` (the squared norm of the log-prob's gradient with respect to the
    logits), times ``ρ_{i,t}²`` when rollout importance weights ``rollout_is_weights`` are given;
    ``W_{i,t} = Σ_{t' ≤ t} w_{i,t'}·mask`` and the reward-to-go ``G_{i,t} = Σ_{t' ≥ t} r_{i,t'}·mask``.
    For a group g (same uid) of n_g ≥ 2 rows, at every column t:
    ``B_{g,t} = Σ_{j∈g} G_{j,t}·W_{j,t}·mask_{j,t} / (Σ_{j∈g} W_{j,t}·mask_{j,t} + 1e-8)``; a group of one row
    has ``B = 0``. With ``handle_zero_tail`` (default, as verl) the only longest row of a group, when it is
    longer than the second longest (length L2), gets ``B = 0`` from column L2 on (no other row estimates it
    there). ``A_{i,t} = (G_{i,t} - B_{g(i),t})·mask``; returns = G.
    """
    return _otb(token_level_rewards, response_mask, group_ids, by_token_index=False, **inputs)


@ADVANTAGE_ESTIMATORS.register(
    "tir_optimal_token_baseline", needs_group=True, inputs=("old_log_probs", "sum_pi_squared")
)
def tir_optimal_token_baseline_advantage(token_level_rewards, response_mask, group_ids, config=None, **inputs):
    """optimal_token_baseline with positions counted over response-mask tokens (multi-turn masks); the same as
    optimal_token_baseline here

    The optimal token baseline for tool-integrated (multi-turn) responses, whose response mask has holes
    (tool output): the same formulas as ``optimal_token_baseline``, with position t meaning a row's t-th
    response token (counting only tokens under the mask) instead of column t, and rows with no response
    token left out of their group. For responses whose mask is one run from column 0 (every single-turn
    response here) it equals ``optimal_token_baseline``.
    """
    return _otb(token_level_rewards, response_mask, group_ids, by_token_index=True, **inputs)
