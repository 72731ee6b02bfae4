"""Single files of a checkpoint: host RNG states and the trainer's own state (`trainer_state.json`);
torch files (loaded without running pickled code) are verl_npu/workers/torch_files.py, which the
workers' checkpoint code uses too. `verl_npu.trainer.checkpoint` holds the folders (atomic saves,
manifests, the marker, resume) and re-exports these names and those of torch_files."""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import random
import re
from pathlib import Path
from typing import Any

from verl_npu.errors import UserError
from verl_npu.workers.torch_files import load_torch

logger = logging.getLogger("verl_npu.trainer.checkpoint")

#: the trainer's own state (data position, step, KL coefficient, host RNGs): JSON, no pickle
TRAINER_STATE_FILE = "trainer_state.json"
#: what verl-npu wrote before TRAINER_STATE_FILE (a torch pickle); still read, with weights_only=True.
#: (verl's own checkpoints hold a file of this name too: its dataloader state; see verl_resume.py)
LEGACY_TRAINER_STATE_FILE = "data.pt"
_TRAINER_STATE_FORMAT = "verl-npu trainer state"


# ---- step folders ----------------------------------------------------------------------------
STEP_DIR_PREFIX = "global_step_"
_STEP_DIR_RE = re.compile(r"^global_step_(\d+)$")


def step_of(path: str | Path) -> int:
    """The N of a folder named `global_step_N` (ValueError for any other name)."""
    match = _STEP_DIR_RE.match(Path(path).name)
    if not match:
        raise ValueError(f"{path}: not a checkpoint folder (expected a name like global_step_10)")
    return int(match.group(1))


# ---- host RNG states -------------------------------------------------------------------------
def save_rng_state() -> dict[str, Any]:
    """The host RNG states: `python` (random.getstate()), `numpy` (np.random.get_state()),
    `torch_cpu` (torch.get_rng_state()). Device RNGs belong to `verl_npu.device`."""
    import numpy as np
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch_cpu": torch.get_rng_state()}


def load_rng_state(state: dict[str, Any]) -> None:
    """Restore the states returned by `save_rng_state` (all three keys are required)."""
    import numpy as np
    import torch

    missing = [k for k in ("python", "numpy", "torch_cpu") if k not in state]
    if missing:
        raise KeyError(f"RNG state lacks {missing}; it was not written by save_rng_state()")
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch_cpu"].cpu())


def rng_state_to_json(state: dict[str, Any]) -> dict[str, Any]:
    """`save_rng_state()` as plain JSON values (lists, numbers, base64 text): exact, no pickle."""
    version, internal, gauss = state["python"]
    name, keys, pos, has_gauss, cached = state["numpy"]
    return {
        "python": [int(version), [int(x) for x in internal], None if gauss is None else float(gauss)],
        "numpy": [str(name), [int(x) for x in keys], int(pos), int(has_gauss), float(cached)],
        "torch_cpu": base64.b64encode(state["torch_cpu"].cpu().numpy().tobytes()).decode("ascii"),
    }


def rng_state_from_json(data: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `rng_state_to_json` (ValueError/KeyError/TypeError on malformed input)."""
    import numpy as np
    import torch

    version, internal, gauss = data["python"]
    name, keys, pos, has_gauss, cached = data["numpy"]
    raw = base64.b64decode(data["torch_cpu"], validate=True)
    return {
        "python": (int(version), tuple(int(x) for x in internal), None if gauss is None else float(gauss)),
        "numpy": (str(name), np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)),
        "torch_cpu": torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone(),
    }


# ---- the trainer's state ---------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """JSON-ready copy: numpy / torch scalars become Python numbers, tuples lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        return value.item()
    return value


def save_trainer_state(
    path: str | Path, *, dataloader: dict, global_step: int, kl_coef: float, rng: dict[str, Any]
) -> None:
    """Write the trainer's state to `path` as JSON (temp file + fsync + rename). `rng` is what
    `save_rng_state()` returns."""
    doc = {
        "format": _TRAINER_STATE_FORMAT,
        "version": 1,
        "global_step": int(global_step),
        "dataloader": _plain(dataloader),
        "kl_coef": float(kl_coef),
        "rng": rng_state_to_json(rng),
    }
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load_trainer_state(ckpt: str | Path) -> dict[str, Any]:
    """The trainer's state saved in checkpoint folder `ckpt`: `{"dataloader", "global_step",
    "kl_coef", "rng"}` (rng as `save_rng_state()` returns it). Reads `trainer_state.json`; a
    checkpoint of an older verl-npu has `data.pt` instead, read with `load_torch` (weights_only).
    A missing or malformed file is a `UserError` naming it."""
    ckpt = Path(ckpt)
    path = ckpt / TRAINER_STATE_FILE
    if not path.is_file():
        legacy = ckpt / LEGACY_TRAINER_STATE_FILE
        if legacy.is_file():
            state = load_torch(legacy)
            if not isinstance(state, dict) or not {"dataloader", "kl_coef", "rng"} <= set(state):
                raise UserError(
                    f"{legacy} is not a verl-npu trainer state (keys: "
                    f"{sorted(state) if isinstance(state, dict) else type(state).__name__})"
                )
            try:
                state["kl_coef"] = float(state["kl_coef"])
                _check_trainer_state(state)
            except _MALFORMED as exc:
                raise UserError(
                    f"{legacy} is not a valid verl-npu trainer state ({type(exc).__name__}: "
                    f"{str(exc)[:200]}); the file is damaged: resume from another checkpoint"
                ) from None
            logger.info("read the trainer state of %s from %s (older verl-npu format)", ckpt, legacy.name)
            return state
        raise UserError(
            f"checkpoint {ckpt} has no {TRAINER_STATE_FILE} (nor {LEGACY_TRAINER_STATE_FILE}): "
            "its save did not finish or the file was deleted; resume from another checkpoint"
        )
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("format") != _TRAINER_STATE_FORMAT:
            raise ValueError(f"format is {doc.get('format')!r}")
        state = {
            "dataloader": doc["dataloader"],
            "global_step": int(doc["global_step"]),
            "kl_coef": float(doc["kl_coef"]),
            "rng": rng_state_from_json(doc["rng"]),
        }
        _check_trainer_state(state)
        return state
    except _MALFORMED as exc:
        raise UserError(
            f"{path} is not a valid verl-npu trainer state ({type(exc).__name__}: "
            f"{str(exc)[:200]}); the file is damaged: resume from another checkpoint"
        ) from None


#: what reading a damaged state can raise (deep nesting: RecursionError; huge numbers: OverflowError)
_MALFORMED = (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError, OverflowError, RuntimeError)


def _check_trainer_state(state: dict[str, Any]) -> None:
    """Raise ValueError (or another of `_MALFORMED`) unless `state` can be restored: a finite KL
    coefficient, a data position of non-negative integers, and RNG states the generators accept
    (tried on throwaway generators, so nothing global changes)."""
    import numpy as np
    import torch

    if not math.isfinite(state["kl_coef"]):
        raise ValueError(f"kl_coef is {state['kl_coef']}")
    position = state["dataloader"]
    counts = (
        [position.get(k, "absent") for k in ("epoch", "sample_index", "batch_index") if k in position or k == "epoch"]
        if isinstance(position, dict)
        else ["not a dict"]
    )
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts):
        raise ValueError(f"dataloader position {str(position)[:100]} is not non-negative integers")
    rng = state["rng"]
    if rng is not None:
        random.Random().setstate(rng["python"])
        np.random.RandomState().set_state(rng["numpy"])
        torch.Generator().set_state(rng["torch_cpu"])
