"""On-policy distillation losses (verl 0.9.1's `distillation.distillation_loss.*`), as pure tensor functions.

The student samples responses; a frozen teacher scores those very tokens; the student is trained to match the
teacher on its own samples. Notation, per response position t of a row (the token the student sampled is y_t):
``s_t = log π_student(· | y_<t)`` (the student's distribution at the rollout temperature, as every actor
log-prob here), ``q_t = log π_teacher(· | y_<t)`` (the teacher's at temperature 1). Two families of loss modes:

- ``forward_kl_topk`` (`topk` = K): the teacher sends its K most likely tokens and their log-probs at every
  position; the per-token loss is the forward KL restricted to them, ``Σ_{v in topK(q_t)} e^{q_t(v)} (q_t(v) -
  s_t(v))``, clamped at 0 below (the K probabilities of either side need not sum to 1, so the sum can be
  negative). It reads the student's whole distribution (its logits), so every logit gets a gradient.
- the single-sample estimators ``kl``/``k1``, ``abs``, ``mse``/``k2``, ``low_var_kl``/``k3``: the teacher sends
  the log-prob of the sampled token only; with ``d = s_t(y_t) - q_t(y_t)`` the per-token loss is
  `verl_npu.algorithms.kl_penalty(s, q, mode)` (k1: d; abs: |d|; k2: d²/2; k3: e^{-d} + d - 1, clamped), an
  estimate of the reverse KL(student || teacher) from the one sample.

Then (`distillation_term`): ``distillation/loss_min`` / ``loss_max`` are logged, the per-token loss is clamped
to ``[-loss_max_clamp, loss_max_clamp]`` (when set) and either aggregated like the policy loss
(`loss_agg_mode`; a supervised loss, its gradient flows through s) or, with ``use_policy_gradient``, used as a
per-token reward: the vanilla PPO loss with advantages ``-loss`` (detached) and the distillation section's
own clip ratios. Finally (`combine_with_policy_loss`) the actor's loss is ``policy_loss + coef · distill`` with
task rewards (``use_task_rewards``, coef = ``distillation_loss_coef``), else the distillation term alone.

Metric names are verl's: ``distillation/{loss, loss_min, loss_max}``, ``distillation/abs_loss`` (estimators),
``distillation/{student,teacher}_mass{,_min,_max}``, ``distillation/overlap_ratio``,
``distillation/overlap_token_advantage`` (top-k), ``distillation/{pg_clipfrac, ppo_kl, pg_clipfrac_lower}``
(policy gradient). Checked against verl 0.9.1's own functions in tests/algorithms/test_verl_distillation.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from verl_npu.algorithms.core import agg_loss, kl_penalty, masked_mean, policy_loss_fn
from verl_npu.distillation_losses import TOPK_LOSS_MODES

#: the top-k mode: the teacher sends `topk` (token id, log-prob) pairs per position
TOPK_MODES = TOPK_LOSS_MODES
#: the single-sample estimator modes: the teacher sends the log-prob of the sampled token
ESTIMATOR_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
DISTILLATION_LOSS_MODES = TOPK_MODES + ESTIMATOR_MODES
#: the dual-clip bound of the policy-gradient form (the distillation section has no clip_ratio_c; verl uses 3)
DISTILLATION_CLIP_RATIO_C = 3.0
#: metrics that are a minimum / a maximum over tokens (reduced with min / max over micro-batches, not averaged)
MIN_METRICS = ("distillation/loss_min", "distillation/student_mass_min", "distillation/teacher_mass_min")
MAX_METRICS = ("distillation/loss_max", "distillation/student_mass_max", "distillation/teacher_mass_max")
#: a metric that is already a share of the mini-batch (summed over micro-batches)
SUMMED_METRICS = ("distillation/loss",)


def uses_topk(loss_mode: str) -> bool:
    """Whether `loss_mode` needs the teacher's top-k tokens (else the log-prob of the sampled token)."""
    if loss_mode not in DISTILLATION_LOSS_MODES:
        raise ValueError(
            f"unknown distillation loss_mode {loss_mode!r}; choose one of: {', '.join(DISTILLATION_LOSS_MODES)}"
        )
    return loss_mode in TOPK_MODES


