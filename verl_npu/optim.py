"""Optimizer and learning-rate schedule of a trainable role, from its typed optim section
(``actor_rollout_ref.actor.optim`` or ``critic.optim``, `verl_npu.config.typed`; the values and their
defaults are the schema's, verl's ``lr_scheduler_type`` already read as ``warmup_style`` by the config loader).

``build_optimizer`` makes AdamW from ``lr``, ``weight_decay`` and ``betas``; ``build_lr_scheduler``
makes a ``LambdaLR`` whose multiplier at optimizer step ``s`` (0-based, before any step ``s = 0``) is:

- warmup (``s < W``): ``s / max(1, W)`` (linear from 0 to 1), for both styles;
- ``constant`` after warmup: ``1``;
- ``cosine`` after warmup: with ``p = (s - W) / max(1, S - W)`` and ``m = min_lr_ratio``:
  ``max(m, m + (1 - m)·(1 + cos(2π·num_cycles·p))/2)`` — from 1 down to ``m`` at ``p = 1`` when
  ``num_cycles = 0.5``. With ``zero_indexed_step`` false (verl's cosine option) the cosine style
  reads ``s + 1`` for ``s``, warmup included.

``S`` is ``total_training_steps`` and ``W`` is ``lr_warmup_steps`` when it is > 0, else
``int(lr_warmup_steps_ratio · S)``. The schedule is a pure function of the step counter, so
``scheduler.state_dict()`` / ``load_state_dict`` resume it exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import partial
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from verl_npu.errors import UserError

WARMUP_STYLES = ("constant", "cosine")
_KEY = "actor_rollout_ref.actor.optim"


def _key(optim_cfg: Any) -> str:
    """The optim section's own key path (actor or critic) for error messages."""
    path = getattr(optim_cfg, "_path_", "") or _KEY
    return path.removeprefix("backend_config.")


def build_optimizer(params: Iterable[torch.nn.Parameter] | Iterable[dict], optim_cfg: Any) -> torch.optim.AdamW:
    """AdamW over ``params`` with the ``lr``, ``weight_decay`` and ``betas`` of the typed optim section
    ``optim_cfg``. Bad values raise UserError naming the key."""
    lr, weight_decay, betas = optim_cfg.lr, optim_cfg.weight_decay, tuple(optim_cfg.betas)
    if lr < 0:
        raise UserError(
            f"{_key(optim_cfg)}.lr: must be >= 0, got {lr}; fix: set a small positive learning rate such as 1e-6"
        )
    if weight_decay < 0:
        raise UserError(f"{_key(optim_cfg)}.weight_decay: must be >= 0, got {weight_decay}")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise UserError(
            f"{_key(optim_cfg)}.betas: must be two numbers in [0, 1), got {list(betas)}; fix: e.g. [0.9, 0.999]"
        )
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas)


def warmup_steps(optim_cfg: Any, total_training_steps: int) -> int:
    """``lr_warmup_steps`` when > 0, else ``int(lr_warmup_steps_ratio · total_training_steps)``."""
    if optim_cfg.lr_warmup_steps > 0:
        return optim_cfg.lr_warmup_steps
    return int(optim_cfg.lr_warmup_steps_ratio * total_training_steps)


def _constant_multiplier(step: int, warmup: int) -> float:
    if step < warmup:
        return step / max(1, warmup)
    return 1.0


def _cosine_multiplier(
    step: int, warmup: int, total: int, min_lr_ratio: float, num_cycles: float, zero_indexed: bool = True
) -> float:
    if not zero_indexed:  # optim.zero_indexed_step=false: the first update is step 1 (verl's cosine schedule)
        step += 1
    if step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    cosine = 0.5 * (1.0 + math.cos(2.0 * math.pi * num_cycles * progress))
    return max(min_lr_ratio, min_lr_ratio + (1.0 - min_lr_ratio) * cosine)


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_cfg: Any, total_training_steps: int) -> LambdaLR:
    """The LR schedule described in this module's docstring, from the typed optim section ``optim_cfg``:
    the style is ``warmup_style``; ``min_lr_ratio``, ``num_cycles`` and ``zero_indexed_step`` apply to
    ``cosine``. Call ``scheduler.step()`` once after each ``optimizer.step()``.
    """
    total = int(total_training_steps)
    if total <= 0:
        raise UserError(
            f"total_training_steps must be > 0 to build the LR schedule, got {total}; "
            "fix: set trainer.total_training_steps or trainer.total_epochs with a non-empty dataset"
        )
    style = optim_cfg.warmup_style
    warmup = warmup_steps(optim_cfg, total)
    if warmup < 0:
        raise UserError(
            f"{_key(optim_cfg)}.lr_warmup_steps_ratio: must be >= 0 (got a negative warmup of {warmup} steps)"
        )
    if style == "constant":
        multiplier = partial(_constant_multiplier, warmup=warmup)
    elif style == "cosine":
        min_lr_ratio = optim_cfg.min_lr_ratio
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise UserError(f"{_key(optim_cfg)}.min_lr_ratio: must be in [0, 1], got {min_lr_ratio}")
        multiplier = partial(
            _cosine_multiplier,
            warmup=warmup,
            total=total,
            min_lr_ratio=min_lr_ratio,
            num_cycles=optim_cfg.num_cycles,
            zero_indexed=optim_cfg.zero_indexed_step,
        )
    else:
        raise UserError(
            f"{_key(optim_cfg)}.warmup_style: unknown value {style!r}; fix: use one of {', '.join(WARMUP_STYLES)}"
        )
    return LambdaLR(optimizer, lr_lambda=multiplier)
