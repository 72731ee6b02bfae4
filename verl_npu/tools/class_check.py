"""The classes a config names, imported and checked in a process of their own (`verl-npu validate
--check-paths`; the config side is `verl_npu.config.class_check`, which starts this module and reads
its answer, so that a module that crashes, exits or hangs while importing cannot take validate down).

    python -m verl_npu.tools.class_check '{"tool_config_path": ..., "interaction_config_path": ...,
                                           "function_tool_path": ...}'

prints one JSON line: a list of [key, what is wrong, how to fix it]. For each entry of the tool config
and of the interaction config the class is imported and checked to have the methods of a tool or an
interaction (`loading.named_class`; nothing is constructed, so no server or sandbox starts); the
function tool file is imported and its declarations read. Entries whose file has shape problems are
left to the config's own checks.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from verl_npu.errors import UserError

TOOLS = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
INTERACTIONS = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"
FUNCTIONS = "actor_rollout_ref.rollout.multi_turn.function_tool_path"


def _guarded(key: str, check) -> list[list[str]]:
    """[key, message, fix] rows for what `check()` raised; user code's SystemExit & co. included."""
    try:
        check()
    except UserError as err:
        return [[key, str(err), ""]]
    except BaseException as err:  # noqa: BLE001 - a user module's import may raise anything
        return [
            [
                key,
                f"checking the classes it names failed: {type(err).__name__}: {err}",
                "fix the module the class lives in",
            ]
        ]
    return []


def problems(paths: dict) -> list[list[str]]:
    from verl_npu.tool_registry import read_tool_config
    from verl_npu.tools.loading import tool_class

    out: list[list[str]] = []
    if paths.get("tool_config_path"):
        entries, shape = read_tool_config(paths["tool_config_path"])
        for entry in entries if not shape else []:
            out += _guarded(TOOLS, lambda e=entry: tool_class(e))
    if paths.get("interaction_config_path"):
        from verl_npu.config.interaction_file import read_interaction_config
        from verl_npu.tools.interactions.loading import interaction_class

        entries, shape = read_interaction_config(paths["interaction_config_path"])
        for entry in entries if not shape else []:
            out += _guarded(INTERACTIONS, lambda e=entry: interaction_class(e))
    if paths.get("function_tool_path"):
        from verl_npu.tools.function_tool import load_function_tools

        out += _guarded(FUNCTIONS, lambda: load_function_tools(paths["function_tool_path"]))
    for row in out:  # the key is in the row already: a message naming it again reads twice
        row[1] = row[1].removeprefix(row[0] + ": ")
    return out


def main(argv: list[str]) -> int:
    paths = json.loads(argv[0])
    chatter = io.StringIO()
    with contextlib.redirect_stdout(chatter):  # what user modules print at import is not the answer
        found = problems(paths)
    sys.stdout.write(json.dumps(found) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
