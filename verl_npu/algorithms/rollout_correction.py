"""Rollout correction (verl 0.9.1's `algorithm.rollout_correction`): truncated importance weights and rejection
masks for the gap between the policy that sampled the responses (the rollout engine's log-probs) and the
policy being trained, plus the off-policy diagnostics, with verl's metric names.

Notation: ``mask`` the response mask [B, T]; ``d = old - rollout`` the per-token log-ratio
``log(π_train / π_rollout)`` (in bypass mode, the current policy's log-probs take the place of ``old``);
``c(x) = clamp(x, -20, 20)`` (``SAFETY_BOUND``); ``mean_m(x)`` = ``Σ x·mask / (Σ mask + 1e-8)`` over the
whole batch and ``mean_m(x)_i`` the same over row i (values outside the mask never count, even inf or
NaN); ``S_i = Σ_t d·mask`` a row's summed log-ratio; "valid rows" are rows with at least one token.
Every returned weight and mask is detached. Metric values are Python floats.

- ``rollout_is_weights`` (`rollout_is`, `rollout_is_threshold`, `rollout_is_batch_normalize`),
- ``rollout_rejection_mask`` (`rollout_rs`, `rollout_rs_threshold`),
- ``rollout_offpolicy_metrics`` (always logged when the rollout's log-probs exist),
- ``rollout_correction``: the three together, metrics prefixed ``rollout_corr/`` as verl logs them.

Each mode a config key names (an importance-weight level of ``rollout_is``, a rejection option of ``rollout_rs``,
a ``loss_type`` of bypass mode) is declared here with ``@ROLLOUT_CORRECTIONS.register`` (``verl_npu.registry``), so
the config validates the names and reads what each mode does without importing torch; the threshold parsing is
shared with the config (``verl_npu.rollout_corrections``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from verl_npu.algorithms.core import agg_loss, masked_mean, ppo_policy_loss
from verl_npu.registry import POLICY_LOSSES, ROLLOUT_CORRECTIONS, correction_mode, correction_modes
from verl_npu.rollout_corrections import parse_is_threshold, parse_rs_options, parse_rs_thresholds

SAFETY_BOUND = 20.0
METRIC_PREFIX = "rollout_corr/"


def _msum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    kept = torch.where(mask.bool(), values, torch.zeros_like(values)) * mask
    return kept.sum() if dim is None else kept.sum(dim=dim)


def _mmean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return _msum(values, mask, dim) / (count + 1e-8)


def _masked_extreme(values: torch.Tensor, mask: torch.Tensor, largest: bool) -> float:
    fill = float("-inf") if largest else float("inf")
    filled = values.masked_fill(~mask.bool(), fill)
    return float(filled.max() if largest else filled.min())


def _check_inputs(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> None:
    if log_ratio.shape != response_mask.shape:
        raise ValueError(
            f"log_ratio {tuple(log_ratio.shape)} and response_mask {tuple(response_mask.shape)} "
            "must have the same shape"
        )
    if not bool(response_mask.bool().any()):
        raise ValueError("response_mask has no valid token")


# ----------------------------------------------------------------------------- importance weights


@ROLLOUT_CORRECTIONS.register(
    "token",
    option="rollout_is",
    per_token=True,
    doc="one weight per token, exp(log-ratio) truncated (biased, low variance)",
)
def token_level_weights(log_ratio: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(statistic, raw weights) of the token level: ``d`` and ``exp(c(d))``, per token."""
    return log_ratio, torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))