class TopkKL(NamedTuple):
    """Per-token results of `forward_kl_topk_per_token`, each [B, T]."""

    losses: torch.Tensor  # Σ_k p_k (q_k - s_k) over the teacher's top-k (not yet clamped at 0)
    student_mass: torch.Tensor  # Σ_k e^{s_k}: the student's probability of the teacher's top-k tokens
    teacher_mass: torch.Tensor  # Σ_k e^{q_k}: the teacher's probability of its own top-k tokens
    overlap_count: torch.Tensor  # how many of the teacher's top-k are among the student's own top-k
    overlap_token_advantage: torch.Tensor  # mean of -p_k (q_k - s_k) over those shared tokens (0 when none)


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def forward_kl_topk_per_token(
    student_logits: torch.Tensor,
    teacher_topk_log_probs: torch.Tensor,
    teacher_topk_ids: torch.Tensor,
    log_prob_min_clamp: float | None = None,
) -> TopkKL:
    """The top-k forward KL from the teacher to the student at every position.

    ``student_logits`` [B, T, V] (already divided by the sampling temperature), ``teacher_topk_log_probs`` and
    ``teacher_topk_ids`` [B, T, K] (the teacher's K most likely tokens and their log-probs). With ``s =
    log_softmax(student_logits)`` gathered at the teacher's ids (``s_k``) and ``q_k`` the teacher's log-probs:
    ``student_mass = Σ_k e^{s_k}``, ``teacher_mass = Σ_k e^{q_k}`` (both before any clamp); then with
    ``log_prob_min_clamp`` = c both ``s_k`` and ``q_k`` are raised to at least c, and ``losses = Σ_k e^{q_k}
    (q_k - s_k)`` (float32 or wider). The overlap diagnostics: ``overlap_count`` = how many of the teacher's ids
    are among the student's own K most likely tokens, ``overlap_token_advantage`` = ``Σ_{k shared} -e^{q_k}
    (q_k - s_k) / count`` (0 where nothing is shared).
    """
    student_log_probs = torch.log_softmax(student_logits, dim=-1)
    k = teacher_topk_ids.shape[-1]
    student_topk_ids = torch.topk(student_log_probs, k=k, dim=-1).indices
    s = torch.gather(student_log_probs, -1, teacher_topk_ids.long())
    q = teacher_topk_log_probs
    student_mass = s.exp().sum(-1)
    teacher_mass = q.exp().sum(-1)
    if log_prob_min_clamp is not None:
        s = s.clamp_min(log_prob_min_clamp)
        q = q.clamp_min(log_prob_min_clamp)
    s, q = _at_least_float32(s), _at_least_float32(q)
    per_id = q.exp() * (q - s)
    shared = (teacher_topk_ids.unsqueeze(-1) == student_topk_ids.unsqueeze(-2)).any(-1)
    count = shared.sum(-1)
    advantage = (-per_id * shared).sum(-1) / count.clamp_min(1)
    advantage = torch.where(count > 0, advantage, torch.zeros_like(advantage))
    return TopkKL(per_id.sum(-1), student_mass, teacher_mass, count, advantage)


def topk_metrics(out: TopkKL, response_mask: torch.Tensor, topk: int) -> dict[str, float]:
    """The top-k mode's metrics over the response tokens (``response_mask`` > 0): the masses' mean / min /
    max (``distillation/student_mass``, ``_min``, ``_max``; the same for ``teacher_mass``),
    ``distillation/overlap_ratio`` = mean overlap count / ``topk``, ``distillation/overlap_token_advantage`` =
    mean overlap advantage over the response tokens with a shared token (0 when there is none)."""
    on = response_mask.bool()
    metrics: dict[str, float] = {}
    for name, mass in (("student_mass", out.student_mass), ("teacher_mass", out.teacher_mass)):
        values = mass[on].detach()
        metrics[f"distillation/{name}"] = float(values.mean())
        metrics[f"distillation/{name}_min"] = float(values.min())
        metrics[f"distillation/{name}_max"] = float(values.max())
    count = out.overlap_count[on]
    metrics["distillation/overlap_ratio"] = float(count.float().mean() / topk)
    with_overlap = on & (out.overlap_count > 0)
    metrics["distillation/overlap_token_advantage"] = (
        float(out.overlap_token_advantage[with_overlap].detach().mean()) if with_overlap.any() else 0.0
    )
    return metrics


def topk_losses(out: TopkKL) -> torch.Tensor:
    """The top-k mode's per-token loss: `out.losses` clamped at 0 below (a partial sum can be negative)."""
    return out.losses.clamp_min(0.0)


