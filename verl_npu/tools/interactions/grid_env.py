"""The `grid_env` interaction: a ROLL-style text environment (FrozenLake-like or Sokoban-like grid) as the
user side of a multi-turn conversation.

Configured in verl's interaction config file (class_name `grid_env`; config keys:
`verl_npu.config.interaction_file.GRID_ENV_KEYS`) and per row by `extra_info.interaction_kwargs`:

    {"name": "grid_env", "env": "frozen_lake", "seed": 7, "size": 3, "map": [...]}   # env options after seed

`start_interaction` builds the row's environment (`verl_npu.tools.envs.make_env(env, seed, **options)`,
options from the config's `env_config` updated by the row's own; None values are left out) and resets it.
All `rollout.n` trajectories of a row play the same seed: they are GRPO's group (ROLL's `group_size`).
The first observation is the prompt's (data_prep/grid_env.py writes it there).

After each model turn, `generate_response` reads one move from the turn (`verl_npu.tools.envs.parse_action`),
steps the environment, and replies with the new observation (`Not a move.` first when the turn was no
move: the environment did not move). The turn's score is the step's reward plus `format_penalty` for a
malformed turn. The trajectory ends when the episode ends: success, failure (a hole), or `max_steps`
steps. `calculate_score` is 1.0 for a won episode, else 0.0. Each reply's metadata records `success`,
`steps`, `valid` and `action` (the trajectory dump shows them per turn).

`max_tokens_per_turn` (config `max_tokens_per_step`, ROLL's name) tells the agent loop to cut a model turn
at that many tokens and read it as it is; the end-of-turn token is then the environment turn's first token.
"""

from __future__ import annotations

import uuid

from verl_npu.tools.envs import make_env, parse_action
from verl_npu.tools.interactions.base import BaseInteraction, last_assistant_text

DEFAULT_FORMAT_PENALTY = -0.1
DEFAULT_MAX_STEPS = 8
NOT_A_MOVE = "Not a move."
WON = "Solved."
LOST = "Failed."


class GridEnvInteraction(BaseInteraction):
    def __init__(self, config: dict):
        super().__init__(config)
        self.default_env = self.config.get("env") or "frozen_lake"
        self.env_config = dict(self.config.get("env_config") or {})
        self.max_steps = int(self.config.get("max_steps") or DEFAULT_MAX_STEPS)
        fp = self.config.get("format_penalty")
        self.format_penalty = float(DEFAULT_FORMAT_PENALTY if fp is None else fp)
        mt = self.config.get("max_tokens_per_step")
        self.max_tokens_per_turn = None if mt is None else int(mt)
        self._envs: dict = {}

    def make(self, env: str | None = None, seed: int = 0, **options):
        """The environment a row's interaction_kwargs describe (reset), without starting an instance."""
        merged = {**self.env_config, **{k: v for k, v in options.items() if v is not None}}
        merged.setdefault("max_steps", self.max_steps)
        made = make_env(env or self.default_env, int(seed or 0), **merged)
        made.reset()
        return made

    def start_interaction(self, instance_id: str | None = None, **kwargs) -> str:
        instance_id = instance_id or str(uuid.uuid4())
        kwargs.pop("name", None)
        self._envs[instance_id] = self.make(**kwargs)
        return instance_id

    def generate_response(self, instance_id: str, messages: list[dict], **kwargs) -> tuple[bool, str, float, dict]:
        env = self._envs[instance_id]
        action = parse_action(last_assistant_text(messages))
        result = env.step(action)
        score = result.reward + (self.format_penalty if action is None else 0.0)
        text = result.observation if action is not None else f"{NOT_A_MOVE}\n{result.observation}"
        if result.done:
            text += "\n" + (WON if result.success else LOST)
        return result.done, text, score, {**result.info, "success": result.success}

    def calculate_score(self, instance_id: str | None = None, **kwargs) -> float:
        return 1.0 if self._envs[instance_id].success else 0.0

    def finalize_interaction(self, instance_id: str | None = None, **kwargs) -> None:
        self._envs.pop(instance_id, None)
