"""Cross-key rules of the vLLM engine arguments: what vLLM itself refuses at engine start (scheduler token
budget, seeded chunked prefill, engine_kwargs entries, TP against the model's heads, the model length),
checked before anything starts; registered in `rules.RULES`.

Kept apart from `rules.py` so that each file stays small; `paths` (and so `loader`) imports this module,
which registers its rules. The engine gets the rollout keys, then actor_rollout_ref.rollout.engine_kwargs.vllm
(which already holds the top-level engine_kwargs.vllm) on top: a non-null engine_kwargs entry wins over the
rollout key.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from verl_npu.config.modelinfo import model_heads, model_length_limit
from verl_npu.config.rules import _LENS, _NAME, _TP, Ctx, _device, _rule
from verl_npu.config.schema import TP_SIZES
from verl_npu.config.tree import BC, DATA, ROLL, TRAINER, SkipRule
from verl_npu.errors import Problem
from verl_npu.registry import ROLLOUT_ENGINES

_EK, _TOP_EK = ROLL + "engine_kwargs.vllm", "engine_kwargs.vllm"
_VLLM_INPUTS = (_NAME, _EK, _TOP_EK)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class _Arg:
    """One effective vLLM engine argument: its value and the key that set it."""

    value: Any
    key: str  # full key that set it (an engine_kwargs entry or the rollout key)
    user_set: bool  # set by the user (recipe, command line or engine_kwargs), not a default / derived

    @property
    def short(self) -> str:
        return self.key.removeprefix(BC)


def vllm_arg(c: Ctx, arg: str, rollout_key: str | None = None) -> _Arg | None:
    """The value the vllm engine gets for `arg`: engine_kwargs.vllm.<arg> when given, else the
    rollout key (None: neither)."""
    merged, top = c(_EK) or {}, c(_TOP_EK) or {}
    if merged.get(arg) is not None:
        key = f"{_TOP_EK}.{arg}" if top.get(arg) is not None else f"{_EK}.{arg}"
        if key in c.bad:
            raise SkipRule(key)
        return _Arg(merged[arg], key, True)
    if rollout_key is None:
        return None
    key = ROLL + rollout_key
    return _Arg(c(key), key, key in c.user_keys)


def _vllm_rule(name: str, keys: tuple[str, ...], text: str):
    """`_rule` for a rule of the vllm rollout (`keys` holds rollout.name): its check runs only when
    actor_rollout_ref.rollout.name is vllm (the other engines get none of these engine arguments)."""

    def register(fn: Callable[[Ctx], Iterator[Problem]]):
        def check(c: Ctx) -> Iterator[Problem]:
            if ROLLOUT_ENGINES.spec(c(_NAME)).engine_arguments:
                yield from fn(c)

        _rule(name, keys, text)(check)
        return fn

    return register


#: what the two vLLM scheduler rules read
_SCHEDULER_INPUTS = (
    _VLLM_INPUTS
    + (TRAINER + "device",)
    + tuple(ROLL + k for k in ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "enable_chunked_prefill"))
    + _LENS
)


def _scheduler_args(c: Ctx):
    """What vLLM's scheduler gets (engine_kwargs.vllm wins over the rollout key): the token budget,
    max_num_seqs, max_model_len and enable_chunked_prefill, then the sequence length the engine holds
    (max_model_len when set, else prompt + response)."""
    tokens, seqs, model_len, chunked = (
        cast(_Arg, vllm_arg(c, name, name))
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "enable_chunked_prefill")
    )
    length = model_len.value if _int(model_len.value) and model_len.value > 0 else c.seq_len
    return tokens, seqs, model_len, chunked, length


@_vllm_rule(
    "vllm_scheduler",
    _SCHEDULER_INPUTS,
    "vllm rollout (engine_kwargs.vllm entries win over the rollout keys): max_num_batched_tokens >= "
    "max_num_seqs; max_num_batched_tokens >= max_model_len when enable_chunked_prefill=false; "
    "max_model_len from engine_kwargs >= max_prompt_length + max_response_length; engine_kwargs "
    "max_num_active_seqs <= max_num_seqs and long_prefill_token_threshold <= max_model_len",
)
def _vllm_scheduler(c: Ctx) -> Iterator[Problem]:
    tokens, seqs, model_len, chunked, length = _scheduler_args(c)
    if _int(tokens.value) and _int(seqs.value) and tokens.value < seqs.value:
        blame = seqs if seqs.user_set and not tokens.user_set else tokens
        yield Problem(
            blame.key,
            f"max_num_batched_tokens {tokens.value} ({tokens.short}) is below max_num_seqs "
            f"{seqs.value} ({seqs.short}): vLLM refuses to start an engine whose token budget cannot "
            "give every running sequence a token",
            f"set {seqs.short}<={tokens.value} or raise {tokens.short} to at least {seqs.value}",
        )
    if (
        model_len.key != ROLL + "max_model_len"
        and _int(model_len.value)
        and model_len.value != -1
        and model_len.value < c.seq_len
    ):
        yield Problem(
            model_len.key,
            f"{model_len.value} is below max_prompt_length + max_response_length = "
            f"{c.seq_len}, so the engine cannot hold a whole prompt and response",
            f"remove it (rollout.max_model_len is derived) or set it to at least {c.seq_len}",
        )
    if chunked.value is False and _int(tokens.value) and tokens.value < length:
        device = _device(c)
        chunk_fix = (
            ""
            if device is not None and not device.vllm_chunked_prefill_with_seeds
            else f", or set {chunked.short}=true"
        )
        lower = " or lower the max_model_len" if chunk_fix == "" else ", lower the max_model_len"
        yield Problem(
            tokens.key,
            f"{tokens.value} is below max_model_len {length} with chunked prefill off "
            f"({chunked.short}=false): vLLM refuses to start an engine that cannot prefill a whole "
            "sequence in one step",
            f"raise {tokens.short} to at least {length}{lower}{chunk_fix}",
        )
    active = vllm_arg(c, "max_num_active_seqs")
    if active is not None and _int(active.value) and _int(seqs.value) and active.value > seqs.value:
        yield Problem(
            active.key,
            f"{active.value} is above max_num_seqs {seqs.value} ({seqs.short}); vLLM refuses it",
            f"set it to at most {seqs.value} or remove it",
        )
    threshold = vllm_arg(c, "long_prefill_token_threshold")
    if threshold is not None and _int(threshold.value) and threshold.value > length:
        yield Problem(
            threshold.key,
            f"{threshold.value} is above max_model_len {length}; vLLM refuses it",
            f"set it to at most {length} (0 disables it) or remove it",
        )


@_vllm_rule(
    "vllm_seeded_prefill",
    _SCHEDULER_INPUTS,
    "vllm rollout on a device whose vLLM cannot prefill a prompt in chunks while the prompt samples from its "
    "own seed (cpu): enable_chunked_prefill must be false (derived) unless max_num_batched_tokens >= "
    "max_num_seqs x max_model_len (no step can then split a prompt), and engine_kwargs "
    "long_prefill_token_threshold must be 0 or at least max_model_len",
)
def _vllm_seeded_prefill(c: Ctx) -> Iterator[Problem]:
    device = _device(c)
    if device is None or device.vllm_chunked_prefill_with_seeds:
        return
    tokens, seqs, model_len, chunked, length = _scheduler_args(c)
    why = (
        f"vLLM on {device.kind} cannot prefill a prompt in chunks while it samples from the prompt's own seed "
        "(the step dies with 'CPU Generator does not use offset')"
    )
    if chunked.value is True and _int(tokens.value) and _int(seqs.value) and tokens.value < seqs.value * length:
        yield Problem(
            chunked.key,
            f"is true, and a step whose prompts x n exceed max_num_batched_tokens "
            f"{tokens.value} ({tokens.short}) splits a prompt: {why}",
            f"remove it (it is derived false on {device.kind}: the samples stay the same) or set it to "
            f"false, or raise {tokens.short} to at least max_num_seqs x max_model_len = "
            f"{seqs.value} x {length} = {seqs.value * length}",
        )
    threshold = vllm_arg(c, "long_prefill_token_threshold")
    if threshold is not None and _int(threshold.value) and 0 < threshold.value < length:
        yield Problem(
            threshold.key,
            f"{threshold.value} splits longer prompts into chunks, even with chunked prefill off: {why}",
            "remove it or set it to 0",
        )


@_vllm_rule(
    "vllm_engine_kwargs",
    _VLLM_INPUTS + (_TP,),
    "vllm rollout: engine_kwargs.vllm must not change the engine layout (tensor_parallel_size must equal "
    "rollout.tensor_model_parallel_size; pipeline_parallel_size and data_parallel_size must be 1), and a "
    "gpu_memory_utilization there must be in (0, 1]",
)
def _vllm_engine_kwargs(c: Ctx) -> Iterator[Problem]:
    tp = vllm_arg(c, "tensor_parallel_size")
    if tp is not None and tp.value != c(_TP):
        yield Problem(
            tp.key,
            f"is {tp.value!r} but actor_rollout_ref.rollout.tensor_model_parallel_size is "
            f"{c(_TP)}: the trainer builds its rollout groups from the rollout key",
            f"remove it and set actor_rollout_ref.rollout.tensor_model_parallel_size={tp.value}",
        )
    for arg in ("pipeline_parallel_size", "data_parallel_size"):
        got = vllm_arg(c, arg)
        if got is not None and got.value != 1:
            yield Problem(
                got.key,
                f"is {got.value!r}: verl-npu runs one colocated engine per TP group, with no "
                "pipeline or data parallelism inside it",
                "remove it (data parallelism comes from the device count / tensor_model_parallel_size)",
            )
    mem = vllm_arg(c, "gpu_memory_utilization")
    if mem is not None and not (
        isinstance(mem.value, (int, float)) and not isinstance(mem.value, bool) and 0 < mem.value <= 1
    ):
        yield Problem(
            mem.key,
            f"{mem.value!r} is not a fraction in (0, 1]; vLLM refuses it",
            "set actor_rollout_ref.rollout.gpu_memory_utilization (e.g. 0.5) and remove this entry",
        )


_MODEL = BC + "actor_rollout_ref.model.path"


@_vllm_rule(
    "vllm_tp_heads",
    (_NAME, _TP, _MODEL),
    "vllm rollout: tensor_model_parallel_size must divide the model's attention heads, and the key-value "
    "heads must divide it or be divisible by it (checked when the model config is readable)",
)
def _vllm_tp_heads(c: Ctx) -> Iterator[Problem]:
    if c(_TP) == 1:
        return
    heads = model_heads(c(_MODEL))
    if heads is None:
        return
    tp, (q, kv) = c(_TP), heads
    if q % tp or (kv % tp and tp % kv):
        fits = ", ".join(str(t) for t in TP_SIZES if q % t == 0 and (kv % t == 0 or t % kv == 0)) or "1"
        yield Problem(
            _TP,
            f"{tp} does not fit the model's {q} attention / {kv} key-value heads: vLLM splits "
            "heads evenly over the TP ranks",
            f"use one of {fits}",
        )


@_vllm_rule(
    "vllm_model_len",
    _VLLM_INPUTS + (ROLL + "max_model_len", _MODEL) + _LENS,
    "vllm rollout: the engine's max_model_len must not exceed the model's own length limit "
    "(max_position_embeddings and the like in its config.json, checked when readable), unless "
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
)
def _vllm_model_len(c: Ctx) -> Iterator[Problem]:
    if os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").strip().lower() in ("1", "true"):
        return
    model_len = cast(_Arg, vllm_arg(c, "max_model_len", "max_model_len"))  # a rollout key: always an answer
    if not _int(model_len.value):
        return
    limit = model_length_limit(c(_MODEL))
    if limit is None or model_len.value <= limit[0]:
        return
    if model_len.user_set:
        yield Problem(
            model_len.key,
            f"{model_len.value} is above the model's limit {limit[0]} ({limit[1]} in its config.json); vLLM refuses it",
            f"set it to at most {limit[0]}",
        )
    else:
        yield Problem(
            DATA + "max_response_length",
            f"max_prompt_length + max_response_length = {model_len.value} "
            f"(the engine's max_model_len) is above the model's limit {limit[0]} ({limit[1]} in its "
            "config.json); vLLM refuses it",
            f"lower data.max_response_length or data.max_prompt_length "
            f"so they add up to at most {limit[0]} (or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 if the "
            "model really handles longer sequences)",
        )