def estimator_per_token(
    student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, loss_mode: str, response_mask: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """A single-sample estimator's per-token loss ``kl_penalty(student, teacher, loss_mode)`` [B, T] (see
    `verl_npu.algorithms.kl_penalty`: the log-probs of the sampled tokens) and its metric
    ``distillation/abs_loss`` = mean |loss| over the response tokens (k1 can be negative)."""
    losses = kl_penalty(student_log_probs, teacher_log_probs, loss_mode)
    on = response_mask.bool()
    return losses, {"distillation/abs_loss": float(losses[on].detach().abs().mean())}


def distillation_term(
    per_token: torch.Tensor,
    response_mask: torch.Tensor,
    loss_cfg: Any,
    loss_agg_mode: str,
    *,
    log_prob: torch.Tensor | None = None,
    old_log_prob: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **agg: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The distillation loss of one micro-batch from its per-token loss ``per_token`` [B, T].

    ``loss_cfg`` is the `distillation_loss` section (loss_max_clamp, use_policy_gradient, policy_loss_mode,
    clip_ratio, clip_ratio_low, clip_ratio_high). Metrics: ``distillation/loss_min`` / ``loss_max`` of
    ``per_token`` over the response tokens (before the clamp). With ``loss_max_clamp`` = m,
    ``L = clamp(per_token, -m, m)``. Without ``use_policy_gradient``: ``agg_loss(L, mask, loss_agg_mode, **agg)``
    (``agg``: the global token / sequence counts, as for the policy loss). With it: the policy loss
    ``policy_loss_mode`` (verl 0.9.1 allows vanilla only: dual-clip PPO, dual clip 3) of ``log_prob`` against
    ``old_log_prob`` with advantages ``-L`` (detached), clip ratios ``clip_ratio_low`` / ``clip_ratio_high``
    (each ``clip_ratio`` when null) and the rollout-correction weights, plus its metrics as
    ``distillation/pg_clipfrac``, ``distillation/ppo_kl``, ``distillation/pg_clipfrac_lower``.
    """
    on = response_mask.bool()
    values = per_token[on].detach()
    metrics = {"distillation/loss_min": float(values.min()), "distillation/loss_max": float(values.max())}
    bound = loss_cfg.loss_max_clamp
    losses = per_token if bound is None else per_token.clamp(min=-bound, max=bound)
    if not loss_cfg.use_policy_gradient:
        return agg_loss(losses, response_mask, loss_agg_mode, **agg), metrics
    if log_prob is None or old_log_prob is None:
        raise ValueError("distillation with use_policy_gradient needs log_prob and old_log_prob")
    low = loss_cfg.clip_ratio_low if loss_cfg.clip_ratio_low is not None else loss_cfg.clip_ratio
    high = loss_cfg.clip_ratio_high if loss_cfg.clip_ratio_high is not None else loss_cfg.clip_ratio
    pg = policy_loss_fn(loss_cfg.policy_loss_mode)(
        log_prob,
        old_log_prob,
        -losses.detach(),
        response_mask,
        low,
        high,
        DISTILLATION_CLIP_RATIO_C,
        loss_agg_mode,
        rollout_is_weights=rollout_is_weights,
        **agg,
    )
    metrics.update({f"distillation/{k}": float(v) for k, v in pg.items() if k != "pg_loss"})
    return pg["pg_loss"], metrics


def combine_with_policy_loss(
    policy_loss: torch.Tensor | float, distill_loss: torch.Tensor, loss_cfg: Any
) -> torch.Tensor:
    """The actor's loss: with ``use_task_rewards``, ``policy_loss + distillation_loss_coef · distill_loss``
    (``policy_loss``: the whole PPO loss of the task rewards, entropy and KL terms included); without,
    ``distill_loss`` alone (coefficient 1, nothing of the task rewards)."""
    if loss_cfg.use_task_rewards:
        return policy_loss + loss_cfg.distillation_loss_coef * distill_loss
    return distill_loss


def response_topk(teacher_logits: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's side of the top-k mode: (log-probs, ids) [.., K] of the ``topk`` most likely tokens of
    ``log_softmax(teacher_logits)`` (temperature 1), in float32 or wider."""
    log_probs = torch.log_softmax(_at_least_float32(teacher_logits), dim=-1)
    values, ids = torch.topk(log_probs, k=topk, dim=-1)
    return values, ids


def per_token_kl_to_teacher(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """Diagnostics (not a verl loss): the exact reverse KL(student || teacher) per row, ``Σ_v p_s (log p_s -
    log p_t)`` averaged over the row's response tokens [B]; what distillation drives down."""
    s = torch.log_softmax(_at_least_float32(student_logits), dim=-1)
    t = torch.log_softmax(_at_least_float32(teacher_logits), dim=-1)
    kl = (s.exp() * (s - t)).sum(-1)
    return masked_mean(kl, response_mask.to(kl.dtype), dim=-1)
