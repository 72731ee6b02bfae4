"""Resuming from a checkpoint that upstream verl's trainer wrote.

A verl `global_step_N/` folder holds `actor/` (the same per-rank files verl-npu writes, read by
`verl_npu.workers.actor_ckpt`) and `data.pt`, the state of verl's torchdata `StatefulDataLoader`;
it has none of verl-npu's own files (`COMPLETE`, `manifest.json`, `trainer_state.json`). What
verl-npu takes from it besides the actor:

- the step: N, from the folder name (verl's rule too);
- the data position: verl's loader consumes one batch per step, so after N steps of an epoch of
  L batches it is at epoch N // L, batch N % L. Without shuffling both loaders visit rows 0..n-1
  in order and the position carries over exactly (checked against `data.pt`'s count of batches
  when that file is readable). With shuffling verl's order (torch's RandomSampler) differs from
  verl-npu's, so the run starts epoch N // L over from its first batch, with a warning;
- the KL coefficient: verl does not save it; the run starts from `algorithm.kl_ctrl.kl_coef`;
- the controller's RNGs: verl does not save them; the workers' RNGs come from `extra_state`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("verl_npu")

VERL_DATA_FILE = "data.pt"
_VERL_NPU_FILES = ("COMPLETE", "manifest.json", "trainer_state.json")


def is_verl_checkpoint(folder: str | Path) -> bool:
    """True for a `global_step_N` folder written by verl's trainer: it has `actor/fsdp_config.json`
    and none of the files verl-npu adds (COMPLETE, manifest.json, trainer_state.json)."""
    folder = Path(folder)
    return (folder / "actor" / "fsdp_config.json").is_file() and not any(
        (folder / name).exists() for name in _VERL_NPU_FILES
    )


def _batches_yielded(folder: Path) -> int | None:
    """Batches verl's loader had yielded in its current epoch (`_num_yielded` of data.pt), or None
    when data.pt is absent or cannot be read without running code."""
    from verl_npu.errors import UserError
    from verl_npu.workers.torch_files import load_torch

    path = folder / VERL_DATA_FILE
    if not path.is_file():
        return None
    try:
        state = load_torch(path)
    except UserError as exc:
        log.warning("%s cannot be read safely (%s); the data position is derived from the step alone", path, exc)
        return None
    value = state.get("_num_yielded") if isinstance(state, dict) else None
    return int(value) if isinstance(value, int) else None


def trainer_state_from_verl(folder: str | Path, loader, kl_coef: float) -> dict[str, Any]:
    """The trainer state (as `load_trainer_state` returns it, `rng` None: verl keeps none for the
    controller) that continues verl's run of checkpoint `folder` with verl-npu's `loader`."""
    from verl_npu.trainer.ckpt_files import step_of

    folder = Path(folder)
    step = step_of(folder)
    per_epoch = max(len(loader), 1)
    epoch, batch = divmod(step, per_epoch)
    yielded = _batches_yielded(folder)
    if yielded is not None and yielded % per_epoch != batch:
        log.warning(
            "%s: verl's loader had yielded %d batches of its epoch, step %d implies %d (another batch "
            "size or data?); continuing from the step's position",
            folder / VERL_DATA_FILE,
            yielded,
            step,
            batch,
        )
    if loader.shuffle and batch:
        log.warning(
            "resuming verl checkpoint %s: verl shuffles the data in another order than verl-npu, so the position "
            "inside epoch %d (batch %d of %d) cannot be carried over; the run starts epoch %d over from its first "
            "batch (its first %d batches' prompts are seen again). Set data.shuffle=false in both to keep the "
            "exact position",
            folder,
            epoch,
            batch,
            per_epoch,
            epoch,
            batch,
        )
        batch = 0
    position = {
        "epoch": epoch,
        "sample_index": batch * loader.batch_size,
        "batch_size": loader.batch_size,
        "num_rows": len(loader.dataset),
        "seed": loader.seed,
        "shuffle": loader.shuffle,
    }
    log.info(
        "resuming verl checkpoint %s: step %d, data at epoch %d, batch %d; the KL coefficient starts at "
        "%s (verl does not save it)",
        folder,
        step,
        epoch,
        batch,
        kl_coef,
    )
    return {"dataloader": position, "global_step": step, "kl_coef": float(kl_coef), "rng": None}
