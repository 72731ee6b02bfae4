"""Torch files of a checkpoint: written atomically, loaded without running pickled code.

The workers write and read their shards with these (`actor_ckpt`); the trainer's checkpoint code
(verl_npu/trainer/checkpoint.py, which re-exports them) reads the rest of a checkpoint with them."""

from __future__ import annotations

import errno
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any

from verl_npu.errors import UserError, is_disk_full


def save_torch(obj: Any, path: str | Path) -> None:
    """`torch.save(obj)` to `path` through a temp file + fsync + `os.replace` (never half-written).

    The data goes through a Python file object, so a full disk is an `OSError(ENOSPC)` naming
    `path` (torch's own writer turns it into a RuntimeError that never says so)."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except Exception as exc:
        if is_disk_full(exc):
            raise OSError(errno.ENOSPC, "No space left on device", str(path)) from exc
        raise
    finally:
        if tmp.exists():
            tmp.unlink()


def _safe_globals() -> list:
    """The allow-list of `load_torch` beyond torch's own (tensors, containers, numbers, strings):
    numpy arrays and dtypes (host RNG states in files of older verl-npu versions) and the classes
    of a DTensor (FSDP2 shards: the tensor, its spec, placements and device mesh). Nothing here
    runs code of the file's choosing."""
    import numpy as np

    allowed: list = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), type(np.dtype(np.float64))]
    reconstruct = np._core.multiarray._reconstruct if hasattr(np, "_core") else np.core.multiarray._reconstruct
    allowed += [
        (reconstruct, "numpy._core.multiarray._reconstruct"),
        (reconstruct, "numpy.core.multiarray._reconstruct"),
    ]
    import torch.distributed as dist

    if dist.is_available():
        from torch.distributed import device_mesh
        from torch.distributed import tensor as dtensor
        from torch.distributed.tensor import _dtensor_spec, placement_types

        allowed += [dtensor.DTensor, device_mesh.DeviceMesh, _dtensor_spec.DTensorSpec, _dtensor_spec.TensorMeta]
        allowed += [
            getattr(placement_types, name)
            for name in ("Shard", "Replicate", "Partial", "_StridedShard")
            if hasattr(placement_types, name)
        ]
        if hasattr(_dtensor_spec, "ShardOrderEntry"):
            allowed.append(_dtensor_spec.ShardOrderEntry)
    return allowed


class UnsafeCheckpointFile(UserError):
    """A checkpoint file holds Python objects that loading would have to run code to build."""


def load_torch(path: str | Path, map_location: Any = "cpu") -> Any:
    """`torch.load(path, weights_only=True)` with the allow-list of `_safe_globals()`.

    Nothing in the file is executed: a file holding any other Python object is refused with an
    `UnsafeCheckpointFile` naming it; a missing, truncated or damaged file is a `UserError`
    naming it."""
    import torch

    path = Path(path)
    # a DTensor's mesh names process groups of the saving run; torch warns once per file that they
    # cannot be looked up here (they are not needed to read the shards)
    mesh_log = logging.getLogger("torch.distributed.device_mesh")
    level = mesh_log.level
    mesh_log.setLevel(logging.ERROR)
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise UserError(f"checkpoint file {path} is missing") from None
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL (\S+)", str(exc))
        what = (
            f"it refers to {found.group(1)}, which is not on the allow-list"
            if found
            else str(exc).strip().splitlines()[-1][:200]
        )
        raise UnsafeCheckpointFile(
            f"refusing to load {path}: it holds a Python object that is not a tensor or plain data "
            f"({what}). verl-npu never writes such objects: the file was replaced or modified, and "
            f"loading it could run arbitrary code. Nothing of it was executed; resume from a "
            f"checkpoint you trust"
        ) from None
    except Exception as exc:  # noqa: BLE001 - torch's reader errors have no common type
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"checkpoint file {path} cannot be read ({type(exc).__name__}: {first[:200]}): it is "
            f"truncated or damaged; resume from another checkpoint"
        ) from None
    finally:
        mesh_log.setLevel(level)
