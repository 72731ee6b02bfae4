"""The policy losses of upstream verl 0.9.1 besides ``vanilla`` (``actor.policy_loss.loss_mode``).

Each function has the signature of ``verl_npu.algorithms.ppo_policy_loss``:
``fn(log_prob, old_log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c,
loss_agg_mode, *, config=None, rollout_is_weights=None, **agg_kwargs)``, where ``config`` is the actor's
config section (``actor_rollout_ref.actor``: a dict, an OmegaConf node or an attribute object) from which a
mode reads its own settings (``tau_pos``, ``policy_loss.clip_cov_ratio``, ...), and ``agg_kwargs`` are the
global-batch arguments of ``agg_loss`` (``global_tokens``, ``global_seqs``, ``dp_size``,
``loss_scale_factor``). ``rollout_is_weights`` [B, T] (rollout correction's truncated importance weights,
constants) multiply the per-token loss ``L`` before aggregation, as verl applies them (geo_mean: the
row's loss times the geometric mean of its token weights, ``exp(Σ_t log(w + 1e-10)·mask / (n_i + 1e-8))``).
Each returns a dict with ``pg_loss`` and the metrics verl logs for that mode (``pg_clipfrac``, ``ppo_kl``,
``pg_clipfrac_lower``; a mode logs only the ones verl logs for it).

Notation: ``d = logp - old`` per token, ``A`` the advantages, ``mask`` the response mask,
``mean_mask(x)`` the masked token mean over this call (a micro-batch in training, as in verl),
``agg(L)`` = ``agg_loss(L, mask, loss_agg_mode, **agg_kwargs)``, ``sg`` stop-gradient. Metrics are
detached. This module imports torch and ``verl_npu.algorithms.core`` only; the ``verl_npu.algorithms``
package imports it, and each loss registers itself in ``core.POLICY_LOSSES`` (looked up by
``policy_loss_fn``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from verl_npu.algorithms.core import LOG_RATIO_CLAMP, agg_loss, masked_mean
from verl_npu.registry import POLICY_LOSSES

#: gspo caps the log of the sequence ratio at this value (verl's numerical guard)
GSPO_LOG_RATIO_MAX = 10.0
#: dppo_kl's guard inside log((1 - q) / (1 - p))
BINARY_KL_EPS = 1e-8
#: geo_mean's guard in the per-sequence token means
GEO_MEAN_EPS = 1e-8
#: geo_mean's guard in the log of the rollout-correction IS weights (a zero weight gives a tiny row weight)
GEO_MEAN_IS_EPS = 1e-10


def _setting_get(config: Any, path: str) -> float:
    """The number at dotted ``path`` of the actor section ``config`` (e.g. ``policy_loss.kl_cov_ratio``).

    The schema fills every default in, so a missing or null value is an error naming the key."""
    node = config
    for part in path.split("."):
        if node is None:
            break
        node = node.get(part) if isinstance(node, Mapping) or hasattr(node, "get") else getattr(node, part, None)
    if node is None:
        raise ValueError(
            f"this policy loss reads actor_rollout_ref.actor.{path}, which is not set; "
            f"fix: set actor_rollout_ref.actor.{path}"
        )
    return float(node)


def _clamped_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    return torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _weighted(per_token: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """The per-token loss times the rollout-correction IS weights (constants), when there are any."""
    return per_token if rollout_is_weights is None else per_token * rollout_is_weights


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device)


@POLICY_LOSSES.register("gspo")
def gspo_policy_loss(
    log_prob,
    old_log_prob,
    advantages,
    response_mask,
    clip_ratio_low=0.2,
    clip_ratio_high=0.2,
    clip_ratio_c=3.0,
    loss_agg_mode="token-mean",
    *,
    config=None,
    rollout_is_weights=None,
    **agg_kwargs,
):
    """GSPO: PPO clip on the sequence-level (length-normalised) ratio

    GSPO (sequence-level ratio, arXiv 2507.18071).

    ``s_i = Σ_t d·mask / max(Σ_t mask, 1)`` (no ±20 clamp on d); per token
    ``log r_{i,t} = min(logp_{i,t} - sg(logp_{i,t}) + sg(s_i), 10)``, so ``r`` has the value
    ``exp(min(s_i, 10))`` and the gradient ``r·∇logp_{i,t}`` (zero where capped);
    ``L1 = -A·r``, ``L2 = -A·clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)``, ``L = max(L1, L2)``;
    ``pg_loss = agg(L)`` (every loss_agg_mode; the paper uses seq-mean-token-mean). No dual clip.

    Metrics: ``pg_clipfrac`` = mean_mask([L2 > L1]), ``ppo_kl`` = mean_mask(-d), ``pg_clipfrac_lower`` = 0.
    """
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = (log_ratio * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=GSPO_LOG_RATIO_MAX))
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    pg_loss = agg_loss(_weighted(per_token, rollout_is_weights), mask, loss_agg_mode, **agg_kwargs)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).to(mask.dtype), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
            "pg_clipfrac_lower": _zero(mask),
        }
    return {"pg_loss": pg_loss, **metrics}


@POLICY_LOSSES.register("sapo")
def sapo_policy_loss(
    log_prob,
    old_log_prob,
    advantages,
    response_mask,
    clip_ratio_low=0.2,
    clip_ratio_high=0.2,
    clip_ratio_c=3.0,
    loss_agg_mode="token-mean",
    *,
    config=None,
    rollout_is_weights=None,
    **agg_kwargs,
):
    """SAPO: a smooth sigmoid gate of the ratio (actor.tau_pos / tau_neg) instead of a hard clip; always averaged per
    sequence (seq-mean-token-mean)

    SAPO (soft adaptive gate instead of a hard clip, arXiv 2511.20347).

    ``r = exp(clamp(d, -20, 20))``; ``τ = tau_pos`` where ``A > 0`` and ``tau_neg`` elsewhere (both read from
    ``config``: ``actor.tau_pos`` / ``actor.tau_neg``); gate ``g = sigmoid(τ·(r - 1))·4/τ``; ``L = -g·A``;
    ``pg_loss = agg_loss(L, mask, "seq-mean-token-mean", **agg_kwargs)``: SAPO always averages per
    sequence, whatever ``loss_agg_mode`` says (as verl does). The clip ratios are not used.

    Metrics: ``ppo_kl`` = mean_mask(-clamp(d)); ``pg_clipfrac`` = ``pg_clipfrac_lower`` = 0.
    """
    mask = response_mask.to(log_prob.dtype)
    tau_pos = torch.as_tensor(_setting_get(config, "tau_pos"), dtype=advantages.dtype, device=advantages.device)
    tau_neg = torch.as_tensor(_setting_get(config, "tau_neg"), dtype=advantages.dtype, device=advantages.device)
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, tau_pos, tau_neg)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_loss = agg_loss(_weighted(-gate * advantages, rollout_is_weights), mask, "seq-mean-token-mean", **agg_kwargs)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": _zero(mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
            "pg_clipfrac_lower": _zero(mask),
        }
    return {"pg_loss": pg_loss, **metrics}


@POLICY_LOSSES.register("gpg")
def gpg_policy_loss(
    log_prob,
    old_log_prob,
    advantages,
    response_mask,
    clip_ratio_low=0.2,
    clip_ratio_high=0.2,
    clip_ratio_c=3.0,
    loss_agg_mode="token-mean",
    *,
    config=None,
    rollout_is_weights=None,
    **agg_kwargs,
):
    """GPG: plain policy gradient -A x log-prob, no ratio or clip

    GPG (plain policy gradient, arXiv 2504.02546): ``L = -logp·A``; ``pg_loss = agg(L)``.

    No ratio, no clip; no metrics besides pg_loss (verl logs none for this mode).
    """
    mask = response_mask.to(log_prob.dtype)
    return {
        "pg_loss": agg_loss(_weighted(-log_prob * advantages, rollout_is_weights), mask, loss_agg_mode, **agg_kwargs)
    }


@POLICY_LOSSES.register("clip_cov")
def clip_cov_policy_loss(
    log_prob,
    old_log_prob,
    advantages,
    response_mask,
    clip_ratio_low=0.2,
    clip_ratio_high=0.2,
    clip_ratio_c=3.0,
    loss_agg_mode="token-mean",
    *,
    config=None,
    rollout_is_weights=None,
    **agg_kwargs,
):
    """Clip-Cov: PPO clip, plus no gradient for a random few tokens of high advantage/log-prob covariance
    (policy_loss.clip_cov_ratio / clip_cov_lb / clip_cov_ub)

    Clip-Cov (arXiv 2505.22617): drop the gradient of a few tokens of high covariance.

    ``r = exp(d)`` (no ±20 clamp); ``L1 = -A·r``, ``L2 = -A·clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)``;
    ``cov_{i,t} = (A - mean_mask(A))·(logp - mean_mask(logp))`` over the tokens of this call.
    Candidates: masked tokens with ``L2 ≤ L1`` (not already clipped) and
    ``clip_cov_lb < cov < clip_cov_ub``; ``k = max(floor(clip_cov_ratio·Σmask), 1)``. If there are more
    than k candidates, k of them are chosen uniformly at random (``torch.randperm`` over the
    candidates in row-major order, from torch's global generator, as verl does), else all are.
    ``corr`` = 0 on the chosen tokens and 1 elsewhere; ``L = max(L1, L2)·corr``; ``pg_loss = agg(L)``.
    Settings from ``config``: ``policy_loss.clip_cov_ratio``, ``policy_loss.clip_cov_lb``, ``policy_loss.clip_cov_ub``.

    Metrics: ``pg_clipfrac`` = mean_mask([corr = 0]), ``ppo_kl`` = mean_mask(-d).
    """
    ratio_k = _setting_get(config, "policy_loss.clip_cov_ratio")
    lower, upper = _setting_get(config, "policy_loss.clip_cov_lb"), _setting_get(config, "policy_loss.clip_cov_ub")
    if not ratio_k > 0:
        raise ValueError(f"policy_loss.clip_cov_ratio must be > 0, got {ratio_k}")
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    with torch.no_grad():
        valid = mask > 0
        cov = (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))
        candidate = valid & ~(loss_clipped > loss_unclipped) & (cov > lower) & (cov < upper)
        rows, cols = torch.nonzero(candidate, as_tuple=True)
        budget = max(int(ratio_k * float(mask.sum())), 1)
        if rows.numel() > 0:
            chosen = torch.randperm(rows.numel())[:budget].to(rows.device)
            rows, cols = rows[chosen], cols[chosen]
        corr = torch.ones_like(advantages)
        corr[rows, cols] = 0
    per_token = torch.maximum(loss_unclipped, loss_clipped) * corr
    pg_loss = agg_loss(_weighted(per_token, rollout_is_weights), mask, loss_agg_mode, **agg_kwargs)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((corr == 0).to(mask.dtype), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
        }
    return {"pg_loss": pg_loss, **metrics}


@POLICY_LOSSES.register("kl_cov")
def kl_cov_policy_loss(
    log_prob,
    old_log_prob,
    advantages,
    response_mask,
    clip_ratio_low=0.2,
    clip_ratio_high=0.2,
    clip_ratio_c=3.0,
    loss_agg_mode="token-mean",
    *,
    config=None,
    rollout_is_weights=None,
    **agg_kwargs,
):
    """KL-Cov: unclipped ratio loss, plus a |log-ratio| penalty on the tokens of highest covariance
    (policy_loss.kl_cov_ratio / ppo_kl_coef)

    KL-Cov (arXiv 2505.22617): a KL penalty on the tokens of highest covariance, no clipping.

    ``r = exp(d)`` (no clamp); over the n masked tokens of this call,
    ``cov = (A - mean(A))·(logp - mean(logp))`` (plain means over those tokens); the
    ``k = max(1, floor(n·kl_cov_ratio))`` tokens with the largest cov get ``L = -A·r + ppo_kl_coef·|d|``,
    every other token ``L = -A·r``; ``pg_loss = agg(L)``. The clip ratios are not used.
    Settings from ``config``: ``policy_loss.kl_cov_ratio``, ``policy_loss.ppo_kl_coef``.

    Metrics: ``ppo_kl`` = mean_mask(|d|) (verl logs the absolute log-ratio for this mode).
    """
    ratio_k = _setting_get(config, "policy_loss.kl_cov_ratio")
    coef = _setting_get(config, "policy_loss.ppo_kl_coef")
    if not ratio_k > 0:
        raise ValueError(f"policy_loss.kl_cov_ratio must be > 0, got {ratio_k}")
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    loss_plain = -advantages * torch.exp(log_ratio)
    with torch.no_grad():
        flat_valid = torch.nonzero((mask > 0).reshape(-1), as_tuple=True)[0]
        penalised = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
        if flat_valid.numel() > 0:
            adv = advantages.reshape(-1)[flat_valid]
            logp = log_prob.detach().reshape(-1)[flat_valid]
            cov = (adv - adv.mean()) * (logp - logp.mean())
            count = max(1, int(flat_valid.numel() * ratio_k))
            penalised[flat_valid[torch.topk(cov, count).indices]] = True
        penalised = penalised.reshape(mask.shape)
    per_token = torch.where(penalised, loss_plain + coef * log_ratio.abs(), loss_plain)
    pg_loss = agg_loss(_weighted(per_token, rollout_is_weights), mask, loss_agg_mode, **agg_kwargs)
    with torch.no_grad():
        ppo_kl = masked_mean(log_ratio.abs(), mask)
    return {"pg_loss": pg_loss, "ppo_kl": ppo_kl}


@POLICY_LOSSES.register("geo_mean")
def geo_mean_policy_loss(
    log_prob,
    old_log_prob,
    advantages,
    response_mask,
    clip_ratio_low=0.2,
    clip_ratio_high=0.2,
    clip_ratio_c=3.0,
    loss_agg_mode="token-mean",
    *,
    config=None,
    rollout_is_weights=None,
    global_seqs=None,
    dp_size=1,
    **_agg_kwargs,
):
    """GMPO: the geometric mean of the token ratios per sequence, clipped token-wise

    GMPO (geometric-mean ratio per sequence, arXiv 2507.20673).

    ``d`` unclamped; ``σ = sign(A)``; ``d_c = clamp(d, -clip_ratio_low, clip_ratio_high)``;
    ``m = σ·min(σ·d, σ·d_c)`` (the clip applies only on the side that would grow the objective);
    per row ``n_i = Σ_t mask``, ``ρ_i = exp(Σ_t m·mask / (n_i + 1e-8))``, ``Ā_i = Σ_t A·mask / (n_i + 1e-8)``,
    ``L_i = -Ā_i·ρ_i``. ``pg_loss`` = ``Σ_i L_i / B`` over the B rows of this call, or, with the global
    sequence count of a mini-batch, ``Σ_i L_i / global_seqs · dp_size`` (so micro-batch losses add up to
    the mini-batch mean). ``loss_agg_mode`` is not used (as in verl). verl always divides by the rows
    of the call; the two agree when a call is the whole batch and no row is empty.

    Metrics: ``c = [d ≠ d_c]``; ``pg_clipfrac`` = mean_mask(c·[A > 0]), ``pg_clipfrac_lower`` =
    mean_mask(c·[A < 0]), ``ppo_kl`` = mean_mask(-d).
    """
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    clamped = torch.clamp(log_ratio, -clip_ratio_low, clip_ratio_high)
    kept = sign * torch.minimum(sign * log_ratio, sign * clamped)
    lengths = mask.sum(dim=-1) + GEO_MEAN_EPS
    seq_ratio = torch.exp((kept * mask).sum(dim=-1) / lengths)
    seq_adv = (advantages * mask).sum(dim=-1) / lengths
    seq_loss = -seq_adv * seq_ratio
    if rollout_is_weights is not None:  # a row's weight: the geometric mean of its token weights
        seq_loss = seq_loss * torch.exp((torch.log(rollout_is_weights + GEO_MEAN_IS_EPS) * mask).sum(dim=-1) / lengths)
    pg_loss = seq_loss.mean() if global_seqs is None else seq_loss.sum() / global_seqs * dp_size
    with torch.no_grad():
        clipped = (log_ratio != clamped).to(mask.dtype)
        metrics = {
            "pg_clipfrac": masked_mean(clipped * (advantages > 0).to(mask.dtype), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
            "pg_clipfrac_lower": masked_mean(clipped * (advantages < 0).to(mask.dtype), mask),
        }
    return {"pg_loss": pg_loss, **metrics}


@POLICY_LOSSES.register("cispo")
def cispo_policy_loss(
    log_prob,
    old_log_prob,
    advantages,
    response_mask,
    clip_ratio_low=0.2,
    clip_ratio_high=0.2,
    clip_ratio_c=3.0,
    loss_agg_mode="token-mean",
    *,
    config=None,
    rollout_is_weights=None,
    **agg_kwargs,
):
    """CISPO: -clip(ratio) x A x log-prob with the clipped ratio as a constant weight

    CISPO (clipped importance-sampling weight, arXiv 2506.13585).

    ``r = exp(clamp(d, -20, 20))``; ``w = sg(clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))``;
    ``L = -w·A·logp`` (the gradient flows through logp only, never through the weight); ``pg_loss = agg(L)``.

    Metrics: ``pg_clipfrac`` = mean_mask([r ≠ clip(r)]), ``ppo_kl`` = mean_mask(-clamp(d)), ``pg_clipfrac_lower`` = 0.
    """
    mask = response_mask.to(log_prob.dtype)
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high).detach()
    pg_loss = agg_loss(
        _weighted(-weight * advantages * log_prob, rollout_is_weights), mask, loss_agg_mode, **agg_kwargs
    )
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((ratio != weight).to(mask.dtype), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
            "pg_clipfrac_lower": _zero(mask),
        }
    return {"pg_loss": pg_loss, **metrics}


def _dppo(
    log_prob, old_log_prob, advantages, mask, valid, clip_ratio_c, loss_agg_mode, agg_kwargs, rollout_is_weights=None
):
    """The part DPPO-TV and DPPO-KL share: the truncated weight, the masked loss, the metrics."""
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, max=clip_ratio_c).detach()
    valid = valid.detach().to(mask.dtype)
    pg_loss = agg_loss(
        _weighted(-advantages * weight * log_prob * valid, rollout_is_weights), mask, loss_agg_mode, **agg_kwargs
    )
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean(1.0 - valid, mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
            "pg_clipfrac_lower": masked_mean((ratio > clip_ratio_c).to(mask.dtype) * valid, mask),
        }
    return {"pg_loss": pg_loss, **metrics}


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv_policy_loss(
    log_prob,
    old_log_prob,
    advantages,
    response_mask,
    clip_ratio_low=0.2,
    clip_ratio_high=0.2,
    clip_ratio_c=3.0,
    loss_agg_mode="token-mean",
    *,
    config=None,
    rollout_is_weights=None,
    **agg_kwargs,
):
    """DPPO with a binary total-variation trust region (clip_ratio_low/high are the thresholds; clip_ratio_c truncates
    the weight)

    DPPO, binary total-variation trust region (arXiv 2602.04879).

    Here the clip ratios are divergence thresholds. ``p = exp(logp)``, ``q = exp(old)``,
    ``r = exp(clamp(d, -20, 20))``, truncated weight ``w = sg(min(r, clip_ratio_c))``;
    a token is kept (``v = 1``) when ``p - q ≤ clip_ratio_high`` for ``A > 0``, and when
    ``p - q ≥ -clip_ratio_low`` for ``A ≤ 0``; else ``v = 0``. ``L = -A·w·logp·v``; ``pg_loss = agg(L)``.

    Metrics: ``pg_clipfrac`` = mean_mask(1 - v), ``pg_clipfrac_lower`` = mean_mask([r > clip_ratio_c]·v),
    ``ppo_kl`` = mean_mask(-clamp(d)).
    """
    mask = response_mask.to(log_prob.dtype)
    shift = torch.exp(log_prob) - torch.exp(old_log_prob)
    valid = torch.where(advantages > 0, shift <= clip_ratio_high, shift >= -clip_ratio_low)
    return _dppo(
        log_prob, old_log_prob, advantages, mask, valid, clip_ratio_c, loss_agg_mode, agg_kwargs, rollout_is_weights
    )


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl_policy_loss(
    log_prob,
    old_log_prob,
    advantages,
    response_mask,
    clip_ratio_low=0.2,
    clip_ratio_high=0.2,
    clip_ratio_c=3.0,
    loss_agg_mode="token-mean",
    *,
    config=None,
    rollout_is_weights=None,
    **agg_kwargs,
):
    """DPPO with a binary KL trust region (thresholds and truncation as dppo_tv)

    DPPO, binary KL trust region (arXiv 2602.04879).

    As ``dppo_tv`` but with the binary KL between the old and new probability of the sampled token,
    ``D = q·(old - logp) + (1 - q)·log((1 - q + 1e-8) / (1 - p + 1e-8))``: a token is kept when
    ``D ≤ clip_ratio_high`` or ``p ≤ q`` for ``A > 0``, and when ``D ≤ clip_ratio_low`` or ``p ≥ q`` for
    ``A ≤ 0``. ``L = -A·sg(min(r, clip_ratio_c))·logp·v``; ``pg_loss = agg(L)``; metrics as dppo_tv.
    """
    mask = response_mask.to(log_prob.dtype)
    p, q = torch.exp(log_prob), torch.exp(old_log_prob)
    binary_kl = q * (old_log_prob - log_prob) + (1 - q) * torch.log(
        (1.0 - q + BINARY_KL_EPS) / (1.0 - p + BINARY_KL_EPS)
    )
    valid = torch.where(
        advantages > 0, (binary_kl <= clip_ratio_high) | (p <= q), (binary_kl <= clip_ratio_low) | (p >= q)
    )
    return _dppo(
        log_prob, old_log_prob, advantages, mask, valid, clip_ratio_c, loss_agg_mode, agg_kwargs, rollout_is_weights
    )


@POLICY_LOSSES.register("dro", requires=("policy_loss.dro_beta",))
def dro_policy_loss(
    log_prob,
    old_log_prob,
    advantages,
    response_mask,
    clip_ratio_low=0.2,
    clip_ratio_high=0.2,
    clip_ratio_c=3.0,
    loss_agg_mode="token-mean",
    *,
    config=None,
    rollout_is_weights=None,
    **agg_kwargs,
):
    """DRO: -(A x log-prob - dro_beta/2 x log-ratio^2) (policy_loss.dro_beta)

    DRO (direct reward optimisation with a quadratic log-ratio penalty):
    ``L = -(logp·A - ½·β·d²)`` with ``β = policy_loss.dro_beta`` from ``config`` (must be > 0);
    ``pg_loss = agg(L)``. The clip ratios are not used.

    Metrics: ``ppo_kl`` = mean_mask(-d).
    """
    beta = _setting_get(config, "policy_loss.dro_beta")
    if not beta > 0:
        raise ValueError(f"policy_loss.dro_beta must be > 0 with loss_mode=dro, got {beta}")
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    per_token = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    pg_loss = agg_loss(_weighted(per_token, rollout_is_weights), mask, loss_agg_mode, **agg_kwargs)
    with torch.no_grad():
        ppo_kl = masked_mean(-log_ratio, mask)
    return {"pg_loss": pg_loss, "ppo_kl": ppo_kl}
