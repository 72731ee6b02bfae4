"""The `dapo` reward manager's additions to the rule reward (`reward_model.reward_manager=dapo`).

verl 0.9.1's dapo manager scores each response like the naive one, then (with
`reward_model.reward_kwargs.overlong_buffer_cfg.enable`) adds DAPO's overlong penalty to the score:

    expected_len = max_resp_len - len
    exceed       = valid_response_length - expected_len
    penalty      = min(-exceed / len * penalty_factor, 0)

so a response no longer than `expected_len` tokens is not penalised, and the penalty falls linearly to
`-penalty_factor` at `max_resp_len` tokens. With `overlong_buffer_cfg.log` the reward extras
`overlong_reward` (the penalty) and `overlong` (1.0 when the penalty is below 0, else 0.0) are returned.
When the reward function returns no `acc` of its own, the extra `acc` is the score before the penalty
(verl's manager records it so for a reward function that returns a float).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verl_npu.config.typed import section
from verl_npu.registry import REWARD_MANAGERS


def overlong_penalty(
    valid_response_lengths: Sequence[int], buffer_len: int, max_resp_len: int, penalty_factor: float
) -> list[float]:
    """`min(-(L - (max_resp_len - buffer_len)) / buffer_len * penalty_factor, 0)` for each valid length L."""
    if buffer_len <= 0:
        raise ValueError(f"the overlong buffer length must be positive, got {buffer_len}")
    expected_len = max_resp_len - buffer_len
    return [
        min(-(int(length) - expected_len) / buffer_len * float(penalty_factor), 0.0)
        for length in valid_response_lengths
    ]


@REWARD_MANAGERS.register(
    "dapo",
    overlong_penalty=True,
    doc=(
        "the same, plus DAPO's overlong penalty (reward_model.reward_kwargs.overlong_buffer_cfg), and the reward "
        "extra 'acc' (the score) for functions that return a float"
    ),
)
def dapo_scores(
    scores: Sequence[float],
    extras: dict[str, list[float]],
    valid_response_lengths: Sequence[int],
    reward_kwargs: Any,
    max_response_length: int,
) -> tuple[list[float], dict[str, list[float]]]:
    """The dapo manager's `(scores, extras)` from the naive ones: `acc` added (the scores before any
    penalty) when the extras have no `acc` of the reward function's own; with `overlong_buffer_cfg.enable` the
    overlong penalty added to each score (and, with `log`, the extras `overlong_reward` and `overlong`).
    `reward_kwargs` is the `reward_model.reward_kwargs` section (typed, or a dict / OmegaConf node whose
    missing keys take the schema's defaults); its `max_resp_len` null means `max_response_length`."""
    reward_kwargs = section("reward_model.reward_kwargs", reward_kwargs)
    extras = dict(extras)
    extras.setdefault("acc", [float(s) for s in scores])
    cfg = reward_kwargs.overlong_buffer_cfg
    if not cfg.enable:
        return list(scores), extras
    max_resp_len = reward_kwargs.max_resp_len
    max_resp_len = max_resp_len if max_resp_len is not None else max_response_length
    penalties = overlong_penalty(valid_response_lengths, cfg.len, max_resp_len, cfg.penalty_factor)
    if cfg.log:
        extras["overlong_reward"] = penalties
        extras["overlong"] = [1.0 if p < 0 else 0.0 for p in penalties]
    return [float(s) + p for s, p in zip(scores, penalties)], extras
