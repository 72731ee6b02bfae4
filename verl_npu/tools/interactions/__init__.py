"""Interactions (verl's multi-turn "user" side): after each model turn that calls no tool, the row's
interaction reads the conversation and answers as the next user turn, with a score for the turn.

`BaseInteraction` (verl's names and meaning), the built-ins `gsm8k` (`Gsm8kInteraction`) and `grid_env`
(`GridEnvInteraction`, ROLL-style environments), and `load_interactions` (verl's interaction config file).
"""

from verl_npu.tools.interactions.base import BaseInteraction

__all__ = ["BaseInteraction"]
