"""Multi-turn rollout rules (`actor_rollout_ref.rollout.multi_turn.*`), added to `rules.RULES`: what the
agent loop runs with (either rollout engine, hf or vllm; a rule reward; stopping at the end-of-turn token), each refusal naming the key and what to do instead; and the tool config file's shape
(`tool_config_problems`, read by `paths.check_paths`: `verl-npu validate --check-paths` and `verl-npu run`).
"""

from __future__ import annotations

from collections.abc import Iterator

from verl_npu.config.rules import ROLL, Ctx, _rule
from verl_npu.config.tree import BC, get
from verl_npu.errors import Problem
from verl_npu.registry import ROLLOUT_ENGINES, image_engines
from verl_npu.tool_registry import IMAGE_TOOLS, read_tool_config

MT = ROLL + "multi_turn."
_KEYS = (
    MT + "enable",
    MT + "tool_config_path",
    MT + "interaction_config_path",
    MT + "function_tool_path",
    ROLL + "ignore_eos",
    BC + "reward_model.enable",
    ROLL + "agent.default_agent_loop",
)


@_rule(
    "multi_turn",
    _KEYS,
    "multi_turn.enable runs with a rule reward and ignore_eos=false (rollout.name hf "
    "or vllm); multi_turn.tool_config_path is read only with multi_turn.enable",
)
def _multi_turn(c: Ctx) -> Iterator[Problem]:
    if not c(MT + "enable"):
        if c(ROLL + "agent.default_agent_loop") == "tool_agent":
            yield Problem(
                ROLL + "agent.default_agent_loop",
                "is tool_agent, but multi_turn.enable is false",
                "set actor_rollout_ref.rollout.multi_turn.enable=true (and multi_turn.tool_config_path)",
            )
        if c(MT + "interaction_config_path"):
            c.warnings.append(
                "actor_rollout_ref.rollout.multi_turn.interaction_config_path is set but "
                "multi_turn.enable is false: the interactions are not used"
            )
        for name in ("tool_config_path", "function_tool_path"):
            if c(MT + name):
                c.warnings.append(
                    f"actor_rollout_ref.rollout.multi_turn.{name} is set but multi_turn.enable "
                    "is false: the tools are not used"
                )
        return
    if c(BC + "reward_model.enable"):
        yield Problem(
            BC + "reward_model.enable",
            "a reward model cannot score multi-turn trajectories yet",
            "score them with a rule reward (custom_reward_function.path, or the data source's built-in)",
        )
    if c(ROLL + "ignore_eos"):
        yield Problem(
            ROLL + "ignore_eos",
            "is true, but a model turn ends at its end-of-turn token in multi-turn rollout",
            "set actor_rollout_ref.rollout.ignore_eos=false",
        )


def _config_file_problems(cfg, name: str, read, fix: str) -> list[Problem]:
    """Problems `read(path)` finds in the file at multi_turn.`name` (read only with multi_turn.enable),
    each as a Problem at that key with `fix`."""
    key = MT + name
    path = get(cfg, key)
    if not path or not get(cfg, MT + "enable"):
        return []
    _, problems = read(path)
    return [Problem(key, f"{where}: {what}", fix) for where, what in problems]


def interaction_config_problems(cfg) -> list[Problem]:
    """The interaction config file's problems (missing, not YAML, wrong shape, unknown class, a grid_env
    config with ROLL keys or bad values), each naming the file and the entry's key; nothing is imported."""
    from verl_npu.config.interaction_file import read_interaction_config

    return _config_file_problems(
        cfg,
        "interaction_config_path",
        read_interaction_config,
        "fix the interaction config file (format: docs/agents.md, 'Interactions')",
    )


def function_tool_problems(cfg) -> list[Problem]:
    """multi_turn.function_tool_path naming no file (read only with multi_turn.enable). What the file declares
    is checked when `run` imports it (verl_npu.tools.function_tool), before any worker starts."""
    from pathlib import Path

    path = get(cfg, MT + "function_tool_path")
    if not path or not get(cfg, MT + "enable") or Path(str(path)).expanduser().is_file():
        return []
    return [
        Problem(
            MT + "function_tool_path",
            f"file {str(path)!r} does not exist (relative paths start at the folder the run starts in)",
            "point it at a .py file with @function_tool functions",
        )
    ]


