"""Errors a user can fix, kept apart from bugs.

A `UserError` is printed by the CLI without a traceback (exit 1); anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable


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


def run_command(body: Callable[[], Any]) -> int:
    """Run a command-line entry point: its exit code, or 1 with the message (no traceback) for a
    UserError, or 130 on Ctrl-C. Every verl-npu command goes through here."""
    try:
        return int(body() or 0)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
