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

What a resume trusts (docs/reliability.md):

- every checkpoint carries `manifest.json` (size and CRC-32 of every file), written before
  `COMPLETE`; resume checks it and names the file that is missing, truncated or changed. With
  `resume_mode=auto` a damaged checkpoint is skipped for the newest intact one; with
  `resume_mode=resume_path` it is an error. A checkpoint without a manifest (written by an older
  verl-npu) is used with a warning that it cannot be verified;
- nothing is unpickled: `.pt` files load with `torch.load(weights_only=True)` and a short
  allow-list (DTensor shards, numpy arrays of old RNG states); the trainer's own state is JSON
  (`trainer_state.json`);
- before a save the free space is checked against the last checkpoint's size, and a save that
  runs out of space (`ENOSPC`, also inside a worker) is a `DiskFull` error that leaves the
  previous checkpoints as they were.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from verl_npu.errors import UserError, is_disk_full
from verl_npu.trainer.ckpt_files import (  # noqa: F401 - re-exported: the checkpoint API in one place
    _STEP_DIR_RE,
    LEGACY_TRAINER_STATE_FILE,
    STEP_DIR_PREFIX,
    TRAINER_STATE_FILE,
    load_rng_state,
    load_trainer_state,
    rng_state_from_json,
    rng_state_to_json,
    save_rng_state,
    save_trainer_state,
    step_of,
)
from verl_npu.trainer.runlock import pid_alive
from verl_npu.trainer.verl_resume import is_verl_checkpoint
from verl_npu.workers.torch_files import UnsafeCheckpointFile, load_torch, save_torch  # noqa: F401 - re-exported

logger = logging.getLogger(__name__)

MARKER_FILE = "latest_checkpointed_iteration.txt"
COMPLETE_FILE = "COMPLETE"
MANIFEST_FILE = "manifest.json"
_MANIFEST_FORMAT = "verl-npu checkpoint manifest"
_CHUNK = 8 << 20  # bytes read at a time for checksums
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


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as `df -h` prints them)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


# ---- disk full -------------------------------------------------------------------------------
class DiskFull(UserError):
    """A checkpoint could not be written for lack of space; the previous checkpoints are intact."""


def folder_size(path: str | Path) -> int:
    """Bytes of every regular file under `path` (0 when it does not exist)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if not os.path.islink(os.path.join(dirpath, name)):
                total += st.st_size
    return total


# ---- manifests -------------------------------------------------------------------------------
def _file_crc32(path: Path) -> tuple[int, str]:
    """(size, CRC-32 as 8 hex digits) of a file, read in 8 MiB blocks (zlib releases the GIL
    while it sums a block, so several files are summed in parallel threads)."""
    crc, size = 0, 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            crc = zlib.crc32(view[:n], crc)
            size += n
    return size, f"{crc & 0xFFFFFFFF:08x}"


def _listed_files(folder: Path) -> list[str]:
    """Relative paths (posix) of the regular files of a checkpoint, manifest and COMPLETE aside;
    hidden names (leftover temp files, `.nfs*`) are not part of a checkpoint."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            full = Path(dirpath) / name
            rel = full.relative_to(folder).as_posix()
            if rel in (MANIFEST_FILE, COMPLETE_FILE) or full.is_symlink() or not full.is_file():
                continue
            found.append(rel)
    return found


def _sum_files(folder: Path, rels: list[str]) -> list[tuple[int, str] | BaseException]:
    def one(rel: str):
        try:
            return _file_crc32(folder / rel)
        except OSError as exc:
            return exc

    if len(rels) <= 1:
        return [one(r) for r in rels]
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1, len(rels))) as pool:
        return list(pool.map(one, rels))