def tool_config_problems(cfg) -> list[Problem]:
    """The tool config file's problems (missing, not YAML, wrong shape, unknown class, schema errors),
    each naming the file and the entry's key, and image tools on an engine that takes no images in a
    conversation (only `hf` does); nothing is imported."""
    problems = _config_file_problems(
        cfg,
        "tool_config_path",
        read_tool_config,
        "fix the tool config file (format: docs/agents.md, 'Tool config file')",
    )
    path, engine = get(cfg, MT + "tool_config_path"), get(cfg, ROLL + "name")
    spec = ROLLOUT_ENGINES.find(engine)
    if problems or not path or not get(cfg, MT + "enable") or spec is None or spec.images_in_multiturn:
        return problems
    entries, _ = read_tool_config(path)
    for entry in entries:
        if entry.builtin in IMAGE_TOOLS:
            problems.append(
                Problem(
                    ROLL + "name",
                    f"is {engine!r}, but {entry.where} ({entry.class_name}) replies "
                    "with images, and multi-turn rollout with images runs on the "
                    f"{' / '.join(image_engines())} engine only",
                    f"set actor_rollout_ref.rollout.name={image_engines()[0]}",
                )
            )
    return problems


AGENT = ROLL + "agent."


@_rule(
    "custom_agent_loops",
    (
        AGENT + "default_agent_loop",
        AGENT + "agent_loop_config_path",
        ROLL + "name",
        ROLL + "tensor_model_parallel_size",
    ),
    "agent.default_agent_loop is a built-in loop or one of agent.agent_loop_config_path's; custom loops run on "
    "one-rank engines",
)
def _custom_agent_loops(c: Ctx) -> Iterator[Problem]:
    from verl_npu.config.schema_multiturn import AGENT_LOOPS

    default, path = c(AGENT + "default_agent_loop"), c(AGENT + "agent_loop_config_path")
    if default not in AGENT_LOOPS and not path:
        yield Problem(
            AGENT + "default_agent_loop",
            f"is {default!r}, not an agent loop verl-npu has "
            f"({', '.join(AGENT_LOOPS)}) and no agent.agent_loop_config_path names custom ones",
            "use one of those, or name your loop's file in actor_rollout_ref.rollout.agent."
            "agent_loop_config_path (docs/agents.md, 'Custom agent loops')",
        )
    if (
        path
        and ROLLOUT_ENGINES.find(c(ROLL + "name")) is not None
        and int(c(ROLL + "tensor_model_parallel_size") or 1) > 1
    ):
        yield Problem(
            AGENT + "agent_loop_config_path",
            "custom agent loops on a tensor-parallel rollout engine are "
            "not implemented (their trajectories would have to be shared between the engine's ranks)",
            "set actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        )


def agent_loop_config_problems(cfg) -> list[Problem]:
    """The agent loop config file's problems (missing, not YAML, wrong shape), and a default_agent_loop that is
    neither built in nor in it; nothing is imported."""
    from verl_npu.config.agent_loop_file import KEY, read_agent_loop_config
    from verl_npu.config.schema_multiturn import AGENT_LOOPS

    path = get(cfg, BC + KEY)
    if not path:
        return []
    entries, problems = read_agent_loop_config(path)
    out = [
        Problem(BC + KEY, f"{where}: {what}", "fix the file (format: docs/agents.md, 'Custom agent loops')")
        for where, what in problems
    ]
    default = get(cfg, ROLL + "agent.default_agent_loop")
    names = [e.name for e in entries]
    if not problems and default not in AGENT_LOOPS and default not in names:
        out.append(
            Problem(
                ROLL + "agent.default_agent_loop",
                f"is {default!r}: neither a built-in agent loop "
                f"({', '.join(AGENT_LOOPS)}) nor a name in {path} ({', '.join(names)})",
                "name one of them",
            )
        )
    return out
