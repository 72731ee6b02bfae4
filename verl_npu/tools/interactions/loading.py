"""Building the interactions of an interaction config file (`multi_turn.interaction_config_path`): import
each class (built-in, the user's file, or a module), construct it with the entry's `config` plus its
`name`, and check it is an interaction.

Every problem is a `UserError` raised before any worker starts, naming the file, the entry's key
(`interaction[1].class_name`) and the fix.
"""

from __future__ import annotations

from typing import Any

from verl_npu.config.interaction_file import KEY, InteractionEntry, class_target, read_interaction_config
from verl_npu.errors import UserError
from verl_npu.tools.loading import checked_entries, named_class

METHODS = ("start_interaction", "generate_response")


def interaction_class(entry: InteractionEntry) -> type:
    return named_class(
        class_target(entry.class_name),
        entry.where,
        entry.class_name,
        KEY,
        METHODS,
        "an interaction",
        "Subclass verl_npu.tools.interactions.BaseInteraction (docs/agents.md, 'Writing an interaction')",
    )


def load_interactions(path) -> dict[str, Any]:
    """name -> interaction, for every entry of the file. Raises UserError listing every shape problem
    of the file, or the first entry that cannot be built."""
    entries = checked_entries(read_interaction_config, KEY, path)
    out: dict[str, Any] = {}
    for entry in entries:
        cls = interaction_class(entry)
        try:
            obj = cls(config={**entry.config, "name": entry.name})
        except Exception as err:
            raise UserError(
                f"{entry.where}: constructing {entry.class_name!r} failed: {type(err).__name__}: {err}. Fix its config"
            ) from None
        obj.name = entry.name
        out[entry.name] = obj
    return out
