"""RL algorithms as pure tensor functions: advantages, policy loss, KL, loss aggregation.

Shapes: ``B`` rows (responses), ``T`` response positions. ``response_mask`` [B, T] is 1 on real
response tokens and 0 on padding. Every function here is device-agnostic and stateless except the
KL controllers, which hold one coefficient.

Semantics follow upstream verl's config language (``algorithm.adv_estimator``,
``actor.loss_agg_mode``, ``actor.kl_loss_type``, ``algorithm.kl_ctrl``...); the formulas are in
each docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from verl_npu import registry
from verl_npu.errors import UserError

GRPO_EPS = 1e-6
WHITEN_EPS = 1e-8
LOG_RATIO_CLAMP = 20.0
LOW_VAR_KL_CLAMP = 10.0
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


# ----------------------------------------------------------------------------- masked helpers


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``Σ values·mask`` over ``dim`` (all elements when ``dim`` is None)."""
    product = values * mask
    return product.sum() if dim is None else product.sum(dim=dim)


def last_trained_token(response_mask: torch.Tensor) -> torch.Tensor:
    """Column of each row's last response token with mask 1 (where a sequence's score goes): the end of
    the response for a single-turn row, the end of the last model turn for a multi-turn one (tool tokens
    after it are not trained); 0 for a row without any."""
    cols = torch.arange(1, response_mask.shape[1] + 1, device=response_mask.device)
    return ((cols * (response_mask > 0)).argmax(-1)).clamp(min=0)


