"""ROLL's reward normalisation, applied to the scores before the advantage estimator (a verl-npu extension
of verl's schema: `algorithm.reward_norm.grouping` / `.method` / `.clip`).

ROLL (alibaba/ROLL, agentic pipeline) normalises each response's score within a group of responses, then
clips it, and only then applies the KL penalty and the advantage estimator. verl-npu does the same, in
the same order. For row i with score ``s_i = Σ_t score_{i,t}·mask_{i,t}`` and its group ``G(i)``:

- grouping ``state``: the rows with the same uid (the rollout.n responses of one prompt; ROLL's ``state``,
  newer ROLL configs call it ``traj_group_id``); ``batch``: every row of the step; ``inductive``: the rows
  with the same data_source (ROLL's environment ``tag``, newer ROLL: ``tags``).
- method, with ``m = mean_{j∈G} s_j`` and ``σ = std_{j∈G} s_j`` (unbiased, divisor |G| - 1):

  * ``identity``: ``s'_i = s_i``;
  * ``mean``: ``s'_i = s_i - m`` (0 for a group of one row);
  * ``mean_std``: ``s'_i = (s_i - m) / (σ + 1e-6)`` when |G| ≥ 2 and ``σ > 1e-6``, else ``s'_i = 0``;
  * ``asym_clip``: the ``mean_std`` value clamped to ``[-1, 3]``.

- clip ``c`` (ROLL's ``reward_clip``; null: none): ``s'_i ← clamp(s'_i, -c, c)``, after the method.

The normalised score replaces the row's scores: it sits on the row's last response token (where verl's
reward managers put a sequence score), 0 elsewhere. With the defaults (identity, no clip) nothing is
computed: `apply_reward_norm` returns its input itself.

This module imports torch only.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

#: ROLL's constants: the std below which a group's scores count as all equal, the std's epsilon,
#: and asym_clip's bounds.
STD_FLOOR = 1e-6
STD_EPS = 1e-6
ASYM_CLIP = (-1.0, 3.0)


def group_keys(grouping: str, uids: Sequence[Hashable], data_sources: Sequence[Hashable] | None) -> list:
    """The key that decides each row's group under `grouping` (state: uid, batch: one key, inductive:
    data_source)."""
    if grouping == "state":
        return list(uids)
    if grouping == "batch":
        return [0] * len(uids)
    if grouping == "inductive":
        if data_sources is None:
            raise ValueError("reward_norm grouping=inductive needs each row's data_source")
        return list(data_sources)
    raise ValueError(f"unknown reward_norm grouping {grouping!r}; known: state, batch, inductive")


def normalize_group(scores: torch.Tensor, method: str) -> torch.Tensor:
    """One group's scores [n] normalised by `method` (the formulas in the module docstring)."""
    if method == "identity":
        return scores.clone()
    if scores.numel() < 2:
        return torch.zeros_like(scores)
    centred = scores - scores.mean()
    if method == "mean":
        return centred
    if method not in ("mean_std", "asym_clip"):
        raise ValueError(f"unknown reward_norm method {method!r}; known: identity, mean, mean_std, asym_clip")
    std = scores.std(unbiased=True)
    out = centred / (std + STD_EPS) if float(std) > STD_FLOOR else torch.zeros_like(scores)
    return out.clamp(*ASYM_CLIP) if method == "asym_clip" else out


def normalize_scores(
    scores: torch.Tensor, keys: Sequence[Hashable], method: str, clip: float | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """Sequence scores [B] normalised per group (rows with equal `keys`) by `method`, then clamped to
    [-clip, clip] when `clip` is set. Metrics: `critic/reward_clip_frac` (ROLL's name: the share of rows the
    clip changed) with a clip, `critic/reward_norm/groups` (how many groups) otherwise too."""
    if len(keys) != scores.shape[0]:
        raise ValueError(f"{len(keys)} group keys for {scores.shape[0]} scores")
    groups: dict[Hashable, list[int]] = {}
    for row, key in enumerate(keys):
        groups.setdefault(key, []).append(row)
    out = torch.empty_like(scores)
    for rows in groups.values():
        index = torch.tensor(rows, device=scores.device)
        out[index] = normalize_group(scores[index], method)
    metrics = {"critic/reward_norm/groups": float(len(groups))}
    if clip is not None:
        clipped = out.clamp(-float(clip), float(clip))
        metrics["critic/reward_clip_frac"] = float((clipped != out).float().mean()) if out.numel() else 0.0
        out = clipped
    return out, metrics


def reward_norm_active(config: Any) -> bool:
    """Whether `config` (the typed `algorithm.reward_norm` section, or None) changes anything."""
    if config is None:
        return False
    return config.method != "identity" or config.clip is not None


def apply_reward_norm(
    token_level_scores: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
    *,
    uids: Sequence[Hashable],
    data_sources: Sequence[Hashable] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The token-level scores [B, T] after `algorithm.reward_norm` (`config`: grouping, method, clip):
    each row's normalised sequence score on its last response token (``Σ_t mask - 1``, at least 0), 0
    elsewhere; the input itself when `config` changes nothing. Returns (scores, metrics)."""
    if not reward_norm_active(config):
        return token_level_scores, {}
    mask = response_mask.to(token_level_scores.dtype)
    scores = (token_level_scores * mask).sum(dim=-1)
    keys = group_keys(config.grouping, uids, data_sources)
    normalized, metrics = normalize_scores(scores, keys, config.method, config.clip)
    last = (response_mask.sum(dim=-1).long() - 1).clamp(min=0)
    out = torch.zeros_like(token_level_scores)
    out[torch.arange(out.shape[0], device=out.device), last] = normalized
    return out, metrics
