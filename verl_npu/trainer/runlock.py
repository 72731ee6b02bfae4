"""One run per output folder: `af_output_dir/run.lock` (docs/reliability.md).

The lock is taken before the run writes anything into the folder and released when it ends.
It is two things at once:

- an advisory `flock` on the file, held for the life of the process: the kernel drops it when
  the holder dies, however it dies (kill -9 included), so a live holder is never mistaken for a
  dead one, and two runs racing for a free folder cannot both win;
- the holder's pid, host, start time and command line in the file, for the error message of the
  second run, and for file systems without working locks.

A lock file left behind by a process of this host that is gone (kill -9, power loss) is taken
over with a warning. One left by another host is refused (that run may be alive: its pid means
nothing here) with the command that removes it.
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import socket
import sys
from pathlib import Path

from verl_npu.errors import UserError

log = logging.getLogger("verl_npu")

LOCK_FILE = "run.lock"


class OutputFolderBusy(UserError):
    """Another run holds the output folder."""


def pid_alive(pid: int) -> bool:
    """Whether process `pid` of this host exists (owned by anyone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


def _command_line() -> str:
    if not sys.argv or not sys.argv[0]:
        return ""
    name = Path(sys.argv[0]).name
    if name in ("cli.py", "__main__.py"):  # python -m verl_npu.cli
        name = "verl-npu"
    return " ".join([name, *sys.argv[1:]])[:300]


def _describe(holder: dict) -> str:
    parts = [f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"]
    if holder.get("started_at"):
        parts.append(f"started {holder['started_at']}")
    if holder.get("command"):
        parts.append(f"command: {holder['command']}")
    return ", ".join(parts)


class RunLock:
    """`with RunLock(folder):` holds `folder/run.lock` for the duration (see the module doc)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self._fd: int | None = None
        self.info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": _command_line(),
        }

    # ---- reading ----------------------------------------------------------------------------
    @staticmethod
    def _read(fd: int) -> dict:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = b""
        while chunk := os.read(fd, 65536):
            raw += chunk
        if not raw.strip():
            return {}
        try:
            data = json.loads(raw.decode("utf-8", "replace"))
            return data if isinstance(data, dict) else {"raw": str(data)[:200]}
        except ValueError:
            return {"raw": raw[:200].decode("utf-8", "replace")}

    def _busy(self, holder: dict, why: str) -> OutputFolderBusy:
        return OutputFolderBusy(
            f"af_output_dir {self.folder} is in use by another run ({_describe(holder)}){why}. Two runs in one "
            f"folder would overwrite each other's checkpoints and metrics: wait for that run to end (or stop "
            f"it), or give this run another af_output_dir. (lock: {self.path})"
        )

    # ---- acquire / release ------------------------------------------------------------------
    def _make_folder(self) -> None:
        """Create the output folder, or say in the user's words why it cannot be (a file in the way,
        a file as a parent, no permission, a read-only or full file system)."""
        if self.folder.exists() and not self.folder.is_dir():
            raise UserError(
                f"af_output_dir {self.folder} is an existing file, not a folder. Point af_output_dir at "
                "a folder (it is created if missing), or move the file away"
            )
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise UserError(
                f"af_output_dir {self.folder}: a part of this path is an existing file, not a folder. "
                "Point af_output_dir at a path below a folder"
            ) from None
        except NotADirectoryError:
            raise UserError(
                f"af_output_dir {self.folder}: a part of this path is a file, not a folder. "
                "Point af_output_dir at a path below a folder"
            ) from None
        except OSError as exc:
            raise UserError(
                f"af_output_dir {self.folder}: cannot create the folder ({exc.strerror}). Give "
                "af_output_dir a place this user may write (or fix its permissions)"
            ) from None

    def acquire(self) -> RunLock:
        try:
            import fcntl
        except ImportError:  # not a POSIX system: the pid check alone decides
            fcntl = None

        self._make_folder()
        for _attempt in range(20):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise UserError(
                    f"af_output_dir {self.folder}: cannot create {self.path} ({exc.strerror}). "
                    "Give af_output_dir a folder this user may write (or fix its permissions)"
                ) from None
            flock_works = fcntl is not None
            try:
                if fcntl is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self._read(fd)
                os.close(fd)
                raise self._busy(holder, "") from None
            except OSError as exc:
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    os.close(fd)
                    raise
                flock_works = False  # a file system without locks: the pid check below decides
            # a run that was releasing may have removed the file we opened: lock the current one
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            holder = self._read(fd)
            try:
                self._check_holder(holder, flock_works)
            except BaseException:
                os.close(fd)
                raise
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, (json.dumps(self.info) + "\n").encode("utf-8"))
            os.fsync(fd)
            self._fd = fd
            return self
        raise OutputFolderBusy(f"could not take the lock {self.path}: it keeps being replaced by another run")

    def _check_holder(self, holder: dict, flock_works: bool) -> None:
        """Decide about a lock file whose flock was free (or where flock does not work)."""
        if not holder or holder.get("pid") is None:
            return  # empty: a released lock, or a run that died while writing it
        pid, host = holder.get("pid"), holder.get("host")
        if host != self.info["host"]:
            raise self._busy(
                holder,
                "; it was taken on another machine, so verl-npu cannot tell whether it is still running. If "
                f"it is not, remove the lock (rm {self.path}) and start again",
            )
        try:
            pid = int(pid)
        except (TypeError, ValueError):
            pid = -1
        if pid == os.getpid():
            return  # this process (a previous run in the same process that did not release it)
        if not flock_works and pid > 0 and pid_alive(pid):
            raise self._busy(holder, "")
        log.warning(
            "taking over the lock %s of an earlier run that is no longer running (%s)", self.path, _describe(holder)
        )

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            try:
                if os.path.samestat(os.fstat(fd), os.stat(self.path)) and self._read(fd).get("pid") == os.getpid():
                    os.unlink(self.path)  # removed while still locked: nobody can take a stale copy
            except FileNotFoundError:
                pass
        finally:
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
