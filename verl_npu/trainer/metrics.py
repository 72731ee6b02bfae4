"""Per-step metrics with verl's names (critic/*, response_length/*, prompt_length/*, perf/*)."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

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
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def data_metrics(batch: Batch, max_response_length: int) -> dict[str, float]:
    """Scores, rewards, advantages (over response tokens), response and prompt lengths."""
    mask = batch["response_mask"].bool()
    response_len = mask.sum(-1).float()
    prompt_len = batch["attention_mask"][:, : batch["prompts"].shape[1]].sum(-1).float()
    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", batch["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", batch["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", batch["advantages"][mask]))
    metrics.update(_stats("critic/returns", batch["returns"][mask]))
    metrics.update(_stats("response_length", response_len))
    metrics["response_length/clip_ratio"] = float((response_len >= max_response_length).float().mean())
    metrics.update(_stats("prompt_length", prompt_len))
    for name, values in batch.meta.get("reward_extras", {}).items():
        metrics[f"critic/score/{name}/mean"] = float(torch.tensor(values, dtype=torch.float32).mean())
    return metrics


def timing_metrics(timings: dict[str, float], batch: Batch, n_devices: int) -> dict[str, float]:
    metrics = {f"timing_s/{k}": v for k, v in timings.items()}
    total_tokens = float(batch["attention_mask"].sum())
    step_time = timings.get("step", 0.0)
    metrics["perf/total_num_tokens"] = total_tokens
    metrics["perf/time_per_step"] = step_time
    metrics["perf/throughput"] = total_tokens / max(step_time, 1e-9) / max(n_devices, 1)
    return metrics
