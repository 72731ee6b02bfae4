"""Reward of grid-environment episodes (data_source `grid_env`; rows from data_prep/grid_env.py, played
through the `grid_env` interaction).

The score is the episode's return: the sum of the interaction's turn scores (`extra_info["turn_scores"]`,
which the trainer adds to a multi-turn row's extra_info): 1.0 for reaching the goal (FrozenLake) or
pushing the box onto the target (Sokoban), plus the interaction's `format_penalty` (default -0.1) for
every model turn that was not one move. Sub-scores: `accuracy` (1.0 when the episode was won: the
interaction's last metadata says `success`) and `invalid_moves` (how many turns were not a move). The
solution text itself is not read: the environment already judged every move.

`BLIND_BEST_SCORE` is the best expected accuracy of a policy that ignores the observations, for the CPU
demo's maps (`verl_npu.tools.envs.frozen_lake.corner_maps`, layout `corners`, 3 steps): the best fixed
move sequence wins one of the four maps (tests/tools/test_interactions.py tries every sequence). A success rate
clearly above it means the policy reads the grid.
"""

from __future__ import annotations

DATA_SOURCE = "grid_env"
BLIND_BEST_SCORE = 0.25  # not computed here: the environments sit above the rewards


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> dict:
    """{"score": the episode's return, "accuracy": 1.0 won / 0.0, "invalid_moves": count}."""
    info = extra_info or {}
    scores = [float(s) for s in (info.get("turn_scores") or [])]
    meta = info.get("interaction") or {}
    return {
        "score": float(sum(scores)),
        "accuracy": 1.0 if meta.get("success") else 0.0,
        "invalid_moves": float(sum(1 for s in scores if s < 0)),
    }
