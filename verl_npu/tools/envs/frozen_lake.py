"""A FrozenLake-like grid (ROLL's FrozenLake, non-slippery): walk from the start to the goal without
stepping into a hole.

The map is `size` x `size` cells: `.` frozen (safe), `H` hole, `G` goal; the player is `P`. A move that
would leave the grid does nothing. Stepping onto `G` wins (reward 1.0, the episode ends); onto `H` loses
(reward 0.0, the episode ends); every other step has reward 0.0. The observation is the grid as text,
one row per line, e.g. for size 3::

    P..
    .H.
    ..G

`show_goal` adds a last line about the goal, in a form a small model reads without counting characters
(the grid stays above it): `positions` gives the player's and the goal's row and column (0-based),
`P 1 1 G 0 2`; `direction` gives the moves that bring the player closer to the goal, `G: U R` (up and
right; `G:` alone on the goal). `show_grid: false` leaves the grid out (then the observation is the
`show_goal` line alone). The CPU demo uses `direction` without the grid.

The map comes from the seed (`random.Random("frozen_lake:<seed>")`): start and goal on distinct cells,
each other cell a hole with probability `hole_ratio`, redrawn until a path from start to goal exists;
or it is given as `map` (rows of `.`, `H`, `G` and one `S` for the start). Slippery ice (ROLL's
`is_slippery`) is not built. `corner_maps` are the CPU demo's maps (data_prep/grid_env.py's `corners` layouts).
"""

from __future__ import annotations

from collections import deque

from verl_npu.tools.envs.grid import GridEnv


class FrozenLake(GridEnv):
    name = "frozen_lake"
    # no move letters here: a model that copies a move from its context should find them only in the
    # observation (show_goal's direction line), not in this constant text
    RULES = "Move P to G; H is a hole. Reply with one move, a capital letter: up, down, left or right."

    def __init__(
        self,
        seed: int = 0,
        size: int = 4,
        hole_ratio: float = 0.2,
        map: list[str] | None = None,
        max_steps: int = 8,
        show_goal: str | None = None,
        show_grid: bool = True,
    ):
        super().__init__(seed, max_steps)
        if not show_grid and not show_goal:
            raise ValueError(
                "show_grid: false needs show_goal (positions or direction): the observation would be empty"
            )
        self.show_grid = bool(show_grid)
        if show_goal not in (None, "positions", "direction"):
            raise ValueError(f"show_goal must be positions, direction or null, not {show_goal!r}")
        self.show_goal = show_goal
        if map is not None:
            self.cells, self.start = self._from_map(list(map))
        else:
            if not 2 <= int(size) <= 10:
                raise ValueError(f"size must be 2-10, not {size}")
            if not 0.0 <= float(hole_ratio) < 1.0:
                raise ValueError(f"hole_ratio must be in [0, 1), not {hole_ratio}")
            self.cells, self.start = self._generate(int(size), float(hole_ratio))
        self.size = len(self.cells)
        self.pos = self.start

    @staticmethod
    def _from_map(rows: list[str]) -> tuple[list[list[str]], tuple[int, int]]:
        if not rows or any(len(r) != len(rows[0]) for r in rows) or any(set(r) - set(".HGS") for r in rows):
            raise ValueError(f"map must be rows of equal length made of '.', 'H', 'G', 'S': {rows}")
        starts = [(i, j) for i, r in enumerate(rows) for j, c in enumerate(r) if c == "S"]
        goals = sum(r.count("G") for r in rows)
        if len(starts) != 1 or goals != 1:
            raise ValueError(f"map needs exactly one S and one G: {rows}")
        cells = [["." if c == "S" else c for c in r] for r in rows]
        return cells, starts[0]

    def _generate(self, size: int, hole_ratio: float) -> tuple[list[list[str]], tuple[int, int]]:
        every = [(i, j) for i in range(size) for j in range(size)]
        while True:
            start, goal = self.rng.sample(every, 2)
            cells = [["." for _ in range(size)] for _ in range(size)]
            cells[goal[0]][goal[1]] = "G"
            for i, j in every:
                if (i, j) not in (start, goal) and self.rng.random() < hole_ratio:
                    cells[i][j] = "H"
            if self._reachable(cells, start):
                return cells, start

    def _reachable(self, cells, start) -> bool:
        seen, todo = {start}, deque([start])
        while todo:
            pos = todo.popleft()
            if cells[pos[0]][pos[1]] == "G":
                return True
            for _, nxt in self._neighbours(pos):
                if self._inside(nxt, len(cells)) and nxt not in seen and cells[nxt[0]][nxt[1]] != "H":
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    @staticmethod
    def _inside(pos, size) -> bool:
        return 0 <= pos[0] < size and 0 <= pos[1] < size

    def shortest_path(self) -> list[str]:
        """The moves of a shortest safe path from the start to the goal (for tests and scripted play)."""
        prev, todo = {self.start: None}, deque([self.start])
        while todo:
            pos = todo.popleft()
            if self.cells[pos[0]][pos[1]] == "G":
                moves = []
                while prev[pos] is not None:
                    pos, move = prev[pos]
                    moves.append(move)
                return moves[::-1]
            for move, nxt in self._neighbours(pos):
                if self._inside(nxt, self.size) and nxt not in prev and self.cells[nxt[0]][nxt[1]] != "H":
                    prev[nxt] = (pos, move)
                    todo.append(nxt)
        return []

    def _reset_state(self) -> None:
        self.pos = self.start

    def _move(self, action: str) -> tuple[float, bool, bool]:
        nxt = next(p for a, p in self._neighbours(self.pos) if a == action)
        if self._inside(nxt, self.size):
            self.pos = nxt
        cell = self.cells[self.pos[0]][self.pos[1]]
        if cell == "G":
            return 1.0, True, True
        return 0.0, cell == "H", False

    def render(self) -> str:
        rows = [list(r) for r in self.cells]
        rows[self.pos[0]][self.pos[1]] = "P"
        text = self._grid_text(rows) if self.show_grid else ""
        if self.show_goal:
            goal = next((i, j) for i, r in enumerate(self.cells) for j, c in enumerate(r) if c == "G")
            if self.show_goal == "positions":
                text += f"\nP {self.pos[0]} {self.pos[1]} G {goal[0]} {goal[1]}"
            else:
                vertical = "U" if goal[0] < self.pos[0] else "D" if goal[0] > self.pos[0] else ""
                horizontal = "L" if goal[1] < self.pos[1] else "R" if goal[1] > self.pos[1] else ""
                text += "\nG:" + "".join(" " + m for m in (vertical, horizontal) if m)
        return text.lstrip("\n")


def corner_maps(holes: bool) -> list[list[str]]:
    """3x3 maps, start in the middle, the goal in one of the four corners (4 maps); with `holes`, each also
    with a hole on one of its two shortest paths (12 maps: the hole decides the order of the two moves)."""
    maps = []
    for gi, gj in ((0, 0), (0, 2), (2, 0), (2, 2)):
        variants = [None]
        if holes:  # the cell next to the goal on the row-first path, then on the column-first path
            variants += [(gi, 1), (1, gj)]
        for hole in variants:
            rows = [["." for _ in range(3)] for _ in range(3)]
            rows[1][1], rows[gi][gj] = "S", "G"
            if hole:
                rows[hole[0]][hole[1]] = "H"
            maps.append(["".join(r) for r in rows])
    return maps
