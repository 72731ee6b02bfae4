"""Atomic, resumable checkpoints in verl's directory layout.

Layout under `root` (= `trainer.default_local_dir`)::

    latest_checkpointed_iteration.txt     the step number of the newest usable checkpoint
    global_step_<N>/                      one checkpoint; its content is up to the trainer
        COMPLETE                          written last, before the folder gets its final name
    .tmp-global_step_<N>-<pid>/           a save in progress (never read)

How a save stays safe against a crash at any moment:

1. every file is written into a hidden temp folder, fsynced, and a `COMPLETE` file is added;
2. the temp folder is renamed to `global_step_<N>` (a rename is atomic on one file system);
3. only then is the marker file rewritten (temp file + fsync + `os.replace`).

So the marker always names a finished folder, and a folder without `COMPLETE` is never used.
Leftover temp folders of a crashed save are removed on the next `CheckpointManager(...)` or save.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from verl_npu.errors import UserError

logger = logging.getLogger(__name__)

MARKER_FILE = "latest_checkpointed_iteration.txt"
COMPLETE_FILE = "COMPLETE"
STEP_DIR_PREFIX = "global_step_"
_STEP_DIR_RE = re.compile(r"^global_step_(\d+)$")
# Hidden names: a save in progress, and a finished checkpoint being replaced or deleted.
_TMP_PREFIX = ".tmp-"
_OLD_PREFIX = ".old-"
_HIDDEN_RE = re.compile(r"^\.(tmp|old)-(global_step_\d+)-(\d+)$")
_MARKER_TMP_RE = re.compile(r"^\." + re.escape(MARKER_FILE) + r"\.tmp-(\d+)$")

RESUME_MODES = ("auto", "disable", "resume_path")


# ---- durable file-system helpers ---------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    """fsync a directory so that renames / new entries in it survive a power loss."""
    if os.name != "posix":  # directories cannot be opened for fsync on Windows
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsync every regular file under `root` and every directory (bottom-up)."""
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            file_path = Path(dirpath) / name
            if file_path.is_symlink() or not file_path.is_file():
                continue
            with open(file_path, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(Path(dirpath))


def _write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` via a temp file in the same folder, fsync, then `os.replace`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


def save_torch(obj: Any, path: str | Path) -> None:
    """`torch.save(obj)` to `path` through a temp file + fsync + `os.replace` (never half-written)."""
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
    finally:
        if tmp.exists():
            tmp.unlink()


def load_torch(path: str | Path, map_location: Any = "cpu") -> Any:
    """`torch.load(path, weights_only=False, map_location=map_location)`.

    `weights_only=False` because checkpoints hold our own Python objects (RNG tuples, sampler
    state); only load checkpoints you wrote yourself.
    """
    import torch

    return torch.load(Path(path), map_location=map_location, weights_only=False)


def save_rng_state() -> dict[str, Any]:
    """The host RNG states: `python` (random.getstate()), `numpy` (np.random.get_state()),
    `torch_cpu` (torch.get_rng_state()). Device RNGs belong to `verl_npu.device`."""
    import numpy as np
    import torch

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch_cpu": torch.get_rng_state(),
    }


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


def _complete_step_dirs(folder: Path) -> list[Path]:
    """Complete `global_step_N` folders directly under `folder`, sorted by N."""
    if not folder.is_dir():
        return []
    found = [
        child
        for child in folder.iterdir()
        if _STEP_DIR_RE.match(child.name) and CheckpointManager.is_complete(child)
    ]
    return sorted(found, key=CheckpointManager.step_of)


# ---- the manager ---------------------------------------------------------------------------
class CheckpointManager:
    """Saves, finds and rotates `global_step_<N>` checkpoints under `root`.

    `max_to_keep`: how many complete checkpoints to keep after a save (oldest step removed
    first, the one just saved never); None or a value < 1 keeps all (as verl's
    `max_actor_ckpt_to_keep: null`).
    """

    def __init__(self, root: str | Path, max_to_keep: int | None = None):
        self.root = Path(root)
        self.max_to_keep = max_to_keep if (max_to_keep is not None and max_to_keep >= 1) else None
        self.cleanup_leftovers()

    # ---- naming ---------------------------------------------------------------------------
    @staticmethod
    def step_of(path: str | Path) -> int:
        """The N of a folder named `global_step_N` (ValueError for any other name)."""
        match = _STEP_DIR_RE.match(Path(path).name)
        if not match:
            raise ValueError(f"{path}: not a checkpoint folder (expected a name like global_step_10)")
        return int(match.group(1))

    def step_dir(self, step: int) -> Path:
        return self.root / f"{STEP_DIR_PREFIX}{int(step)}"

    @property
    def marker_path(self) -> Path:
        return self.root / MARKER_FILE

    @staticmethod
    def is_complete(path: str | Path) -> bool:
        """True when `path` is a folder that holds the COMPLETE file (its save finished)."""
        path = Path(path)
        return path.is_dir() and (path / COMPLETE_FILE).is_file()

    def list_complete(self) -> list[Path]:
        """Every complete `global_step_N` folder under root, sorted by N (ascending)."""
        return _complete_step_dirs(self.root)

    # ---- crash recovery -------------------------------------------------------------------
    def cleanup_leftovers(self) -> None:
        """Remove the hidden folders of crashed saves (`.tmp-*` of dead processes).

        A `.old-global_step_N-*` folder is a finished checkpoint that a save was replacing or a
        rotation was deleting; if `global_step_N` is missing (crash between the two renames)
        and the old one is complete it is put back, otherwise it is deleted.
        """
        if not self.root.is_dir():
            return
        for child in sorted(self.root.iterdir()):
            marker_tmp = _MARKER_TMP_RE.match(child.name)
            if marker_tmp and child.is_file() and not _pid_alive(int(marker_tmp.group(1))):
                child.unlink(missing_ok=True)
                continue
            match = _HIDDEN_RE.match(child.name)
            if not match or not child.is_dir():
                continue
            kind, target_name, pid = match.group(1), match.group(2), int(match.group(3))
            if pid != os.getpid() and _pid_alive(pid):
                continue  # another live process is saving here right now
            target = self.root / target_name
            if kind == "old" and not target.exists() and self.is_complete(child):
                os.rename(child, target)
                _fsync_dir(self.root)
                logger.warning("restored checkpoint %s left aside by an interrupted save", target)
                continue
            logger.info("removing leftover %s of an interrupted checkpoint save", child)
            shutil.rmtree(child, ignore_errors=True)

    # ---- save ------------------------------------------------------------------------------
    def save(self, step: int, write_fn: Callable[[Path], None]) -> Path:
        """Write checkpoint `step` atomically and return `root/global_step_<step>`.

        `write_fn(tmp_dir)` writes every file of the checkpoint into `tmp_dir`. If it raises,
        the temp folder is removed, nothing else changes, and the exception propagates.
        """
        step = int(step)
        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0, got {step}")
        self.root.mkdir(parents=True, exist_ok=True)
        self.cleanup_leftovers()
        pid = os.getpid()
        tmp = self.root / f"{_TMP_PREFIX}{STEP_DIR_PREFIX}{step}-{pid}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        started = time.time()
        try:
            write_fn(tmp)
            (tmp / COMPLETE_FILE).write_text(
                f"step={step}\nsaved_at={time.strftime('%Y-%m-%dT%H:%M:%S')}\n", encoding="utf-8"
            )
            _fsync_tree(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

        final = self.step_dir(step)
        if final.exists():
            # Move the old one aside first: a crash between the renames is repaired by
            # cleanup_leftovers(), which puts a complete ".old-" folder back.
            old = self.root / f"{_OLD_PREFIX}{STEP_DIR_PREFIX}{step}-{pid}"
            if old.exists():
                shutil.rmtree(old)
            os.rename(final, old)
            os.rename(tmp, final)
            _fsync_dir(self.root)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
            _fsync_dir(self.root)

        _write_text_atomic(self.marker_path, f"{step}\n")
        self._rotate(keep=final)
        logger.info("saved checkpoint %s (%.1f s)", final, time.time() - started)
        return final

    def _rotate(self, keep: Path) -> None:
        if self.max_to_keep is None:
            return
        complete = self.list_complete()
        excess = len(complete) - self.max_to_keep
        for path in complete:
            if excess <= 0:
                break
            if path == keep:
                continue
            # Rename before deleting so a half-deleted folder is never visible as a checkpoint.
            trash = self.root / f"{_OLD_PREFIX}{path.name}-{os.getpid()}"
            if trash.exists():
                shutil.rmtree(trash)
            os.rename(path, trash)
            shutil.rmtree(trash, ignore_errors=True)
            logger.info("removed old checkpoint %s (max_to_keep=%d)", path, self.max_to_keep)
            excess -= 1

    # ---- find / resume ---------------------------------------------------------------------
    def _marker_step(self) -> int | None:
        try:
            text = self.marker_path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        try:
            return int(text)
        except ValueError:
            logger.warning("%s holds %r, not a step number; ignoring it", self.marker_path, text)
            return None

    def latest(self) -> Path | None:
        """The checkpoint named by the marker file if it is complete; otherwise (marker missing,
        unreadable, or naming a missing/incomplete folder) the complete folder with the highest
        step, with a warning; None when there is no complete checkpoint."""
        marker_step = self._marker_step()
        if marker_step is not None:
            path = self.step_dir(marker_step)
            if self.is_complete(path):
                return path
        complete = self.list_complete()
        if marker_step is not None or complete:
            fallback = complete[-1] if complete else None
            if marker_step is None:
                reason = f"{self.marker_path} is missing or unreadable"
            else:
                reason = f"{self.marker_path} names step {marker_step}, whose folder is missing or incomplete"
            logger.warning("%s; using %s", reason, fallback if fallback else "no checkpoint (fresh start)")
            return fallback
        return None

    def resolve_resume(self, resume_mode: str, resume_from_path: str | Path | None) -> Path | None:
        """The checkpoint to resume from, or None for a fresh start.

        - `disable`: None.
        - `auto`: `latest()` (None when root holds no complete checkpoint).
        - `resume_path`: `resume_from_path` (relative paths resolve against the cwd); it must be
          an existing, complete folder named `global_step_N`, else UserError.
        """
        if resume_mode == "disable":
            return None
        if resume_mode == "auto":
            found = self.latest()
            if found is None:
                logger.info("resume_mode=auto: no complete checkpoint under %s; starting fresh", self.root)
            else:
                logger.info("resume_mode=auto: resuming from %s", found)
            return found
        if resume_mode != "resume_path":
            raise UserError(
                f"trainer.resume_mode: {resume_mode!r} is not a resume mode; "
                f"use one of {', '.join(RESUME_MODES)}"
            )
        if not resume_from_path:
            raise UserError(
                "trainer.resume_from_path: empty, but trainer.resume_mode=resume_path needs it; "
                f"set it to a checkpoint folder such as {self.step_dir(10)} (or use resume_mode=auto)"
            )
        path = Path(resume_from_path).expanduser()
        if not path.is_absolute():
            path = Path.cwd() / path
        if not _STEP_DIR_RE.match(path.name):
            raise UserError(
                f"trainer.resume_from_path: {path} is not a checkpoint folder; "
                "point it at a folder named global_step_N (e.g. .../global_step_10)"
            )
        if not path.is_dir():
            raise UserError(
                f"trainer.resume_from_path: {path} does not exist; "
                f"{self._available_hint(path.parent)}"
            )
        if not self.is_complete(path):
            raise UserError(
                f"trainer.resume_from_path: {path} has no {COMPLETE_FILE} file: its save did not "
                f"finish (or it was not written by verl-npu); {self._available_hint(path.parent)}"
            )
        return path

    @staticmethod
    def _available_hint(folder: Path) -> str:
        complete = _complete_step_dirs(folder)
        if not complete:
            return f"no complete checkpoint exists in {folder}; use resume_mode=auto or disable"
        names = ", ".join(p.name for p in complete[-5:])
        return f"complete checkpoints in {folder}: {names}"
