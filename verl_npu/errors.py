"""Errors a user can fix, kept apart from bugs.

A `UserError` is printed by the CLI without a traceback (exit 1); anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class UserError(Exception):
    """A mistake the user can fix. The message names the thing that is wrong and the fix."""


@dataclass(frozen=True)
class Problem:
    """One config problem: the full dotted key, what is wrong, and how to fix it."""

    key: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        text = f"{self.key}: {self.message}"
        if self.fix:
            text += f"\n    fix: {self.fix}"
        return text


class ConfigErrors(UserError):
    """Every problem found in a config, reported at once."""

    def __init__(self, problems: list[Problem], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = [f"{len(self.problems)} config problem(s){where}:"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


def is_disk_full(exc: BaseException | None) -> bool:
    """True when `exc` or anything it was raised from is "no space left on device": an OSError
    with errno ENOSPC, or the text of one (torch's stream writer, safetensors and a worker group
    re-raise it as another type; Ray keeps the cause)."""
    pending, seen = [exc], set()
    while pending:
        cur = pending.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno == errno.ENOSPC:
            return True
        text = str(cur)
        if "No space left on device" in text or "os error 28" in text:
            return True
        pending += [cur.__cause__, cur.__context__, getattr(cur, "cause", None)]
    return False


def _full_file(exc: BaseException) -> str | None:
    """The file an ENOSPC error in `exc`'s chain was writing, when it says."""
    pending = [exc]
    while pending:
        cur = pending.pop()
        if isinstance(cur, OSError) and cur.errno == errno.ENOSPC and cur.filename:
            return str(cur.filename)
        pending += [c for c in (cur.__cause__, cur.__context__) if c is not None and c is not cur]
    return None


def run_command(body: Callable[[], Any]) -> int:
    """Run a command-line entry point: its exit code, or 1 with the message (no traceback) for a
    UserError or a full disk, or 130 on Ctrl-C. Every verl-npu command goes through here."""
    try:
        return int(body() or 0)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    except Exception as exc:  # noqa: BLE001 - a full disk is the user's to fix; the rest are bugs
        if not is_disk_full(exc):
            raise
        where = _full_file(exc)
        print(
            f"error: no space left on device{f' writing {where}' if where else ''}. Fix: free space there "
            "(or point af_output_dir / trainer.default_local_dir at a larger disk) and rerun the same "
            "command: checkpoints are written atomically, so the last complete one is intact and the run "
            "resumes from it",
            file=sys.stderr,
            flush=True,
        )
        return 1
