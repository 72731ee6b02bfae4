"""Per-step metrics with verl's names (critic/*, response_length/*, prompt_length/*, perf/*)."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from verl_npu.algorithms import last_trained_token  # noqa: F401 - where tests and readers look for it
from verl_npu.batch import Batch


@contextmanager
def timed(name: str, timings: dict[str, float]):
    """Adds the wall time of the block to timings[name] (seconds)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:  # e.g. every token rejected by rollout correction (rollout_rs)
        return {f"{prefix}/mean": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def multi_turn_metrics(batch: Batch, prefix: str = "") -> dict[str, float]:
    """verl's multi-turn names: num_turns/* (user + assistant turns + 1 per trajectory) and
    tool_call_counts/*, and per tool its calls and their error ratio (`tool_calls.tool_call_metrics`);
    empty for single-turn batches."""
    from verl_npu.rollout.tool_calls import tool_call_metrics

    metrics: dict[str, float] = {}
    for field, name in (("__num_turns__", "num_turns"), ("tool_call_counts", "tool_call_counts")):
        if field in batch:
            metrics.update(_stats(prefix + name, torch.tensor(batch[field], dtype=torch.float32)))
    if "agent_turns" in batch:
        metrics.update({prefix + k: v for k, v in tool_call_metrics(batch["agent_turns"]).items()})
    return metrics


def data_metrics(batch: Batch, max_response_length: int) -> dict[str, float]:
    """Scores, rewards, advantages (over response tokens), response and prompt lengths."""
    mask = batch["response_mask"].bool()
    # generated tokens: the attention mask's response columns (rollout correction may have removed rejected
    # tokens from response_mask)
    response_len = batch["attention_mask"][:, batch["prompts"].shape[1] :].sum(-1).float()
    if "tool_mask" in batch:  # multi-turn: the tools' tokens are not the model's (docs/agents.md)
        response_len = response_len - batch["tool_mask"].sum(-1).float()
    prompt_len = batch["attention_mask"][:, : batch["prompts"].shape[1]].sum(-1).float()
    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", batch["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", batch["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", batch["advantages"][mask]))
    metrics.update(_stats("critic/returns", batch["returns"][mask]))
    if "values" in batch:  # PPO with a critic: verl's value statistics and explained variance
        values, returns = batch["values"][mask], batch["returns"][mask]
        metrics.update(_stats("critic/values", values))
        var_returns = torch.var(returns.float())
        metrics["critic/vf_explained_var"] = float(1.0 - torch.var((returns - values).float()) / (var_returns + 1e-5))
    metrics.update(_stats("response_length", response_len))
    metrics["response_length/clip_ratio"] = float((response_len >= max_response_length).float().mean())
    metrics.update(_stats("prompt_length", prompt_len))
    for name, values in batch.meta.get("reward_extras", {}).items():
        metrics[f"critic/score/{name}/mean"] = float(torch.tensor(values, dtype=torch.float32).mean())
    metrics.update(multi_turn_metrics(batch))
    return metrics


def timing_metrics(timings: dict[str, float], batch: Batch, n_devices: int) -> dict[str, float]:
    metrics = {f"timing_s/{k}": v for k, v in timings.items()}
    total_tokens = float(batch["attention_mask"].sum())
    step_time = timings.get("step", 0.0)
    metrics["perf/total_num_tokens"] = total_tokens
    metrics["perf/time_per_step"] = step_time
    metrics["perf/throughput"] = total_tokens / max(step_time, 1e-9) / max(n_devices, 1)
    return metrics


def rollout_probs_diff_metrics(
    rollout_log_probs: torch.Tensor, actor_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """How far the rollout engine's sampling distribution is from the actor's, with verl's names.

    Over every response token (response_mask 1): p_rollout = exp(rollout log-prob of the sampled
    token), p_actor = exp(the actor's old log-prob of it); `training/rollout_probs_diff_{max,mean,
    std}` are the max / mean / std of |p_rollout - p_actor|, `training/rollout_actor_probs_pearson_corr`
    the Pearson correlation of the two, `training/rollout_probs_diff_valid` 1.0 when there was at
    least one response token (0.0 and no other values otherwise). An engine whose weights lag the
    actor's shows up here at once: tenths where a synced fp32 engine gives ~1e-6."""
    valid = response_mask.bool()
    if not bool(valid.any()):
        return {"training/rollout_probs_diff_valid": 0.0}
    p_rollout = torch.exp(rollout_log_probs.double()[valid])
    p_actor = torch.exp(actor_log_probs.double()[valid])
    diff = (p_rollout - p_actor).abs()
    metrics = {
        "training/rollout_probs_diff_valid": 1.0,
        "training/rollout_probs_diff_max": float(diff.max()),
        "training/rollout_probs_diff_mean": float(diff.mean()),
        "training/rollout_probs_diff_std": float(diff.std(unbiased=False)),
    }
    r, a = p_rollout - p_rollout.mean(), p_actor - p_actor.mean()
    denom = float(torch.sqrt((r * r).sum() * (a * a).sum()))
    metrics["training/rollout_actor_probs_pearson_corr"] = float((r * a).sum()) / denom if denom > 0 else 1.0
    return metrics


def variance_proxy_metrics(batch: Batch, gradient_norm: float | None = None) -> dict[str, float]:
    """verl's gradient-variance proxies (`variance_proxy/*`), logged whenever the actor gave `sum_pi_squared`
    (actor.calculate_sum_pi_squared), for any estimator.

    Per response token ``w = 1 - 2·exp(old_log_prob) + Σπ²`` (times ``ρ²`` with rollout importance weights
    ``rollout_is_weights``); per row ``W = Σ_t w·mask`` and ``Ā = Σ_t A·mask / (Σ_t mask + 1e-8)``:
    `expected_w` = mean W, `expected_a_squared` = mean Ā², `proxy2_total_power` = mean(Ā²·max(W, 0)) (with
    weights: mean(ρ̄²·Ā²·max(W', 0)), ρ̄ the row's mean weight and W' the row's sum of w / max(ρ², 1e-10)),
    `proxy1_signal_strength` = actor/grad_norm² (0 without it) and `proxy3_pure_noise` =
    max(0, (proxy2 - proxy1) / (B - 1)) (0 without a grad norm or with one row)."""
    if not all(k in batch for k in ("sum_pi_squared", "old_log_probs", "advantages")):
        return {}
    mask = batch["response_mask"].to(torch.float32)

    def row_sum(x):
        return (x * mask).sum(-1)

    w = 1.0 - 2.0 * torch.exp(batch["old_log_probs"].float()) + batch["sum_pi_squared"].float()
    rho = batch["rollout_is_weights"].float() if "rollout_is_weights" in batch else None
    if rho is not None:
        w = w * rho**2
    adv = row_sum(batch["advantages"].float()) / (mask.sum(-1) + 1e-8)
    w_rows = row_sum(w)
    if rho is not None:
        rho_rows = row_sum(rho) / (mask.sum(-1) + 1e-8)
        original = row_sum(w / torch.clamp(rho**2, min=1e-10)).clamp(min=0.0)
        power = float((rho_rows**2 * adv**2 * original).mean())
    else:
        power = float((adv**2 * w_rows.clamp(min=0.0)).mean())
    signal = float(gradient_norm) ** 2 if gradient_norm is not None else None
    noise = max(0.0, (power - signal) / (len(adv) - 1)) if signal is not None and len(adv) > 1 else 0.0
    return {
        "variance_proxy/proxy1_signal_strength": signal if signal is not None else 0.0,
        "variance_proxy/proxy2_total_power": power,
        "variance_proxy/proxy3_pure_noise": noise,
        "variance_proxy/expected_a_squared": float((adv**2).mean()),
        "variance_proxy/expected_w": float(w_rows.mean()),
    }
