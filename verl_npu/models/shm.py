"""`actor_rollout_ref.model.use_shm`: load the model from a copy in shared memory (verl 0.9.1's meaning).

Every training process of a node reads the same model files; with many ranks on a network or slow disk
the reads repeat. With `use_shm` the model folder is copied once per node into `/dev/shm` (RAM; override
the folder with $VERL_NPU_SHM_DIR) and every process loads from there: the first process of a node
copies (under a file lock, into a temporary folder renamed when complete), the others wait and reuse it.
The copy is keyed by the source folder's path and its files' sizes and modification times, so a changed
model is copied again. It speeds up loading, not training; it costs the model's size in host memory.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
from pathlib import Path

from verl_npu.errors import UserError, is_disk_full
from verl_npu.models.loading import resolve_model_path

logger = logging.getLogger(__name__)
DONE = ".verl_npu_shm_complete"


def shm_root() -> Path:
    return Path(os.environ.get("VERL_NPU_SHM_DIR", "/dev/shm")) / "verl_npu_models"


def _fingerprint(folder: Path) -> str:
    h = hashlib.sha1(str(folder.resolve()).encode())
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        st = f.stat()
        h.update(f"{f.relative_to(folder)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def shm_folder(path) -> str:
    """The shared-memory copy of the model folder `path` resolves to (made on first use on this node).
    A path that is not a local folder is returned resolved, uncopied."""
    local = Path(resolve_model_path(path))
    if not local.is_dir():
        return str(local)
    root = shm_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{local.name}-{_fingerprint(local)}"
    if (target / DONE).exists():
        return str(target)
    with open(root / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / DONE).exists():
            tmp = root / f"{target.name}.tmp{os.getpid()}"
            try:
                shutil.copytree(local, tmp, dirs_exist_ok=True)
                (tmp / DONE).write_text(str(local))
                if target.exists():
                    shutil.rmtree(target)
                tmp.rename(target)
            except OSError as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                if is_disk_full(exc):
                    raise UserError(
                        f"actor_rollout_ref.model.use_shm: {root} has no room for the model "
                        f"{local}; free shared memory or set use_shm=false"
                    ) from None
                raise
            logger.info("model.use_shm: copied %s to %s", local, target)
    return str(target)
