"""The multi-turn rollout keys verl-npu reads (`actor_rollout_ref.rollout.multi_turn.*`, verl 0.9.1's names
and defaults), as plain data that `schema` turns into its `Key`s (this module imports nothing, so schema can
import it). How the loop uses them: `verl_npu.rollout.agent_loop` and docs/agents.md.

Each entry: (path below actor_rollout_ref.rollout, default, type name, meaning, Key options).
"""

from __future__ import annotations

from typing import Any

# A table: one call per key, kept one per line so that the keys read as rows (ruff format would put each
# argument on a line of its own).
# fmt: off

#: verl's agent loops a dataset row may name (`agent_name` column) or `agent.default_agent_loop` may be.
AGENT_LOOPS = ("single_turn_agent", "tool_agent")
#: tool-call formats parsed here: hermes, and SGLang's parser names of the same syntax, which verl's SGLang
#: scripts pass as multi_turn.format (SGLang's `qwen` and `qwen25` are its Qwen 2.5 detector: the
#: <tool_call>{"name": ..., "arguments": {...}}</tool_call> calls Hermes parsing reads; verl's Search-R1
#: example sets format: qwen)
FORMATS = ("hermes", "qwen", "qwen25")
#: verl's others, refused by name (verl 0.9.1's ToolParser registry: hermes, gpt-oss, qwen3_coder, glm, seed,
#: minimax, kimi, deepseek_v4, gemma4; "chatml": an older verl name)
UNSUPPORTED_FORMATS = ("llama3_json", "gpt-oss", "gpt_oss", "qwen3_coder", "gemma4", "deepseekv3", "glm4", "glm",
                       "seed", "minimax", "kimi", "deepseek_v4", "chatml")

KEYS: list[tuple[str, Any, str, str, dict]] = [
    ("multi_turn.enable", False, "bool", "Multi-turn rollout with tool calls: each response is a conversation of model turns "
     "and tool turns (generate, parse the Hermes tool calls, run the tools, append their output, generate again); "
     "tool tokens get response_mask 0 (not trained). rollout.name hf or vllm, text prompts (docs/agents.md).", {}),
    ("multi_turn.max_assistant_turns", None, "int", "Most model turns per trajectory; null: no limit but the token budget "
     "(rollout.response_length counts model and tool tokens together).", {"min": 1}),
    ("multi_turn.max_user_turns", None, "int", "Most tool (user-side) turns per trajectory; null: no limit but the token "
     "budget. The loop stops after the model turn that reaches it.", {"min": 1}),
    ("multi_turn.tool_config_path", None, "str", "verl's tool config YAML (tools: [{class_name, config, tool_schema}] with "
     "OpenAI function schemas); class_name: a built-in tool (gsm8k, or verl's verl.tools.gsm8k_tool.Gsm8kTool), "
     "path/to/file.py:ClassName or package.module.ClassName. null: no tools (one turn). The schemas go into "
     "the prompt through the chat template (tools=...).", {}),
    ("multi_turn.function_tool_path", None, "str", "A Python file whose @function_tool functions (from "
     "verl_npu.tools.function_tool import function_tool; verl's decorator) are tools too, next to those of "
     "tool_config_path (a name in both is refused); each function's schema comes from its type hints and "
     "docstring. Read with multi_turn.enable. null: none (docs/agents.md, 'Function tools').", {}),
    ("multi_turn.interaction_config_path", None, "str", "verl's interaction config YAML (interaction: [{name, class_name, "
     "config}]): after a model turn without a tool call, the row's interaction (extra_info.interaction_kwargs.name) "
     "answers as the next user turn (response_mask 0) with a score per turn (extra_info.turn_scores for the reward). "
     "class_name: a built-in (gsm8k, or verl's verl.interactions.gsm8k_interaction.Gsm8kInteraction; grid_env: "
     "the FrozenLake / Sokoban text environments), path/to/file.py:ClassName or package.module.ClassName. "
     "Read with multi_turn.enable; verl 0.9.1 dropped interactions, verl 0.5-0.8 scripts use this key. "
     "null: no interactions (docs/agents.md).", {}),
    ("multi_turn.max_parallel_calls", 1, "int", "Most tool calls of one model turn that run; later calls of that turn are "
     "ignored.", {"min": 1}),
    ("multi_turn.max_tool_response_length", 256, "int", "Longest tool output in characters; longer outputs are cut on "
     "tool_response_truncate_side with a '(truncated)' marker.", {"min": 1}),
    ("multi_turn.tool_response_truncate_side", "middle", "str", "Which part of a long tool output is cut: left (keep the "
     "end), right (keep the start) or middle (keep both ends).", {"choices": ("left", "middle", "right")}),
    ("multi_turn.format", "hermes", "str", "Tool-call format the model writes: hermes (<tool_call>{\"name\": ..., "
     "\"arguments\": {...}}</tool_call>, Qwen2.5 / Qwen3). qwen and qwen25 (SGLang's parser names for Qwen 2.5, "
     "which verl's SGLang scripts use) are the same syntax and read the same way.",
     {"choices": FORMATS, "unsupported": UNSUPPORTED_FORMATS, "instead": "use format=hermes with a model that "
      "writes Hermes tool calls (Qwen2.5 / Qwen3)"}),
    ("multi_turn.use_inference_chat_template", False, "bool", "verl: re-render earlier turns with the chat template the "
     "model is served with. verl-npu keeps the tokens the model generated (the false behaviour): training sees "
     "exactly what was sampled.", {"off_only": "re-rendering earlier turns with the inference chat template",
                                   "instead": "leave it false: the trajectory keeps the model's own tokens"}),
    ("multi_turn.tokenization_sanity_check_mode", "strict", "str", "Check that a tool turn tokenized on its own equals the "
     "end of the whole conversation tokenized at once: strict (token for token), ignore_strippable (whitespace-"
     "only tokens ignored), disable. A mismatch logs one warning; the turn's own tokens are used.",
     {"choices": ("strict", "ignore_strippable", "disable")}),
    ("multi_turn.tp_round_timeout_s", 600.0, "float", "verl-npu: rollout.name=vllm with tensor_model_parallel_size > 1: "
     "seconds the ranks of one engine wait for each other at the start of each round of the agent loop (the "
     "engine's first rank runs the round's tools and interactions while the others wait). A rank that does not "
     "arrive in time (it died, or a tool hangs) stops the run with an error naming it; a rank whose loop "
     "raises stops the others at once. null: wait as long as the process group allows.",
     {"gt": 0, "nullable": True}),
    ("agent.default_agent_loop", "single_turn_agent", "str", "Agent loop of dataset rows without an agent_name "
     "column: single_turn_agent (one response), tool_agent (the multi-turn loop with tools; needs "
     "multi_turn.enable), or a name of agent.agent_loop_config_path's file. A row's agent_name, when the data has "
     "that column, wins (verl's rule).", {}),
    ("agent.agent_loop_config_path", None, "str", "verl's custom agent loops: a YAML list of {name: <agent_name>, "
     "_target_: package.module.Class or path/to/file.py:Class, ...more constructor kwargs}; each class subclasses "
     "verl's AgentLoopBase (verl.experimental.agent_loop, provided by verl-npu while the file is imported) and its "
     "async run(sampling_params, **row) returns an AgentLoopOutput. Rows whose agent_name (else "
     "agent.default_agent_loop) is one of its names run through it, on the hf or vllm engine (text rows). null: "
     "none (docs/agents.md, 'Custom agent loops').", {}),
]