def scores_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Token-level scores [B, T] (float32): each row's sequence score `scores` [B] on its last trained
    token (`last_trained_token`), zeros elsewhere; the rule reward's and the reward model's placement."""
    token_scores = torch.zeros(response_mask.shape, dtype=torch.float32)
    token_scores[torch.arange(len(scores)), last_trained_token(response_mask)] = scores.to(torch.float32)
    return token_scores


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """``Σ values·mask / Σ mask`` over ``dim`` (all elements when None).

    An all-zero mask gives 0 rather than NaN (the denominator is clamped to at least 1e-8 and the
    numerator is then 0).
    """
    denom = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / denom.clamp_min(1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked elements: ``mean((x - mean)²)``, times ``n/(n-1)`` when unbiased.

    Raises ValueError when the mask selects no element, or only one with ``unbiased`` (the
    Bessel correction is undefined there).
    """
    count = mask.sum()
    if count == 0:
        raise ValueError("masked_var: the mask selects no element")
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        if count == 1:
            raise ValueError("masked_var: an unbiased variance needs at least 2 masked elements")
        var = var * count / (count - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(x - mean) / sqrt(var + 1e-8)`` with mean and unbiased var over the masked elements.

    With ``shift_mean=False`` the mean is added back (only the scale is normalised). Values at
    masked-out positions are transformed too; callers multiply by the mask when they need zeros.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    whitened = (values - mean) * torch.rsqrt(var + WHITEN_EPS)
    return whitened if shift_mean else whitened + mean


# ----------------------------------------------------------------------------- advantage estimators

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
#: name -> estimator function, bound by the `@ADVANTAGE_ESTIMATORS.register` declarations (verl_npu.registry)
ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = registry.ADVANTAGE_ESTIMATORS.implementations


def compute_advantages(
    name: str,
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: Sequence[Hashable] | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator registered as ``name``; returns ``(advantages, returns)``, both [B, T].

    ``config`` is the typed ``algorithm`` section (`verl_npu.config.typed`): ``norm_adv_by_std_in_grpo``,
    ``gamma``, ... Extra keyword arguments go to the estimator (``baseline_rewards`` for remax).
    An unknown name raises KeyError listing the registered ones.
    """
    if name not in registry.ADVANTAGE_ESTIMATORS.specs and not registry.ADVANTAGE_ESTIMATORS.user_files_allowed(name):
        raise KeyError(f"unknown advantage estimator {name!r}; known: {', '.join(registry.ADVANTAGE_ESTIMATORS.specs)}")
    estimator = registry.ADVANTAGE_ESTIMATORS.load(name)
    if token_level_rewards.shape != response_mask.shape or token_level_rewards.dim() != 2:
        raise ValueError(
            f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must both be [B, T]"
        )
    with torch.no_grad():
        return estimator(token_level_rewards, response_mask.to(token_level_rewards.dtype), group_ids, config, **kwargs)


def _groups(group_ids: Sequence[Hashable] | None, batch_size: int) -> dict[Hashable, list[int]]:
    """Row indices per group id, in first-seen order."""
    if group_ids is None:
        raise ValueError("this advantage estimator needs group_ids (one uid per row)")
    if len(group_ids) != batch_size:
        raise ValueError(f"group_ids has {len(group_ids)} entries but the batch has {batch_size} rows")
    groups: dict[Hashable, list[int]] = {}
    for row, gid in enumerate(group_ids):
        groups.setdefault(gid, []).append(row)
    return groups


def _sequence_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-row score ``s_i = Σ_t r_{i,t}·mask_{i,t}`` [B]."""
    return (token_level_rewards * response_mask).sum(dim=-1)


@registry.ADVANTAGE_ESTIMATORS.register("grpo", needs_group=True, group_mean_std=True)
def grpo_advantage(token_level_rewards, response_mask, group_ids, config=None, **_unused):
    """group-normalised sequence score

    GRPO: ``s_i = Σ_t r_{i,t}``; per group g (same uid) of size n_g:

    - ``norm_adv_by_std_in_grpo`` true (default): ``A_i = (s_i - mean_g) / (std_g + 1e-6)`` with the
      unbiased std (``torch.std``, divisor n_g - 1);
    - false (Dr.GRPO): ``A_i = s_i - mean_g``;
    - a group of one row uses mean 0 and std 1, so ``A_i = s_i / (1 + 1e-6)`` (or ``s_i``).

    ``A_i`` is broadcast over the row's response tokens (0 on padding); returns = advantages.
    """
    norm_by_std = config.norm_adv_by_std_in_grpo
    scores = _sequence_scores(token_level_rewards, response_mask)
    advantages = torch.empty_like(scores)
    for rows in _groups(group_ids, scores.shape[0]).values():
        index = torch.tensor(rows, device=scores.device)
        group = scores[index]
        if len(rows) == 1:
            mean, std = torch.zeros_like(group[0]), torch.ones_like(group[0])
        else:
            mean, std = group.mean(), group.std(unbiased=True)
        centred = group - mean
        advantages[index] = centred / (std + GRPO_EPS) if norm_by_std else centred
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@registry.ADVANTAGE_ESTIMATORS.register("rloo", needs_group=True)
def rloo_advantage(token_level_rewards, response_mask, group_ids, config=None, **_unused):
    """score minus the leave-one-out group mean

    RLOO: ``s_i = Σ_t r_{i,t}``; ``A_i = s_i - (Σ_{j in g, j≠i} s_j) / (n_g - 1)`` (leave-one-out
    mean of the other responses to the same prompt). A group of one row has baseline 0 (``A_i = s_i``).

    Broadcast over the response tokens; returns = advantages.
    """
    scores = _sequence_scores(token_level_rewards, response_mask)
    advantages = scores.clone()
    for rows in _groups(group_ids, scores.shape[0]).values():
        n = len(rows)
        if n == 1:
            continue
        index = torch.tensor(rows, device=scores.device)
        group = scores[index]
        advantages[index] = group - (group.sum() - group) / (n - 1)
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@registry.ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus", needs_group=False)
def reinforce_plus_plus_advantage(token_level_rewards, response_mask, group_ids=None, config=None, **_unused):
    """discounted return, whitened over the batch

    REINFORCE++: discounted return per token, computed backwards with ``gamma`` (config, default 1):

    ``G_t = r_t + gamma·G_{t+1}·mask_{t+1}`` (the running return restarts after a padded position,
    so nothing leaks across the end of a response), ``returns = G·mask``;
    ``advantages = masked_whiten(returns, mask)·mask`` (mean/unbiased var over all response tokens
    of the batch). ``group_ids`` is not used.
    """
    gamma = config.gamma
    length = token_level_rewards.shape[1]
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(length)):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * response_mask[:, t]
    returns = returns * response_mask
    advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


@registry.ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus_baseline", needs_group=False)
def reinforce_plus_plus_baseline_advantage(token_level_rewards, response_mask, group_ids, config=None, **_unused):
    """score minus the group mean, whitened over the batch

    REINFORCE++ with a group-mean baseline: ``s_i = Σ_t r_{i,t}``; ``b_i`` = mean of ``s_j`` over
    the rows j with the same uid as i (a group of one row uses ``b_i = 0``); ``a_{i,t} = (s_i - b_i)·mask``
    broadcast over the response tokens; ``advantages = masked_whiten(a, mask)·mask`` (mean and
    unbiased variance over all response tokens of the batch). Returns = advantages.
    """
    scores = _sequence_scores(token_level_rewards, response_mask)
    centred = scores.clone()
    for rows in _groups(group_ids, scores.shape[0]).values():
        if len(rows) > 1:
            index = torch.tensor(rows, device=scores.device)
            centred[index] = scores[index] - scores[index].mean()
    per_token = centred.unsqueeze(-1) * response_mask
    advantages = masked_whiten(per_token, response_mask) * response_mask
    return advantages, advantages


@registry.ADVANTAGE_ESTIMATORS.register("remax", needs_group=False, inputs=("baseline_rewards",))
def remax_advantage(token_level_rewards, response_mask, group_ids=None, config=None, *, baseline_rewards=None, **_):
    """return minus the score of a greedy response

    ReMax: ``returns_{i,t} = Σ_{t'≥t} r_{i,t'}·mask`` (undiscounted reward-to-go);
    ``A_{i,t} = (returns_{i,t} - b_i)·mask_{i,t}`` where ``b_i`` (``baseline_rewards`` [B]) is the
    score of the greedy response to the same prompt. Returns ``(A, returns)``.
    """
    if baseline_rewards is None:
        raise ValueError("remax needs baseline_rewards [B]: the score of a greedy response per row")
    baseline = torch.as_tensor(baseline_rewards, dtype=token_level_rewards.dtype, device=token_level_rewards.device)
    if baseline.shape != token_level_rewards.shape[:1]:
        raise ValueError(
            f"baseline_rewards must have shape [{token_level_rewards.shape[0]}], got {tuple(baseline.shape)}"
        )
    masked_rewards = token_level_rewards * response_mask
    returns = masked_rewards.flip(-1).cumsum(-1).flip(-1) * response_mask
    advantages = (returns - baseline.unsqueeze(-1)) * response_mask
    return advantages, returns


@registry.ADVANTAGE_ESTIMATORS.register("gae", needs_group=False, inputs=("values",))
def gae_advantage(token_level_rewards, response_mask, group_ids=None, config=None, *, values=None, **_unused):
    """generalised advantage estimation from a critic's values (gamma, lam), whitened over the batch; trains a critic

    Generalised advantage estimation from the critic's ``values`` [B, T] (PPO).

    Per row, t runs from the last response position to the first with ``next_value = 0`` and
    ``running = 0``: ``delta_t = r_t + gamma·next_value - V_t``, ``cand_t = delta_t + gamma·lam·running``;
    where ``mask_t = 1`` the state moves (``next_value = V_t``, ``running = cand_t``), where it is 0 both
    keep their values; ``A_t = running`` after position t. ``returns = A + V``, then
    ``A = masked_whiten(A, mask)`` over all response tokens of the batch. ``gamma`` / ``lam`` come from
    ``config`` (default 1.0).
    """
    if values is None:
        raise ValueError("adv_estimator=gae needs the critic's values")
    gamma, lam = config.gamma, config.lam
    rewards = token_level_rewards.float()
    values = values.float()
    mask = response_mask.float()
    batch, length = rewards.shape
    next_value = torch.zeros(batch)
    running = torch.zeros(batch)
    advantages = torch.zeros(batch, length)
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * running
        keep = mask[:, t]
        next_value = keep * values[:, t] + (1 - keep) * next_value
        running = keep * candidate + (1 - keep) * running
        advantages[:, t] = running
    returns = advantages + values
    return masked_whiten(advantages, mask), returns


def clipped_value_loss(
    vpreds: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    **agg_kwargs: Any,
) -> dict[str, torch.Tensor]:
    """PPO's clipped value loss (the critic's objective).

    ``V_clip = clamp(V_pred, V_old - c, V_old + c)``;
    ``vf_loss = 0.5 · agg_loss(max((V_pred - R)², (V_clip - R)²), mask, loss_agg_mode, **agg_kwargs)``;
    ``vf_clipfrac`` = masked mean of ``[(V_clip - R)² > (V_pred - R)²]`` (detached).
    """
    mask = response_mask.to(vpreds.dtype)
    clipped = torch.clamp(vpreds, old_values - cliprange_value, old_values + cliprange_value)
    loss_pred = (vpreds - returns) ** 2
    loss_clip = (clipped - returns) ** 2
    per_token = torch.maximum(loss_pred, loss_clip)
    with torch.no_grad():
        clipfrac = masked_mean((loss_clip > loss_pred).to(mask.dtype), mask)
    return {"vf_loss": 0.5 * agg_loss(per_token, mask, loss_agg_mode, **agg_kwargs), "vf_clipfrac": clipfrac}


# ----------------------------------------------------------------------------- loss aggregation


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    global_tokens: float | torch.Tensor | None = None,
    global_seqs: float | torch.Tensor | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss ``L`` [B, T] with ``mask`` [B, T] to a scalar.

    Let ``N_tok`` = ``global_tokens`` (else ``Σ mask`` of this call), ``N_seq`` = ``global_seqs``
    (else the number of rows of this call with at least one masked token), ``dp`` = ``dp_size``:

    - ``token-mean``:  ``Σ_{i,t} mask·L / N_tok · dp``
    - ``token-sum``:   ``Σ_{i,t} mask·L · dp``
    - ``seq-mean-token-sum``:  ``Σ_{i non-empty} (Σ_t mask·L) / N_seq · dp``
    - ``seq-mean-token-mean``: ``Σ_{i non-empty} (Σ_t mask·L / (Σ_t mask + 1e-8)) / N_seq · dp``
    - ``seq-mean-token-sum-norm``: the ``seq-mean-token-sum`` value / ``loss_scale_factor``
      (default ``T = mask.shape[-1]``, a constant, as in Dr.GRPO).

    Global-batch semantics: a mini-batch is often cut into micro-batches (gradient accumulation)
    and spread over ``dp`` data-parallel ranks whose gradients are then *averaged*. Pass the
    counts of the whole mini-batch (all micro-batches on all ranks) as ``global_tokens`` /
    ``global_seqs`` and the number of ranks as ``dp_size``; then the micro-batch losses are simply
    summed on each rank (no extra division by the number of micro-batches), the rank average
    divides by ``dp``, which the ``· dp`` factor cancels, and the result equals this function
    applied once to the whole mini-batch with ``dp_size=1``. Without global counts each call is
    normalised by its own counts (a plain per-call mean).
    """
    mask = mask.to(loss_mat.dtype)
    if mode == "token-mean":
        denom = mask.sum() if global_tokens is None else global_tokens
        return masked_sum(loss_mat, mask) / denom * dp_size
    if mode == "token-sum":
        return masked_sum(loss_mat, mask) * dp_size
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        tokens_per_seq = mask.sum(dim=-1)
        seq_losses = masked_sum(loss_mat, mask, dim=-1)
        if mode == "seq-mean-token-mean":
            seq_losses = seq_losses / (tokens_per_seq + 1e-8)
        non_empty = (tokens_per_seq > 0).to(loss_mat.dtype)
        denom = non_empty.sum() if global_seqs is None else global_seqs
        loss = (seq_losses * non_empty).sum() / denom * dp_size
        if mode == "seq-mean-token-sum-norm":
            loss = loss / (mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return loss
    raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of: {', '.join(LOSS_AGG_MODES)}")


# ----------------------------------------------------------------------------- policy loss


@registry.POLICY_LOSSES.register("vanilla", bypass_replaces=True)
def ppo_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    *,
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    **agg_kwargs: Any,
) -> dict[str, torch.Tensor]:
    """dual-clip PPO

    Dual-clip PPO policy loss (verl's ``vanilla``).

    ``r = exp(clamp(logp - old, -20, 20))``;
    ``L1 = -A·r``, ``L2 = -A·clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)``, ``Lc = max(L1, L2)``;
    for ``A < 0`` the dual clip caps the loss: ``L = min(Lc, -A·clip_ratio_c)``; for ``A ≥ 0``, ``L = Lc``.
    ``pg_loss = agg_loss(L·w, mask, loss_agg_mode, **agg_kwargs)`` with ``w`` the rollout-correction IS
    weights ``rollout_is_weights`` (constants; 1 when None).

    Metrics (masked token means, detached): ``pg_clipfrac`` = fraction with ``L2 > L1`` (the clip
    is active), ``pg_clipfrac_lower`` = fraction with ``A < 0`` and ``Lc > -A·clip_ratio_c`` (the dual
    clip is active), ``ppo_kl`` = mean of ``old - logp`` (clamped as above). ``config`` (the actor's
    config section, which the other loss modes read their settings from) is not used.
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1.0 for the dual clip, got {clip_ratio_c}")
    mask = response_mask.to(log_prob.dtype)
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_clip = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual_cap = -advantages * clip_ratio_c
    negative = advantages < 0
    per_token = torch.where(negative, torch.minimum(loss_clip, loss_dual_cap), loss_clip)
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights
    with torch.no_grad():
        clipfrac = masked_mean((loss_clipped > loss_unclipped).to(mask.dtype), mask)
        clipfrac_lower = masked_mean(((loss_clip > loss_dual_cap) & negative).to(mask.dtype), mask)
        ppo_kl = masked_mean(-log_ratio, mask)
    return {
        "pg_loss": agg_loss(per_token, mask, loss_agg_mode, **agg_kwargs),
        "pg_clipfrac": clipfrac,
        "ppo_kl": ppo_kl,
        "pg_clipfrac_lower": clipfrac_lower,
    }


#: policy losses by ``actor.policy_loss.loss_mode``; each takes ``ppo_policy_loss``'s arguments (and the
#: keywords ``config``: the actor's config section, ``rollout_is_weights``: rollout correction's IS weights)
#: and returns a dict with ``pg_loss`` and the metrics verl logs for that mode (pg_clipfrac, ppo_kl,
#: pg_clipfrac_lower). The other modes of verl live in ``verl_npu.algorithms.policy_loss_modes`` and
#: ``verl_npu.algorithms.rollout_correction`` (bypass_mode), which register them here (the package imports them).
POLICY_LOSSES: dict[str, Callable[..., dict[str, torch.Tensor]]] = registry.POLICY_LOSSES.implementations


def policy_loss_fn(loss_mode: str) -> Callable[..., dict[str, torch.Tensor]]:
    """The policy loss declared as ``loss_mode`` (`verl_npu.registry.POLICY_LOSSES`), or a user's
    ``path/file.py:function``; KeyError naming the registered ones."""
    if loss_mode not in registry.POLICY_LOSSES.specs and not registry.POLICY_LOSSES.user_files_allowed(loss_mode):
        raise KeyError(f"unknown policy_loss.loss_mode {loss_mode!r}; known: {', '.join(registry.POLICY_LOSSES.specs)}")
    return registry.POLICY_LOSSES.load(loss_mode)


# ----------------------------------------------------------------------------- KL


KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")


def _kl_value(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str, logits, ref_logits) -> torch.Tensor:
    if kind in ("kl", "k1"):
        return logp - ref_logp
    if kind == "abs":
        return (logp - ref_logp).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (logp - ref_logp).square()
    if kind in ("low_var_kl", "k3"):
        log_ratio = torch.clamp(ref_logp - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1, -LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)
    if kind == "full":
        if logits is None or ref_logits is None:
            raise ValueError("full KL needs logits: pass logits= and ref_logits= (the full [.., T, V] distributions)")
        log_p = torch.log_softmax(logits.float(), dim=-1)
        log_q = torch.log_softmax(ref_logits.float(), dim=-1)
        return (log_p.exp() * (log_p - log_q)).sum(dim=-1).to(logp.dtype if logp is not None else logits.dtype)
    raise ValueError(f"unknown KL kind {kind!r}; choose one of: {', '.join(KL_KINDS)} (optionally with a '+' suffix)")


def kl_penalty(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    kind: str,
    *,
    logits: torch.Tensor | None = None,
    ref_logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference, shape of ``logp``.

    With ``d = logp - ref_logp``:
    - ``kl`` / ``k1``: ``d``
    - ``abs``: ``|d|``
    - ``mse`` / ``k2``: ``d²/2``
    - ``low_var_kl`` / ``k3``: ``x = clamp(-d, -20, 20)``, ``clamp(exp(x) - x - 1, -10, 10)``
    - ``full``: ``Σ_v p_v (log p_v - log q_v)`` with ``p = softmax(logits)``, ``q = softmax(ref_logits)``
      (exact; needs the full logits [.., T, V]).
    - a ``+`` suffix (e.g. ``k3+``): the value of the named kind with the gradient of ``k2``
      (straight-through: ``k2 - k2.detach() + value.detach()``).
    """
    straight_through = kind.endswith("+")
    base = kind[:-1] if straight_through else kind
    value = _kl_value(logp, ref_logp, base, logits, ref_logits)
    if not straight_through:
        return value
    k2 = 0.5 * (logp - ref_logp).square()
    return k2 - k2.detach() + value.detach()


# ----------------------------------------------------------------------------- KL controllers


class FixedKLController:
    """A constant KL coefficient: ``value = kl_coef``; ``update`` does nothing."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        del current_kl, n_steps


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019).

    ``update(kl, n)``: ``e = clip(kl / target_kl - 1, -0.2, 0.2)``; ``value *= 1 + e·n / horizon``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL needs target_kl > 0 and horizon > 0, got {target_kl}, {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(cfg: Any) -> FixedKLController | AdaptiveKLController:
    """Build the controller for the typed ``algorithm.kl_ctrl`` section (``type`` fixed|adaptive,
    ``kl_coef``, ``target_kl``, ``horizon``). A bad type or adaptive settings raise UserError naming the key."""
    kind, kl_coef = cfg.type, cfg.kl_coef
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        target_kl, horizon = cfg.target_kl, cfg.horizon
        if target_kl <= 0 or horizon <= 0:
            raise UserError(
                f"algorithm.kl_ctrl: adaptive KL needs target_kl > 0 and horizon > 0 (got target_kl={target_kl}, "
                f"horizon={horizon}); fix: set algorithm.kl_ctrl.target_kl / horizon to positive values"
            )
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise UserError(f"algorithm.kl_ctrl.type: unknown value {kind!r}; fix: use 'fixed' or 'adaptive'")


def apply_kl_in_reward(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: FixedKLController | AdaptiveKLController,
    kind: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL penalty in the reward: ``kld = kl_penalty(old, ref, kind)·mask``, ``β = kl_ctrl.value``;
    ``rewards = scores - β·kld``. ``current_kl`` = batch mean over rows of each row's masked token
    mean of ``kld``; the controller is then updated with ``(current_kl, n_steps=B)``.

    Metrics: ``actor/reward_kl_penalty`` = current_kl, ``actor/reward_kl_penalty_coeff`` = β (the
    coefficient used for these rewards, before the update).
    """
    mask = response_mask.to(token_level_scores.dtype)
    with torch.no_grad():
        kld = kl_penalty(old_log_prob, ref_log_prob, kind) * mask
        beta = kl_ctrl.value
        rewards = token_level_scores - beta * kld
        current_kl = masked_mean(kld, mask, dim=-1).mean().item()
    kl_ctrl.update(current_kl, n_steps=token_level_scores.shape[0])
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