@ROLLOUT_CORRECTIONS.register(
    "sequence",
    option="rollout_is",
    per_token=False,
    doc="one weight per response, exp(sum of its token log-ratios) truncated, on every token (unbiased, high variance)",
)
def sequence_level_weights(log_ratio: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(statistic, raw weights) of the sequence level: ``S_i`` [B] and ``exp(c(S_i))`` on each token of row i."""
    stat = _msum(log_ratio, mask, dim=-1)  # S_i, [B]
    return stat, torch.exp(torch.clamp(stat, -SAFETY_BOUND, SAFETY_BOUND)).unsqueeze(-1).expand_as(log_ratio)


def rollout_is_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    threshold: float | str = 2.0,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights ``w`` [B, T] (0 on padding) and their metrics.

    Raw weights: ``level="token"``: ``ρ = exp(c(d))·mask``; ``level="sequence"``: ``ρ_{i,t} = exp(c(S_i))·mask``.
    ``threshold`` U (a number): TIS, ``w = min(ρ, U)``; ``"L_U"``: IcePop, ``w = ρ`` where ``L ≤ ρ ≤ U``, else 0.
    ``batch_normalize``: ``w / μ`` with μ = ``mean_m(w)`` (token) or the mean over valid rows of
    ``mean_m(w)_i`` (sequence), applied only when μ > 1e-8 (``rollout_is_batch_norm_factor`` = μ, else 1).

    Metrics (``L`` defaults to 1/U when not given): ``rollout_is_mean`` = mean_m(w) (before normalising);
    token level: ``rollout_is_max/min`` over masked w, ``rollout_is_ratio_fraction_high/low`` = mean_m([ρ > U]),
    mean_m([ρ < L]); sequence level: ``rollout_is_max`` = exp(min(max_i S_i, 20)), ``rollout_is_min`` =
    exp(min_i S_i), fractions = the share of all rows with ``S_i > log U`` / ``S_i < log L``;
    ``rollout_is_std`` = sqrt(max(mean_m(w'²) - mean_m(w')², 0)) with ``w' = clamp(w, 0, U)`` (0 for a single
    token); ``rollout_is_eff_sample_size`` = 1 / mean_m((w' / (mean_m(w') + 1e-8))²);
    per row ``s_i = mean_m(w)_i`` over all rows: ``rollout_is_seq_mean/std/max/min`` (std unbiased, 0 for one
    row), ``rollout_is_seq_max_deviation`` = max |s_i - 1|, ``rollout_is_seq_fraction_high/low`` = share of rows
    with ``mean_m(ρ)_i > U`` / ``< L``; IcePop: ``rollout_is_oob_ratio`` = mean_m([ρ < L or ρ > U]).
    """
    per_token = correction_mode("rollout_is", level).per_token
    _check_inputs(log_ratio, response_mask)
    upper, lower = parse_is_threshold(threshold)
    log_ratio = log_ratio.detach()
    mask = response_mask.to(log_ratio.dtype)
    stat, raw = ROLLOUT_CORRECTIONS.load(level)(log_ratio, mask)
    raw = raw * mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    metrics = _is_metrics(weights, raw, stat, mask, per_token, upper, lower)
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = float(_mmean(((raw < lower) | (raw > upper)).to(mask.dtype), mask))
    if batch_normalize:
        if per_token:
            mean = _mmean(weights, mask)
        else:
            valid = (mask.sum(dim=-1) > 0).to(weights.dtype)
            mean = (_mmean(weights, mask, dim=-1) * valid).sum() / valid.sum().clamp_min(1e-8)
        if float(mean) > 1e-8:
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = float(mean)
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights, metrics


def _is_metrics(weights, raw, stat, mask, per_token, upper, lower) -> dict[str, float]:
    low = 1.0 / upper if lower is None else lower
    m: dict[str, float] = {"rollout_is_mean": float(_mmean(weights, mask))}
    if not per_token:
        m["rollout_is_max"] = math.exp(min(float(stat.max()), SAFETY_BOUND))
        m["rollout_is_min"] = math.exp(float(stat.min()))
        # the thresholds in log space, as float32 logs (what verl compares with)
        log_u = float(torch.log(torch.tensor(upper)))
        log_l = float(torch.log(torch.tensor(low)))
        m["rollout_is_ratio_fraction_high"] = float((stat > log_u).float().mean())
        m["rollout_is_ratio_fraction_low"] = float((stat < log_l).float().mean())
    else:
        m["rollout_is_ratio_fraction_high"] = float(_mmean((raw > upper).to(mask.dtype), mask))
        m["rollout_is_ratio_fraction_low"] = float(_mmean((raw < low).to(mask.dtype), mask))
        m["rollout_is_max"] = _masked_extreme(weights, mask, largest=True)
        m["rollout_is_min"] = _masked_extreme(weights, mask, largest=False)
    capped = weights.clamp(min=0.0, max=upper)
    mean_capped = _mmean(capped, mask)
    if float(mask.sum()) > 1:
        var = _mmean(capped.square(), mask) - mean_capped.square()
        m["rollout_is_std"] = float(torch.sqrt(torch.clamp(var, min=0.0)))
    else:
        m["rollout_is_std"] = 0.0
    m["rollout_is_eff_sample_size"] = 1.0 / float(_mmean((capped / (mean_capped + 1e-8)).square(), mask))
    seq = _mmean(weights, mask, dim=-1)
    m["rollout_is_seq_mean"] = float(seq.mean())
    m["rollout_is_seq_std"] = float(seq.std()) if seq.numel() > 1 else 0.0
    m["rollout_is_seq_max"] = float(seq.max())
    m["rollout_is_seq_min"] = float(seq.min())
    m["rollout_is_seq_max_deviation"] = float((seq - 1.0).abs().max())
    raw_seq = _mmean(raw, mask, dim=-1)
    m["rollout_is_seq_fraction_high"] = float((raw_seq > upper).float().mean())
    m["rollout_is_seq_fraction_low"] = float((raw_seq < low).float().mean())
    return m


# ----------------------------------------------------------------------------- rejection

_RS = "rollout_rs"


def _broadcast_rows(row_stat: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return row_stat.unsqueeze(-1).expand_as(mask), row_stat


# The rejection options: the statistic (k1, k2, k3 of each token) and how a token or a response is judged by it.
# Each function gives (stat [B, T], row values [B] or None for a token option).
@ROLLOUT_CORRECTIONS.register("token_k1", option=_RS, statistic="k1", per_token=True)
@ROLLOUT_CORRECTIONS.register("token_k2", option=_RS, statistic="k2", per_token=True)
@ROLLOUT_CORRECTIONS.register("token_k3", option=_RS, statistic="k3", per_token=True)
def token_statistic(values: torch.Tensor, mask: torch.Tensor, valid_token: torch.Tensor):
    """per token, the token's own value"""
    return values, None


@ROLLOUT_CORRECTIONS.register("seq_sum_k1", option=_RS, statistic="k1")
@ROLLOUT_CORRECTIONS.register("seq_sum_k2", option=_RS, statistic="k2")
@ROLLOUT_CORRECTIONS.register("seq_sum_k3", option=_RS, statistic="k3")
def sequence_sum_statistic(values: torch.Tensor, mask: torch.Tensor, valid_token: torch.Tensor):
    """per response, the sum over its tokens"""
    return _broadcast_rows(_msum(values, mask, dim=-1), mask)


@ROLLOUT_CORRECTIONS.register("seq_mean_k1", option=_RS, statistic="k1")
@ROLLOUT_CORRECTIONS.register("seq_mean_k2", option=_RS, statistic="k2")
@ROLLOUT_CORRECTIONS.register("seq_mean_k3", option=_RS, statistic="k3")
def sequence_mean_statistic(values: torch.Tensor, mask: torch.Tensor, valid_token: torch.Tensor):
    """per response, the mean over its tokens"""
    return _broadcast_rows(_mmean(values, mask, dim=-1), mask)


@ROLLOUT_CORRECTIONS.register("seq_max_k2", option=_RS, statistic="k2")
@ROLLOUT_CORRECTIONS.register("seq_max_k3", option=_RS, statistic="k3")
def sequence_max_statistic(values: torch.Tensor, mask: torch.Tensor, valid_token: torch.Tensor):
    """per response, the largest over its tokens"""  # 0 for an empty response
    top = values.masked_fill(~valid_token, float("-inf")).max(dim=-1).values
    return _broadcast_rows(torch.where(top == float("-inf"), torch.zeros_like(top), top), mask)


def rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    options: str = "token_k1",
    thresholds: float | str | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The response mask with rejected tokens set to 0 (same dtype as ``response_mask``), and the metrics.

    ``options``: comma-separated `rollout_rs` options (duplicates dropped); a token is kept only when every
    option keeps it. With ``x = c(d)``: ``k1 = -x``, ``k2 = x²/2``, ``k3 = exp(x) - 1 - x`` per token.
    ``token_kN`` judges each token by its own kN; ``seq_sum_kN`` / ``seq_mean_kN`` / ``seq_max_kN`` judge a
    whole response by the masked sum / mean (``mean_m(kN)_i``) / maximum (0 for an empty row) of kN over its
    tokens. k1 statistics are kept when ``log(L) ≤ stat ≤ log(U)``, k2/k3 ones when ``stat ≤ U``, with
    ``thresholds`` as ``verl_npu.rollout_corrections.parse_rs_thresholds`` reads them.

    Metrics, per option o (prefix ``rollout_rs_<o>_``; "stat" is the per-token value, a row's value
    broadcast for sequence options; "row values" are the per-row statistic over valid rows, for token options
    ``mean_m(stat)_i``; thresholds ``hi`` = log U for k1 else U, ``lo`` = log L for k1 else 0):
    ``mean`` = mean_m(stat); ``max`` / ``min`` over the row values (sequence options) or the masked stat
    (token options); ``fraction_high`` / ``fraction_low`` = share of row values (sequence options) or masked
    tokens (token options) above hi / below lo (fraction_low 0 for k2/k3); ``std`` = masked std of
    ``clamp(stat, lo, hi)`` (0 for a single token); ``seq_mean`` / ``seq_std`` (unbiased) / ``seq_max`` /
    ``seq_min`` / ``seq_max_deviation`` (max |value|) / ``seq_fraction_high`` (> hi) of the row values, and
    ``seq_fraction_low`` (< lo) for k1 options; ``masked_fraction`` = mean_m(rejected by o),
    ``seq_masked_fraction`` = share of valid rows with a token rejected by o. Overall:
    ``rollout_rs_masked_fraction`` = mean_m(rejected), ``rollout_rs_seq_masked_fraction`` = share of all rows
    with a rejected token.
    """
    _check_inputs(log_ratio, response_mask)
    names = parse_rs_options(options)
    limits = parse_rs_thresholds(names, thresholds)
    log_ratio = log_ratio.detach()
    mask = response_mask.to(log_ratio.dtype)
    valid_token = response_mask.bool()
    valid_row = mask.sum(dim=-1) > 0
    x = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    per_token = {"k1": -x, "k2": 0.5 * x.square(), "k3": torch.exp(x) - 1.0 - x}
    keep_all = torch.ones_like(mask)
    metrics: dict[str, float] = {}
    for name in names:
        upper, lower = limits[name]
        spec = ROLLOUT_CORRECTIONS.spec(name)
        is_k1 = spec.ratio_bounds
        hi = math.log(upper) if is_k1 else upper
        lo = math.log(lower) if is_k1 else 0.0
        stat, row_stat = ROLLOUT_CORRECTIONS.load(name)(per_token[spec.statistic], mask, valid_token)
        keep = stat <= hi
        if is_k1:
            keep = keep & (stat >= lo)
        keep_f = keep.to(mask.dtype)
        keep_all = keep_all * keep_f
        metrics.update(_rs_metrics(name, stat, row_stat, mask, valid_row, hi, lo, is_k1))
        metrics[f"rollout_rs_{name}_masked_fraction"] = float(_mmean(1.0 - keep_f, mask))
        row_kept = (~(~keep & valid_token)).all(dim=-1)
        rows = valid_row.to(mask.dtype)
        metrics[f"rollout_rs_{name}_seq_masked_fraction"] = (
            float(((1.0 - row_kept.to(mask.dtype)) * rows).sum() / rows.sum()) if float(rows.sum()) > 0 else 0.0
        )
    metrics["rollout_rs_masked_fraction"] = float(_mmean(1.0 - keep_all, mask))
    rejected_row = (~((keep_all > 0.5) & valid_token) & valid_token).any(dim=-1)
    metrics["rollout_rs_seq_masked_fraction"] = float(rejected_row.float().mean())
    return (response_mask * keep_all).to(response_mask.dtype), metrics


def _rs_metrics(name, stat, row_stat, mask, valid_row, hi, lo, is_k1) -> dict[str, float]:
    p = f"rollout_rs_{name}_"
    rows = (row_stat if row_stat is not None else _mmean(stat, mask, dim=-1))[valid_row]
    m = {p + "mean": float(_mmean(stat, mask))}
    if row_stat is not None:
        m[p + "max"], m[p + "min"] = float(rows.max()), float(rows.min())
        m[p + "fraction_high"] = float((rows > hi).float().mean())
        m[p + "fraction_low"] = float((rows < lo).float().mean()) if is_k1 else 0.0
    else:
        m[p + "max"] = _masked_extreme(stat, mask, largest=True)
        m[p + "min"] = _masked_extreme(stat, mask, largest=False)
        m[p + "fraction_high"] = float(_mmean((stat > hi).to(mask.dtype), mask))
        m[p + "fraction_low"] = float(_mmean((stat < lo).to(mask.dtype), mask)) if is_k1 else 0.0
    if float(mask.sum()) > 1:
        clamped = stat.clamp(min=lo, max=hi)
        var = _mmean(clamped.square(), mask) - _mmean(clamped, mask).square()
        m[p + "std"] = float(torch.sqrt(torch.clamp(var, min=0.0)))
    else:
        m[p + "std"] = 0.0
    m[p + "seq_mean"] = float(rows.mean())
    m[p + "seq_std"] = float(rows.std()) if rows.numel() > 1 else 0.0
    m[p + "seq_max"], m[p + "seq_min"] = float(rows.max()), float(rows.min())
    m[p + "seq_max_deviation"] = float(rows.abs().max())
    m[p + "seq_fraction_high"] = float((rows > hi).float().mean())
    if is_k1:
        m[p + "seq_fraction_low"] = float((rows < lo).float().mean())
    return m


# ----------------------------------------------------------------------------- diagnostics


def rollout_offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None, response_mask: torch.Tensor
) -> dict[str, float]:
    """The off-policy diagnostics verl logs (names without the ``rollout_corr/`` prefix).

    Per row ``a_i = mean_m(old)_i``, ``r_i = mean_m(rollout)_i``, ``g_i = r_i - a_i``; means over all rows:
    ``training_ppl`` = mean exp(-a_i), ``training_log_ppl`` = mean(-a_i); with rollout log-probs also
    ``kl`` = mean_m(rollout - old), ``k3_kl`` = mean_m(exp(d) - d - 1) (d unclamped),
    ``rollout_ppl`` = mean exp(-r_i), ``rollout_log_ppl`` = mean(-r_i), ``log_ppl_diff`` = mean g_i,
    ``log_ppl_abs_diff`` = mean |g_i|, ``log_ppl_diff_max`` / ``_min`` = max / min g_i,
    ``ppl_ratio`` = mean exp(g_i), ``chi2_token`` = mean_m(exp(c(d))²) - 1,
    ``chi2_seq`` = mean exp(2·c(S_i)) - 1.
    """
    if not bool(response_mask.bool().any()):
        raise ValueError("response_mask has no valid token")
    old = old_log_prob.detach()
    mask = response_mask.to(old.dtype)
    train_mean = _mmean(old, mask, dim=-1)
    m = {"training_ppl": float(torch.exp(-train_mean).mean()), "training_log_ppl": float((-train_mean).mean())}
    if rollout_log_prob is None:
        return m
    rollout = rollout_log_prob.detach().to(old.dtype)
    d = old - rollout
    m["kl"] = float(_mmean(rollout - old, mask))
    m["k3_kl"] = float(_mmean(torch.exp(d) - d - 1, mask))
    roll_mean = _mmean(rollout, mask, dim=-1)
    m["rollout_ppl"] = float(torch.exp(-roll_mean).mean())
    m["rollout_log_ppl"] = float((-roll_mean).mean())
    gap = roll_mean - train_mean
    m["log_ppl_diff"] = float(gap.mean())
    m["log_ppl_abs_diff"] = float(gap.abs().mean())
    m["log_ppl_diff_max"] = float(gap.max())
    m["log_ppl_diff_min"] = float(gap.min())
    m["ppl_ratio"] = float(torch.exp(gap).mean())
    m["chi2_token"] = float(_mmean(torch.exp(torch.clamp(d, -SAFETY_BOUND, SAFETY_BOUND)).square(), mask)) - 1.0
    row_sum = torch.clamp(_msum(d, mask, dim=-1), -SAFETY_BOUND, SAFETY_BOUND)
    m["chi2_seq"] = float(torch.exp(2.0 * row_sum).mean()) - 1.0
    return m


@dataclass
class RolloutCorrection:
    """What ``rollout_correction`` gives: the IS weights (None without ``rollout_is``), the response mask with
    the rejected tokens removed (a copy of the input without ``rollout_rs``), and the ``rollout_corr/`` metrics."""

    weights: torch.Tensor | None
    response_mask: torch.Tensor
    metrics: dict[str, float]


def rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    rollout_is: str | None = None,
    rollout_is_threshold: float | str | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
) -> RolloutCorrection:
    """Weights (``rollout_is_weights`` with ``d = old - rollout``, when ``rollout_is`` and its threshold are
    set), rejection (``rollout_rejection_mask``, when ``rollout_rs`` is set) and ``rollout_offpolicy_metrics``,
    every metric name prefixed ``rollout_corr/``. The keyword names are the config keys'."""
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob "
            f"{tuple(rollout_log_prob.shape)} and response_mask {tuple(response_mask.shape)} differ"
        )
    if not bool(response_mask.bool().any()):
        raise ValueError("response_mask has no valid token")
    log_ratio = (old_log_prob - rollout_log_prob).detach()
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = rollout_is_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    mask = response_mask.clone()
    if rollout_rs is not None:
        if rollout_rs_threshold is None:
            raise ValueError("rollout_rs is set but rollout_rs_threshold is null")
        mask, rs_metrics = rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(rollout_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return RolloutCorrection(weights, mask, {METRIC_PREFIX + k: v for k, v in metrics.items()})


# ----------------------------------------------------------------------------- bypass mode

_correct = rollout_correction  # the bypass loss's keyword of the same name hides the function


@dataclass
class BypassLossInputs:
    """What a bypass-mode ``loss_type`` reads: the policy loss's arguments, ``mask`` the correction's response
    mask (rejected tokens removed) and ``weights`` its IS weights (None without ``rollout_is``)."""

    log_prob: torch.Tensor
    old_log_prob: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    weights: torch.Tensor | None
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    loss_agg_mode: str
    config: object
    agg_kwargs: dict


@ROLLOUT_CORRECTIONS.register(
    "ppo_clip",
    option="loss_type",
    doc="the dual-clip PPO loss with the rollout's log-probs as the old policy (no IS "
    "weights applied: the ratio is the importance weight)",
)
def _ppo_clip_bypass_loss(x: BypassLossInputs) -> dict:
    """``ppo_policy_loss(logp, old_log_prob, A, m, ...)``; the weights are not applied."""
    return ppo_policy_loss(
        x.log_prob,
        x.old_log_prob,
        x.advantages,
        x.mask,
        x.clip_ratio_low,
        x.clip_ratio_high,
        x.clip_ratio_c,
        x.loss_agg_mode,
        config=x.config,
        **x.agg_kwargs,
    )


@ROLLOUT_CORRECTIONS.register(
    "reinforce",
    option="loss_type",
    doc="-w x A x log-prob with the truncated IS weights w (rollout_is) as constants, no ratio or clip",
)
def _reinforce_bypass_loss(x: BypassLossInputs) -> dict:
    """``L = -A·logp·w`` (``-A·logp`` without weights) aggregated over ``m``, and ``ppo_kl`` = mean_m(old - logp)."""
    per_token = -x.advantages * x.log_prob
    if x.weights is not None:
        per_token = per_token * x.weights
    with torch.no_grad():
        ppo_kl = masked_mean(x.old_log_prob - x.log_prob.detach(), x.mask)
    return {"pg_loss": agg_loss(per_token, x.mask, x.loss_agg_mode, **x.agg_kwargs), "ppo_kl": ppo_kl}


@POLICY_LOSSES.register("bypass_mode", rollout_correction=True)
def bypass_mode_policy_loss(
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
    rollout_correction=None,
    **agg_kwargs,
):
    """rollout correction's bypass mode: the rollout engine's log-probs as the old policy (no old-log-prob pass), IS
    weights and rejection from algorithm.rollout_correction.*, the loss by its loss_type (ppo_clip or reinforce);
    selected by algorithm.rollout_correction.bypass_mode

    verl's ``bypass_mode`` policy loss: the rollout engine's log-probs are the old policy (``old_log_prob``
    here *is* the rollout's), so no old-log-prob pass runs, and the correction is computed per call from the
    current policy: ``RC = rollout_correction(sg(logp), old_log_prob, mask, **settings)``, with
    ``settings`` = ``rollout_correction`` (the typed `algorithm.rollout_correction` section). ``m`` = RC's response mask
    (rejected tokens removed), ``w`` = RC's weights. By ``settings.loss_type``:

    - ``ppo_clip``: ``ppo_policy_loss(logp, old_log_prob, A, m, ...)``: the ratio is the importance weight,
      so ``w`` is computed for its metrics only (pg_clipfrac, ppo_kl, pg_clipfrac_lower as vanilla logs them);
    - ``reinforce``: ``L = -A·logp·w`` (``-A·logp`` without ``rollout_is``), ``pg_loss = agg_loss(L, m,
      loss_agg_mode, **agg_kwargs)``, ``ppo_kl`` = mean_m(old_log_prob - logp) over ``m``.

    ``rollout_is_weights`` (precomputed ones) is ignored, as in verl. Returns the loss's entries plus RC's
    ``rollout_corr/...`` metrics.
    """
    settings = rollout_correction
    if settings is None:
        raise ValueError("loss_mode=bypass_mode needs the rollout_correction settings (algorithm.rollout_correction)")
    loss_type = settings.loss_type
    with torch.no_grad():
        corr = _correct(
            log_prob.detach(),
            old_log_prob,
            response_mask,
            rollout_is=settings.rollout_is,
            rollout_is_threshold=settings.rollout_is_threshold,
            rollout_is_batch_normalize=settings.rollout_is_batch_normalize,
            rollout_rs=settings.rollout_rs,
            rollout_rs_threshold=settings.rollout_rs_threshold,
        )
    mask = corr.response_mask.to(log_prob.dtype)
    if str(loss_type) not in correction_modes("loss_type"):
        raise ValueError(
            f"rollout_correction.loss_type must be {' or '.join(correction_modes('loss_type'))}, got {loss_type!r}"
        )
    out = ROLLOUT_CORRECTIONS.load(loss_type)(
        BypassLossInputs(
            log_prob,
            old_log_prob,
            advantages,
            mask,
            corr.weights,
            clip_ratio_low,
            clip_ratio_high,
            clip_ratio_c,
            loss_agg_mode,
            config,
            agg_kwargs,
        )
    )
    return {**out, **corr.metrics}
