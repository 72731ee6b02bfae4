"""A Sokoban-like grid (ROLL's SimpleSokoban, one box): push the box onto the target.

The room is `size` x `size` cells with a wall `#` all around; inside, `.` floor, `T` the target, `B` the
box (`*` when it stands on the target) and `P` the player (`+` on the target). A move into a wall does
nothing; a move into the box pushes it one cell unless a wall is behind it. Pushing the box onto the
target wins (reward 1.0, the episode ends); every other step has reward 0.0. The observation is the room
as text, one row per line, e.g. for size 5::

    #####
    #P..#
    #.B.#
    #..T#
    #####

The room comes from the seed (`random.Random("sokoban:<seed>")`): target, box and player on distinct
floor cells, the box off the room's corners, redrawn until the puzzle can be solved within
`max_solution` moves (default 8; a breadth-first search over player and box positions). The room
depends on the seed, `size` and `max_solution` only, not on the episode's `max_steps`, so the
interaction rebuilds the room the prompt shows whatever step limit it plays with.
"""

from __future__ import annotations

from collections import deque

from verl_npu.tools.envs.grid import ACTIONS, GridEnv


class Sokoban(GridEnv):
    name = "sokoban"
    RULES = "Push the box B onto the target T; you are P, # is a wall. Reply with one move: U, D, L or R."

    def __init__(self, seed: int = 0, size: int = 5, max_steps: int = 10, max_solution: int = 8):
        super().__init__(seed, max_steps)
        if not 4 <= int(size) <= 8:
            raise ValueError(f"size must be 4-8 (walls included), not {size}")
        self.size = int(size)
        inner = [(i, j) for i in range(1, self.size - 1) for j in range(1, self.size - 1)]
        # the box may not start where it can never move (two walls meet: a corner of the room)
        movable = [p for p in inner if not (p[0] in (1, self.size - 2) and p[1] in (1, self.size - 2))]
        while True:
            target = self.rng.choice(inner)
            box = self.rng.choice([p for p in movable if p != target])
            player = self.rng.choice([p for p in inner if p not in (target, box)])
            self.target, self.box_start, self.player_start = target, box, player
            solution = self.solve()
            if solution is not None and 0 < len(solution) <= int(max_solution):
                break
        self.box, self.player = box, player

    def _wall(self, pos) -> bool:
        return pos[0] <= 0 or pos[1] <= 0 or pos[0] >= self.size - 1 or pos[1] >= self.size - 1

    def _push(self, player, box, action):
        """(player, box) after `action` from (player, box)."""
        dr, dc = ACTIONS[action]
        nxt = (player[0] + dr, player[1] + dc)
        if self._wall(nxt):
            return player, box
        if nxt == box:
            beyond = (box[0] + dr, box[1] + dc)
            if self._wall(beyond):
                return player, box
            return nxt, beyond
        return nxt, box

    def solve(self) -> list[str] | None:
        """The moves of a shortest solution from the start, or None when there is none."""
        start = (self.player_start, self.box_start)
        prev, todo = {start: None}, deque([start])
        while todo:
            state = todo.popleft()
            if state[1] == self.target:
                moves = []
                while prev[state] is not None:
                    state, move = prev[state]
                    moves.append(move)
                return moves[::-1]
            for action in ACTIONS:
                nxt = self._push(*state, action)
                if nxt not in prev:
                    prev[nxt] = (state, action)
                    todo.append(nxt)
        return None

    def _reset_state(self) -> None:
        self.box, self.player = self.box_start, self.player_start

    def _move(self, action: str) -> tuple[float, bool, bool]:
        self.player, self.box = self._push(self.player, self.box, action)
        won = self.box == self.target
        return (1.0 if won else 0.0), won, won

    def render(self) -> str:
        rows = [["#" if self._wall((i, j)) else "." for j in range(self.size)] for i in range(self.size)]
        rows[self.target[0]][self.target[1]] = "T"
        rows[self.box[0]][self.box[1]] = "*" if self.box == self.target else "B"
        rows[self.player[0]][self.player[1]] = "+" if self.player == self.target else "P"
        return self._grid_text(rows)
