"""verl 0.9.1's custom agent-loop interface, for users' loop files (`rollout.agent.agent_loop_config_path`).

A user's loop is a subclass of `AgentLoopBase` whose `async run(sampling_params, **row)` drives the model
itself, one trajectory per call: it awaits `self.server_manager.generate(request_id, prompt_ids=...,
sampling_params=...)` (a `TokenOutput`: the sampled token ids and their log-probs) as often as it likes and
returns an `AgentLoopOutput` (prompt ids, response ids, a response mask of 1 on the model's tokens and 0 on
tokens it added itself, their log-probs, the turn count, metrics, extra fields). The classes here take the
same constructor arguments and fields as verl's (tests/rollout/test_agent_loop_api_parity.py compares them
with verl's source), so a file written against verl runs unchanged:

- `verl_compat_modules()` makes `verl.experimental.agent_loop` and `verl.experimental.agent_loop.agent_loop`
  resolve to this module while verl-npu imports a user's loop file, and only then (the previous
  `sys.modules` entries are put back afterwards, so an installed verl is neither replaced nor needed);
- a file may also import from `verl_npu.rollout.agent_loop_api` directly.

How a configured loop is found and run: `verl_npu.rollout.custom_loops` (loading, the batched generation
handle, the training rows) and docs/agents.md, "Custom agent loops".
"""

from __future__ import annotations

