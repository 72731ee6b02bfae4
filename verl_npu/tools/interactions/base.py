"""verl's interaction interface, with verl's method names and meaning, so an interaction written for verl
ports by changing its import.

One interaction object serves a run (built from its interaction config entry, `config` with its `name`
added); each trajectory of a row that names it (`extra_info.interaction_kwargs.name`) is one instance:

    instance_id = start_interaction(instance_id, **interaction_kwargs)      # once, before the first turn
    should_terminate, response, score, metadata = generate_response(instance_id, messages, **interaction_kwargs)
    ...                                                                     # after every model turn without a tool call
    finalize_interaction(instance_id)                                       # once, when the trajectory ends

`messages` is the conversation so far as chat messages (the prompt's, then the model's turns as
`assistant` and earlier replies as `user`; tool turns as `tool`). `response` becomes the next user turn
(response mask 0: not trained); `score` is that turn's score (`turn_scores`, handed to the reward function
in `extra_info`); `should_terminate` ends the trajectory after the reply. `calculate_score(instance_id)` is
the interaction's own score of its state. Each method may be plain or `async def`.
"""

from __future__ import annotations

import uuid
from typing import Any


class BaseInteraction:
    """Base class of interactions (verl's `BaseInteraction`): override `generate_response`, and
    `start_interaction` / `calculate_score` / `finalize_interaction` where the interaction keeps state."""

    def __init__(self, config: dict[str, Any]):
        self.config = dict(config or {})
        self.name: str = self.config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs) -> str:
        return instance_id or str(uuid.uuid4())

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs
    ) -> tuple[bool, str, float, dict[str, Any]]:
        return False, "Go on.", 0.0, {}

    async def calculate_score(self, instance_id: str | None = None, **kwargs) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs) -> None:
        return None


def last_assistant_text(messages: list[dict[str, Any]]) -> str:
    """The content of the conversation's last assistant message ('' when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""
