"""What the grid environments share: the four moves, reading a move from a model turn, the step result,
and the base class (a seeded `random.Random`, a step counter, text rendering of the grid).

A move is `U`, `D`, `L` or `R` (up, down, left, right). `parse_action` reads a model turn as ROLL's
environments do: the turn's text, with an `<answer>...</answer>` wrapper removed when there is one and
surrounding whitespace stripped, must be one move written as its capital letter (`U`) or its word in
any case (`up`, `Up`). Anything else is malformed (None): the interaction then applies the format
penalty and the environment does not move. Lower-case letters are not moves: with them a tiny model
spreads its moves over eight spellings (`u`, ` r`, ...) instead of learning four.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

#: move -> (row change, column change)
ACTIONS = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
_WORDS = {"up": "U", "down": "D", "left": "L", "right": "R"}
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def parse_action(text: str) -> str | None:
    """The move a model turn names (`U`/`D`/`L`/`R`), or None when the turn is not exactly one move."""
    found = _ANSWER.search(text or "")
    body = (found.group(1) if found else (text or "")).strip()
    return body if body in ACTIONS else _WORDS.get(body.lower())


@dataclass
class StepResult:
    """One step: the observation after it, its reward, whether the episode ended, whether it was won."""

    observation: str
    reward: float
    done: bool
    success: bool
    info: dict = field(default_factory=dict)


class GridEnv:
    """Base of the grid games. Subclasses build their map in `__init__` from `self.rng` (seeded) and
    implement `_move(action) -> (reward, done, success)` and `render()`."""

    name = "grid"
    #: what the game is, for prompts (data_prep/grid_env.py puts it in the system message)
    RULES = ""

    def __init__(self, seed: int = 0, max_steps: int = 8):
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, not {max_steps}")
        self.seed = int(seed)
        self.rng = random.Random(f"{self.name}:{self.seed}")  # str seeds hash stably across processes
        self.max_steps = int(max_steps)
        self.steps = 0
        self.done = False
        self.success = False

    # ---- what subclasses give --------------------------------------------------------------------
    def render(self) -> str:
        raise NotImplementedError

    def _move(self, action: str) -> tuple[float, bool, bool]:
        raise NotImplementedError

    def _reset_state(self) -> None:
        raise NotImplementedError

    # ---- the episode -----------------------------------------------------------------------------
    def reset(self) -> str:
        """Back to the map's start; returns the first observation."""
        self._reset_state()
        self.steps, self.done, self.success = 0, False, False
        return self.render()

    def step(self, action: str | None) -> StepResult:
        """Apply `action` (None: a malformed turn; nothing moves, the step still counts). The episode ends
        on success, on failure (a hole) or after `max_steps` steps."""
        if self.done:
            raise RuntimeError("step() after the episode ended; call reset()")
        self.steps += 1
        reward, done, success = (0.0, False, False) if action is None else self._move(action)
        self.success = success
        self.done = done or self.steps >= self.max_steps
        info = {"steps": self.steps, "valid": action is not None, "action": action}
        return StepResult(self.render(), float(reward), self.done, success, info)

    @staticmethod
    def _grid_text(rows: list[list[str]]) -> str:
        return "\n".join("".join(r) for r in rows)

    @staticmethod
    def _neighbours(pos: tuple[int, int]):
        for action, (dr, dc) in ACTIONS.items():
            yield action, (pos[0] + dr, pos[1] + dc)
