"""The rollout engine interface: prompts (with images) in, response token ids (and log-probs) out.

Every engine (`hf` here, `vllm` / `vllm-ascend` for accelerators) implements `RolloutEngine`
and is registered by name in `verl_npu.rollout` (one factory signature, `from_config`), so the
worker code does not care which one samples. Row layout of a generated batch: the n
samples of prompt i are rows i*n .. i*n + n - 1.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from verl_npu.batch import Batch

#: a partial rollout's rows: each response token's policy version (-1 on padding and on tool turns); the rollout side
#: of separate_async on an engine that steps its requests (`verl_npu.rollout.vllm_partial`)
VERSIONS_KEY = "rollout_versions"


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: verl's rollout keys (`rollout.*` or `rollout.val_kwargs.*` for validation)."""

    n: int = 1
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    do_sample: bool = True
    max_new_tokens: int = 512
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return (not self.do_sample) or self.temperature <= 0

    @classmethod
    def for_training(cls, rollout_cfg) -> SamplingParams:
        return cls._of(rollout_cfg, rollout_cfg)

    @classmethod
    def for_validation(cls, rollout_cfg) -> SamplingParams:
        return cls._of(rollout_cfg.val_kwargs, rollout_cfg)

    @classmethod
    def _of(cls, sampling, rollout_cfg) -> SamplingParams:
        """n / temperature / top_k / top_p / do_sample from `sampling`, the length and EOS rule from `rollout_cfg`."""
        return cls(
            n=int(sampling.n),
            temperature=float(sampling.temperature),
            top_k=int(sampling.top_k),
            top_p=float(sampling.top_p),
            do_sample=bool(sampling.do_sample),
            max_new_tokens=int(rollout_cfg.response_length),
            ignore_eos=bool(rollout_cfg.ignore_eos),
        )


class RolloutEngine(ABC):
    """Samples responses for a batch of prompts."""

    @classmethod
    @abstractmethod
    def from_config(
        cls,
        module,
        tokenizer,
        processor,
        cfg,
        *,
        rank: int = 0,
        world_size: int = 1,
        device=None,
        weights: Iterable[tuple[str, torch.Tensor]] | None = None,
    ) -> RolloutEngine:
        """The engine for this rank: `module` is the actor (FSDP2-sharded with several workers),
        `cfg` the typed backend_config section (`verl_npu.config.typed`; a dict or OmegaConf node is
        read as that section, its missing keys at the schema's defaults); `rank` / `world_size` place
        it among the workers; `device` the worker's `DeviceInfo` (memory reports). `weights`: the actor's weights as
        `update_weights` takes them, for an engine that starts without them (vLLM's
        `load_format=dummy`); a lazy iterator, so an engine that does not read it costs nothing."""

    @abstractmethod
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """`prompts` holds `input_ids` / `attention_mask` [B, P] (left-padded), `raw_prompt_ids`,
        and for multimodal rows `multi_modal_data` ({"image": [PIL]}) and `multi_modal_inputs`
        (processor tensors). Returns B*n rows with: `prompts` [B*n, P], `responses` [B*n, R]
        (right-padded), `response_mask` [B*n, R] (1 on generated tokens up to and including EOS),
        `input_ids` / `attention_mask` [B*n, P+R], and every per-row field of `prompts`
        repeated n times."""

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the actor's new weights, (Hugging Face name, whole tensor) pairs of the base model,
        as verl's rollouts take them (a no-op for engines that share the actor's module). The worker
        hands a lazy iterator that gathers the tensors from the shards as it is read (a collective):
        every rank calls this, and an engine that reads it reads it to the end."""


#: `rollout.dtype` -> the dtype of the weights an engine with its own copy holds
ROLLOUT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def stop_and_pad_ids(module, tokenizer) -> tuple[list[int], int]:
    """EOS ids (the model's generation config, else the tokenizer's) and the padding id."""
    gen_cfg = getattr(module, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_ids = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    return eos_ids, int(pad_id)


def finish_rollout(
    prompts: Batch,
    responses: torch.Tensor,
    eos_ids: list[int],
    pad_id: int,
    n: int,
    lengths: torch.Tensor | None = None,
) -> Batch:
    """Shared tail of every engine: pad responses, build masks (here, once) and the full sequences.
    `lengths` [B*n]: how many tokens each response really has, for an engine whose ids may stop
    without an EOS and leave padding that reads like tokens (vLLM's stop rules): the columns past a
    row's length are not part of it either."""
    rows = prompts.repeat_interleave(n)
    is_eos = torch.zeros_like(responses, dtype=torch.bool)
    for eos in eos_ids:
        is_eos |= responses == eos
    # tokens after the first EOS are not part of the response
    after_eos = (torch.cumsum(is_eos.long(), dim=1) - is_eos.long()) > 0
    response_mask = (~after_eos).long()
    responses = responses.masked_fill(after_eos, pad_id)
    if lengths is not None:
        response_mask = response_mask * (torch.arange(responses.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)).long()
    return attach_responses(rows, responses, response_mask)


def attach_responses(
    rows: Batch, responses: torch.Tensor, response_mask: torch.Tensor, attention_tail: torch.Tensor | None = None
) -> Batch:
    """Set the columns every engine returns on ``rows`` (prompt rows, left-padded): ``prompts`` (the
    prompt ids), ``responses``, ``response_mask`` (1 on the tokens the policy is trained on),
    ``input_ids`` (prompt then response) and ``attention_mask`` (the prompt's, then ``attention_tail``:
    the response tokens that exist, by default ``response_mask``)."""
    prompt_ids = rows["input_ids"]
    tail = response_mask if attention_tail is None else attention_tail
    rows.set("prompts", prompt_ids)
    rows.set("responses", responses)
    rows.set("response_mask", response_mask)
    rows.set("input_ids", torch.cat([prompt_ids, responses], dim=1))
    rows.set("attention_mask", torch.cat([rows["attention_mask"], tail], dim=1))
    return rows
