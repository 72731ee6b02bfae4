"""`hf` rollout: transformers `generate` on the actor's own module.

It runs anywhere torch runs (the CPU demo, tests, a single accelerator) and always samples from
the actor's current weights, so there is nothing to synchronise after an update.

Sampling is seeded per prompt, from (`seed`, the prompt's uid): a prompt gets the same samples
whichever worker generates it and whatever else is in its batch, so runs on 1 and on N workers
(and resumed runs) see the same responses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verl_npu.batch import Batch
from verl_npu.models.forward import VisionTokens, merge_multi_modal_inputs, mm_token_type_ids
from verl_npu.rollout.requests import prompt_seed
from verl_npu.rollout.base import (
    RolloutEngine,
    SamplingParams,
    finish_rollout,
    stop_and_pad_ids,
    vision_marker_ids,
)


class HFRollout(RolloutEngine):
    def __init__(self, module: torch.nn.Module, tokenizer, *, seed: int = 0, synced: bool = False):
        self.module = module
        self.seed = seed
        # sharded (FSDP) modules: every rank must run the same number of forward passes, so ranks
        # keep stepping until all of them are done (transformers' synced_gpus)
        self.synced = synced
        self.tokenizer = tokenizer
        self.eos_ids, self.pad_id = stop_and_pad_ids(module, tokenizer)
        self.suppress_ids = vision_marker_ids(module.config)

    @classmethod
    def from_config(cls, module, tokenizer, processor, cfg, *, rank: int = 0, world_size: int = 1) -> "HFRollout":
        # every rank seeds from data.seed: a prompt's samples depend on its uid only (see above)
        return cls(module, tokenizer, seed=int(cfg.data.seed), synced=world_size > 1)

    @torch.no_grad()
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        if params.greedy:  # no randomness: one batched call
            responses = [self._generate_chunk(prompts, params)]
        else:
            uids = prompts.get("uid") or [str(i) for i in range(len(prompts))]
            responses = []
            for i, uid in enumerate(uids):
                torch.manual_seed(prompt_seed(self.seed, uid))
                responses.append(self._generate_chunk(prompts.slice(i, i + 1), params))
        width = params.max_new_tokens
        responses = torch.cat([F.pad(r, (0, width - r.shape[1]), value=self.pad_id) for r in responses])
        return finish_rollout(prompts, responses, self.eos_ids, self.pad_id, params.n)

    def _generate_chunk(self, prompts: Batch, params: SamplingParams) -> torch.Tensor:
        module = self.module
        was_training = module.training
        module.eval()
        rows = prompts.repeat_interleave(params.n)
        device = next(module.parameters()).device
        input_ids = rows["input_ids"].to(device)
        kwargs = dict(
            input_ids=input_ids,
            attention_mask=rows["attention_mask"].to(device),
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            use_cache=True,
            synced_gpus=self.synced,
        )
        if self.suppress_ids:
            kwargs["suppress_tokens"] = self.suppress_ids
        if params.ignore_eos:
            kwargs["min_new_tokens"] = params.max_new_tokens
        if params.greedy:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        else:
            kwargs.update(
                do_sample=True,
                temperature=params.temperature,
                top_k=params.top_k if params.top_k > 0 else 0,  # 0 = no top-k (not the config default 50)
                top_p=params.top_p,
            )
        mm_rows = rows.get("multi_modal_inputs")
        if mm_rows and any(mm_rows):
            kwargs.update(merge_multi_modal_inputs(mm_rows, device))
            kwargs["mm_token_type_ids"] = mm_token_type_ids(input_ids, VisionTokens.of(module))
        try:
            out = module.generate(**kwargs)
        finally:
            module.train(was_training)
        return out[:, input_ids.shape[1] :].cpu()