def write_manifest(folder: str | Path, step: int | None = None) -> dict:
    """Write `folder/manifest.json`: size and CRC-32 of every file under `folder`. Returns it."""
    folder = Path(folder)
    rels = _listed_files(folder)
    files = {}
    for rel, result in zip(rels, _sum_files(folder, rels)):
        if isinstance(result, BaseException):
            raise result
        files[rel] = {"size": result[0], "crc32": result[1]}
    manifest = {
        "format": _MANIFEST_FORMAT,
        "version": 1,
        "step": step,
        "checksum": "crc32",
        "total_bytes": sum(f["size"] for f in files.values()),
        "files": files,
    }
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


@dataclass
class Verification:
    """What `verify_checkpoint` found. `verified` is False for a checkpoint without a manifest
    (written by an older verl-npu: nothing to check against); `problems` lists damaged files."""

    path: Path
    verified: bool
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        return "; ".join(self.problems)


def verify_checkpoint(folder: str | Path) -> Verification:
    """Check every file of checkpoint `folder` against its manifest: missing, wrong size
    (truncated or grown), wrong checksum (changed in place), or not listed (added after the save)."""
    folder = Path(folder)
    mpath = folder / MANIFEST_FILE
    if not mpath.exists():
        return Verification(folder, verified=False)
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
        files = manifest["files"]
        if manifest.get("format") != _MANIFEST_FORMAT or not isinstance(files, dict):
            raise ValueError("not a verl-npu checkpoint manifest")
        for rel, entry in files.items():
            int(entry["size"]), str(entry["crc32"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return Verification(folder, True, [f"{MANIFEST_FILE}: unreadable ({type(exc).__name__}: {exc})"])
    problems: list[str] = []
    to_sum: list[str] = []
    for rel, entry in files.items():
        target = folder / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            problems.append(f"{MANIFEST_FILE}: lists {rel!r}, a path outside the checkpoint")
            continue
        if not target.is_file():
            problems.append(f"{rel}: missing (the manifest lists it, {entry['size']} bytes)")
            continue
        size = target.stat().st_size
        if size != int(entry["size"]):
            how = "truncated" if size < int(entry["size"]) else "grown"
            problems.append(f"{rel}: {size} bytes, the manifest says {entry['size']} ({how})")
            continue
        to_sum.append(rel)
    for rel, result in zip(to_sum, _sum_files(folder, to_sum)):
        if isinstance(result, BaseException):
            problems.append(f"{rel}: unreadable ({result})")
        elif result[1] != str(files[rel]["crc32"]):
            problems.append(
                f"{rel}: contents changed since the save (CRC-32 {result[1]}, the manifest says "
                f"{files[rel]['crc32']}): the file is damaged or was modified"
            )
    for rel in _listed_files(folder):
        if rel not in files:
            problems.append(f"{rel}: not in the manifest (added after the save)")
    return Verification(folder, True, problems)


def _complete_step_dirs(folder: Path) -> list[Path]:
    """Complete `global_step_N` folders directly under `folder`, sorted by N."""
    if not folder.is_dir():
        return []
    found = [
        child for child in folder.iterdir() if _STEP_DIR_RE.match(child.name) and CheckpointManager.is_complete(child)
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
    step_of = staticmethod(step_of)

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
            if marker_tmp and child.is_file() and not pid_alive(int(marker_tmp.group(1))):
                child.unlink(missing_ok=True)
                continue
            match = _HIDDEN_RE.match(child.name)
            if not match or not child.is_dir():
                continue
            kind, target_name, pid = match.group(1), match.group(2), int(match.group(3))
            if pid != os.getpid() and pid_alive(pid):
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
    def expected_size(self) -> tuple[int, Path] | None:
        """(bytes, folder) of the newest complete checkpoint: about what the next save needs
        (from its manifest, else measured); None when there is none."""
        complete = self.list_complete()
        if not complete:
            return None
        newest = complete[-1]
        try:
            total = json.loads((newest / MANIFEST_FILE).read_text(encoding="utf-8"))["total_bytes"]
            return int(total), newest
        except (OSError, ValueError, KeyError, TypeError):
            return folder_size(newest), newest

    def _disk_full(self, step: int, needed: int | None, sized_from: str, written: int | None = None) -> DiskFull:
        free = shutil.disk_usage(self.root).free
        if needed is not None:
            need = f"needed ~{human_bytes(needed)} ({sized_from})"
        else:
            need = f"needed more than {human_bytes(written or 0)} (written before the disk filled)"
        latest = self.latest()
        kept = (
            f"the last complete checkpoint, {latest}, is intact"
            if latest is not None
            else "no complete checkpoint exists yet"
        )
        return DiskFull(
            f"no space left on {self.root}: {need}, free {human_bytes(free)}. Checkpoint step {step} was not "
            f"saved and nothing was removed: {kept}. Free some space there (a save needs room for one "
            f"checkpoint more than trainer.max_actor_ckpt_to_keep keeps; see docs/reliability.md), or point "
            f"trainer.default_local_dir at a larger disk, then rerun with trainer.resume_mode=auto"
        )

    def save(self, step: int, write_fn: Callable[[Path], None]) -> Path:
        """Write checkpoint `step` atomically and return `root/global_step_<step>`.

        `write_fn(tmp_dir)` writes every file of the checkpoint into `tmp_dir`; a manifest of
        them and `COMPLETE` are added. If it raises, the temp folder is removed, nothing else
        changes, and the exception propagates; running out of space (before the save: less free
        than the last checkpoint's size; or ENOSPC during it, also from a worker) is `DiskFull`.
        """
        step = int(step)
        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0, got {step}")
        self.root.mkdir(parents=True, exist_ok=True)
        self.cleanup_leftovers()
        expected = self.expected_size()
        if expected is not None:
            needed, sized_from = expected[0], f"the size of {expected[1].name}"
            if shutil.disk_usage(self.root).free < needed:
                raise self._disk_full(step, needed, sized_from)
        pid = os.getpid()
        tmp = self.root / f"{_TMP_PREFIX}{STEP_DIR_PREFIX}{step}-{pid}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        started = time.time()
        try:
            write_fn(tmp)
            write_manifest(tmp, step)
            (tmp / COMPLETE_FILE).write_text(
                f"step={step}\nsaved_at={time.strftime('%Y-%m-%dT%H:%M:%S')}\nmanifest={MANIFEST_FILE}\n",
                encoding="utf-8",
            )
            _fsync_tree(tmp)
        except BaseException as exc:
            written = folder_size(tmp)
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, Exception) and is_disk_full(exc):
                raise self._disk_full(
                    step,
                    expected[0] if expected else None,
                    f"the size of {expected[1].name}" if expected else "",
                    written,
                ) from None
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

        try:
            _write_text_atomic(self.marker_path, f"{step}\n")
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            raise DiskFull(
                f"no space left on {self.root} for the few bytes of {MARKER_FILE}: checkpoint {final} is "
                f"complete, but the marker still names the previous one. Free some space, then rerun with "
                f"trainer.resume_mode=resume_path trainer.resume_from_path={final}"
            ) from None
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
            if path.is_symlink():  # a link the user made: drop the link, never the folder it points to
                target = os.readlink(path)
                path.unlink()
                _fsync_dir(self.root)
                logger.info(
                    "removed the link %s -> %s (max_to_keep=%d); the folder it points to is left in place",
                    path,
                    target,
                    self.max_to_keep,
                )
                excess -= 1
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
            text = self.marker_path.read_bytes().decode("utf-8", "replace").strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            logger.warning("%s cannot be read (%s); ignoring it", self.marker_path, exc.strerror)
            return None
        try:
            return int(text)
        except ValueError:
            logger.warning("%s holds %r, not a step number; ignoring it", self.marker_path, text[:80])
            return None

    def latest(self) -> Path | None:
        """The checkpoint named by the marker file if it is complete; otherwise (marker missing,
        unreadable, or naming a missing/incomplete folder) the complete folder with the highest
        step, with a warning; None when there is no complete checkpoint."""
        marker_step = self._marker_step()
        if marker_step is not None:
            path = self.step_dir(marker_step)
            # a folder of verl's trainer has no COMPLETE: verl's marker moving to it says it is done
            if self.is_complete(path) or is_verl_checkpoint(path):
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
        - `auto`: `latest()` verified against its manifest; a damaged one is reported file by
          file and the newest intact one is used instead (None when root holds no complete
          checkpoint; UserError when every one is damaged).
        - `resume_path`: `resume_from_path` (relative paths resolve against the cwd); it must be
          an existing, complete, intact folder named `global_step_N`, else UserError.

        A checkpoint without a manifest (older verl-npu) is used with a warning.
        """
        if resume_mode == "disable":
            return None
        if resume_mode == "auto":
            found = self._newest_intact()
            if found is None:
                logger.info("resume_mode=auto: no complete checkpoint under %s; starting fresh", self.root)
            else:
                logger.info("resume_mode=auto: resuming from %s", found)
            return found
        if resume_mode != "resume_path":
            raise UserError(
                f"trainer.resume_mode: {resume_mode!r} is not a resume mode; use one of {', '.join(RESUME_MODES)}"
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
            raise UserError(f"trainer.resume_from_path: {path} does not exist; {self._available_hint(path.parent)}")
        if is_verl_checkpoint(path):
            logger.warning(
                "%s was written by upstream verl (no %s, no %s): resuming it without verifying its files",
                path,
                COMPLETE_FILE,
                MANIFEST_FILE,
            )
            return path
        if not self.is_complete(path):
            raise UserError(
                f"trainer.resume_from_path: {path} has no {COMPLETE_FILE} file: its save did not "
                f"finish (or it was not written by verl-npu); {self._available_hint(path.parent)}"
            )
        check = verify_checkpoint(path)
        if not check.ok:
            raise UserError(
                f"trainer.resume_from_path: checkpoint {path} is damaged: {check.describe()}. "
                f"Nothing was loaded. Point resume_from_path at another checkpoint, or use "
                f"trainer.resume_mode=auto, which skips damaged ones; {self._available_hint(path.parent)}"
            )
        self._warn_unverified(check)
        return path

    @staticmethod
    def _warn_unverified(check: Verification) -> None:
        if not check.verified:
            logger.warning(
                "checkpoint %s has no %s (it was written by upstream verl or an older verl-npu): its files "
                "cannot be verified before loading",
                check.path,
                MANIFEST_FILE,
            )

    def _newest_intact(self) -> Path | None:
        """`latest()`, verified against its manifest; a damaged one is reported (file by file)
        and skipped for the next older complete checkpoint. UserError when every one is damaged
        (never a silent fresh start over the user's checkpoints)."""
        first = self.latest()
        if first is None:
            return None
        candidates = [first] + [p for p in reversed(self.list_complete()) if p != first]
        damaged = []
        for path in candidates:
            check = verify_checkpoint(path)
            if check.ok:
                if damaged:
                    logger.warning("resume_mode=auto: falling back to %s, the newest intact checkpoint", path)
                self._warn_unverified(check)
                return path
            logger.error("checkpoint %s is damaged, skipping it: %s", path, check.describe())
            damaged.append(f"{path.name}: {check.describe()}")
        raise UserError(
            f"every checkpoint in {self.root} is damaged, so none can be resumed: "
            + " | ".join(damaged)
            + ". Move the folder aside (or set trainer.resume_mode=disable) to start fresh"
        )

    @staticmethod
    def _available_hint(folder: Path) -> str:
        complete = _complete_step_dirs(folder)
        if not complete:
            return f"no complete checkpoint exists in {folder}; use resume_mode=auto or disable"
        names = ", ".join(p.name for p in complete[-5:])
        return f"complete checkpoints in {folder}: {names}"