import contextlib
import sys
import types
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: agent_name -> {"_target_": "module.Class"} of the classes loop modules decorated with `register` (verl's
#: registry of the same name). verl-npu runs the loops the agent_loop_config_path file lists; the decorator is
#: here so that verl-written files import unchanged, and the names it records are not loops by themselves
_agent_loop_registry: dict[str, dict] = {}


def register(agent_name: str):
    """Class decorator recording `agent_name` -> the class's path in `_agent_loop_registry` (as verl's does);
    the class is returned unchanged."""

    def decorator(subclass: type) -> type:
        _agent_loop_registry[agent_name] = {"_target_": f"{subclass.__module__}.{subclass.__qualname__}"}
        return subclass

    return decorator


@dataclass
class AgentLoopMetrics:
    """Timings a loop may report (seconds), as verl names them; num_preempted -1: not available."""

    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    compute_score: float = 0.0
    num_preempted: int = -1

    def model_dump(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class TokenOutput:
    """What `server_manager.generate` returns: the sampled `token_ids` (up to and including the end-of-turn
    token when the model wrote one), their `log_probs` (as sampled), `stop_reason` ('completed': an end-of-turn
    token; 'length': the token limit)."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    routed_experts: Any = None
    stop_reason: str | None = None
    num_preempted: int | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


class AgentLoopOutput:
    """One trajectory, as a loop's `run` returns it (verl's fields; keyword arguments only).

    prompt_ids: the prompt's token ids; response_ids: every token after it (the model's and the loop's own);
    response_mask: 1 on the model's tokens (trained), 0 on the loop's (tool / environment / user turns), one
    per response id; response_logprobs: the sampled log-probs (0 on mask-0 tokens), or None; multi_modal_data:
    must be empty (pictures in custom loops are not built); reward_score: the trajectory's score if the loop
    computed one (it then replaces the reward function's); num_turns: user + assistant + tool turns;
    metrics: `AgentLoopMetrics` or a dict of its fields; extra_fields: any further per-trajectory values."""

    FIELDS = (
        "prompt_ids",
        "response_ids",
        "response_mask",
        "response_logprobs",
        "routed_experts",
        "multi_modal_data",
        "reward_score",
        "num_turns",
        "metrics",
        "extra_fields",
        "mm_processor_kwargs",
        "mm_processor_output",
    )

    def __init__(
        self,
        *,
        prompt_ids: list[int],
        response_ids: list[int],
        response_mask: list[int],
        metrics: AgentLoopMetrics | dict,
        response_logprobs: list[float] | None = None,
        routed_experts: Any = None,
        multi_modal_data: dict[str, Any] | None = None,
        reward_score: float | None = None,
        num_turns: int = 0,
        extra_fields: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        mm_processor_output: list | None = None,
    ):
        self.prompt_ids, self.response_ids, self.response_mask = prompt_ids, response_ids, response_mask
        self.response_logprobs, self.routed_experts = response_logprobs, routed_experts
        self.multi_modal_data, self.reward_score, self.num_turns = multi_modal_data, reward_score, num_turns
        self.metrics = metrics if isinstance(metrics, AgentLoopMetrics) else AgentLoopMetrics(**dict(metrics or {}))
        self.extra_fields = dict(extra_fields or {})
        self.mm_processor_kwargs, self.mm_processor_output = mm_processor_kwargs, mm_processor_output

    def model_dump(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.FIELDS}
        out["metrics"] = self.metrics.model_dump()
        return out

    def as_dict(self) -> dict[str, Any]:
        """The fields as verl's postprocessing names them (prompts, responses, response_mask, rollout_log_probs
        as tensors; the rest as they are)."""
        import torch

        out = self.model_dump()
        out["prompts"] = torch.tensor(out.pop("prompt_ids"), dtype=torch.int64)
        out["responses"] = torch.tensor(out.pop("response_ids"), dtype=torch.int64)
        out["response_mask"] = torch.tensor(out.pop("response_mask"), dtype=torch.int64)
        logprobs = out.pop("response_logprobs")
        if logprobs is not None:
            out["rollout_log_probs"] = torch.tensor(logprobs, dtype=torch.float32)
        return out


class DictConfigWrap:
    """A config handed to a loop's constructor (`.config`), as verl wraps it."""

    def __init__(self, config: Any):
        self.config = config


@dataclass
class MergeResult:
    """Token ids after a merge (`ct_merge_*`): the context so far, the new tokens at its end."""

    token_ids: list[int]


class AgentLoopBase(ABC):
    """Base of a user's agent loop (verl's constructor arguments; see the module docstring).

    Attributes a loop reads: `config` (the whole recipe's backend config, attribute access by verl's key names),
    `rollout_config` (`config.actor_rollout_ref.rollout`), `server_manager` (the generation handle),
    `tokenizer`, `processor` (None for text models), `data_config` (`config.data`), `dataset_cls` (None),
    `apply_chat_template_kwargs` (data.apply_chat_template_kwargs)."""

    def __init__(
        self,
        trainer_config: DictConfigWrap,
        server_manager: Any,
        tokenizer: Any,
        processor: Any,
        dataset_cls: Any = None,
        data_config: DictConfigWrap | None = None,
        hf_model_type: str | None = None,
        **kwargs,
    ):
        self.config = trainer_config.config
        self.rollout_config = self.config.actor_rollout_ref.rollout
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.dataset_cls = dataset_cls
        self.data_config = data_config.config if data_config is not None else self.config.data
        self.apply_chat_template_kwargs = dict(getattr(self.data_config, "apply_chat_template_kwargs", None) or {})
        self.mm_processor_kwargs: dict = {}
        self.hf_model_type = hf_model_type

    # ---- pictures: not built for custom loops (text rows only, refused before start) -----------------
    def _assert_mm_supported(self, has_multi_modal: bool) -> None:
        if has_multi_modal:
            raise ValueError("pictures in a custom agent loop are not built in verl-npu (text rows only)")

    def _get_mm_processor_kwargs(self, audio_data: list | None = None) -> dict[str, Any]:
        return dict(self.mm_processor_kwargs)

    async def process_vision_info(self, messages: list[dict]) -> dict:
        return await self.process_multi_modal_info(messages)

    async def process_multi_modal_info(self, messages: list[dict]) -> dict:
        """{} for text messages; a message with picture, video or audio parts raises (not built here)."""
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") != "text" for p in content):
                self._assert_mm_supported(True)
        return {}

    @staticmethod
    def build_sglang_video_payload(videos, mm_inputs: dict[str, Any]) -> list | None:
        return None  # no videos here (and no SGLang)

    # ---- tokens ----------------------------------------------------------------------------------
    def _render_ids(self, messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            list(messages),
            tools=tools,
            add_generation_prompt=generation_prompt,
            tokenize=True,
            **self.apply_chat_template_kwargs,
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # newer transformers may return a BatchEncoding
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    async def ct_build_initial_tokens(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        images: list | None = None,
        videos: list | None = None,
        audios: list | None = None,
        mm_inputs_out: dict | None = None,
    ) -> list[int]:
        """The prompt's token ids: `messages` rendered by the chat template with the generation prompt (and
        `tools`' schemas), the start cut off beyond `rollout.prompt_length`."""
        self._assert_mm_supported(bool(images or videos or audios))
        return self._cap_text_prompt_length(self._render_ids(messages, tools, True))

    async def ct_merge_assistant_token(
        self,
        runtime_token_ids: list[int],
        assistant_token_ids: list[int],
        response_mask: list[int],
        response_logprobs: list[float] | None = None,
        assistant_logprobs: list[float] | None = None,
    ):
        """(the context with the model's tokens appended, the mask with 1 per new token, the log-probs with
        theirs appended, or None when `response_logprobs` is None)."""
        new = [int(t) for t in assistant_token_ids]
        logprobs = None
        if response_logprobs is not None:
            logprobs = list(response_logprobs) + (list(assistant_logprobs) if assistant_logprobs else [0.0] * len(new))
        return MergeResult(list(runtime_token_ids) + new), list(response_mask) + [1] * len(new), logprobs

    async def ct_merge_context_msg(
        self,
        previous_messages: list[dict],
        updated_messages: list[dict],
        runtime_token_ids: list[int],
        response_mask: list[int],
        response_logprobs: list[float] | None = None,
        tools: list[dict] | None = None,
    ):
        """(the context with the messages appended after `previous_messages` rendered as the chat template
        writes them, up to the next generation prompt; mask 0 and log-prob 0 per new token). The new tokens
        are those the template adds for `updated_messages` beyond `previous_messages` (without a generation
        prompt), as token ids of the rendered text's difference."""
        before = self.tokenizer.apply_chat_template(
            list(previous_messages),
            tools=tools,
            tokenize=False,
            add_generation_prompt=False,
            **self.apply_chat_template_kwargs,
        )
        after = self.tokenizer.apply_chat_template(
            list(updated_messages),
            tools=tools,
            tokenize=False,
            add_generation_prompt=True,
            **self.apply_chat_template_kwargs,
        )
        if not after.startswith(before):
            raise ValueError(
                "the chat template renders the earlier messages differently once messages are "
                "appended; append the new turn's tokens yourself"
            )
        new = self.tokenizer(after[len(before) :], add_special_tokens=False)["input_ids"]
        logprobs = None if response_logprobs is None else list(response_logprobs) + [0.0] * len(new)
        return MergeResult(list(runtime_token_ids) + list(new)), list(response_mask) + [0] * len(new), logprobs

    def _cap_text_prompt_length(self, prompt_ids: list[int]) -> list[int]:
        limit = int(self.rollout_config.prompt_length)
        return list(prompt_ids)[-limit:] if len(prompt_ids) > limit else list(prompt_ids)

    @abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        """One trajectory of the row whose fields are `kwargs` (raw_prompt_ids, raw_prompt when
        data.return_raw_chat, extra_info, tools_kwargs, data_source, reward_model..., agent_name); returns
        its `AgentLoopOutput`."""
        raise NotImplementedError


#: the module names a verl-written loop file imports this interface under
VERL_NAMES = ("verl.experimental.agent_loop", "verl.experimental.agent_loop.agent_loop")


@contextlib.contextmanager
def verl_compat_modules() -> Iterator[None]:
    """While inside: `import verl.experimental.agent_loop[.agent_loop]` gives this module (and, when verl is
    not installed, `verl` and `verl.experimental` are empty packages that hold nothing else, so any other verl
    import still fails by name). The entries that were there before are restored on exit."""
    this = sys.modules[__name__]
    names = ("verl", "verl.experimental", *VERL_NAMES)
    saved = {name: sys.modules.get(name) for name in names}
    try:
        import importlib.util

        installed = importlib.util.find_spec("verl") is not None
    except (ImportError, ValueError):
        installed = False
    try:
        if not installed:
            for name in ("verl", "verl.experimental"):
                package = types.ModuleType(name, "stand-in: only verl.experimental.agent_loop exists here")
                package.__path__ = []
                sys.modules[name] = package
        for name in VERL_NAMES:
            sys.modules[name] = this
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
