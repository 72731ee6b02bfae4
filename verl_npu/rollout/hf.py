"""`hf` rollout: transformers `generate` on the actor's own module.

It runs anywhere torch runs (the CPU demo, tests, a single accelerator) and always samples from
the actor's current weights, so there is nothing to synchronise after an update.

All prompts of a worker batch and their n samples go through one `generate` call. Sampling stays
seeded per prompt: `generate` runs in its greedy mode with `PerRowSampler` as the last logits
processor, which draws each row's next token by inverse-CDF sampling from the temperature / top-k /
top-p distribution, using uniforms from the row's own generator (seeded from `seed` and the
prompt's uid, one stream per sample). A prompt therefore gets the same samples whichever worker
generates it and whatever else is in its batch, so runs on 1 and on N workers (and resumed runs)
see the same responses, up to the float differences of different batch shapes (a token whose
cumulative probability sits within rounding of its uniform could flip).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

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


class PerRowSampler(LogitsProcessor):
    """Samples the next token of every row from its own random stream, inside a greedy `generate`.

    Row r = i * n + j (prompt i, sample j) uses uniform number t of row j of a [n, max_new_tokens]
    table drawn from `torch.Generator().manual_seed(seeds[i])`, where t is the index of the new
    token. The token is the first index whose cumulative probability (softmax of the scores after
    transformers' own temperature, top-k and top-p warpers, in that order, the order `generate`
    applies them when sampling) reaches u x total mass, i.e. an exact draw from that distribution.
    The returned scores are 0 at the chosen token and -inf elsewhere, so the greedy argmax takes it.
    """

    def __init__(self, params: SamplingParams, seeds: list[int], prompt_width: int):
        self.prompt_width = prompt_width
        self.warpers = [TemperatureLogitsWarper(params.temperature)]
        if params.top_k > 0:
            self.warpers.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(params.top_p))
        tables = []
        for seed in seeds:
            generator = torch.Generator().manual_seed(int(seed))
            # (0, 1]: a uniform of exactly 0 could pick a leading zero-probability token
            tables.append(1.0 - torch.rand(params.n, params.max_new_tokens, generator=generator))
        self.uniforms = torch.cat(tables)  # [rows, max_new_tokens]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for warp in self.warpers:
            scores = warp(input_ids, scores)
        t = min(input_ids.shape[1] - self.prompt_width, self.uniforms.shape[1] - 1)
        probs = torch.softmax(scores.float(), dim=-1)
        cdf = probs.cumsum(-1)
        u = self.uniforms[:, t].to(cdf.device).unsqueeze(-1) * cdf[:, -1:]
        choice = torch.searchsorted(cdf, u).clamp(max=scores.shape[-1] - 1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(-1, choice, 0.0)


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
        """All prompts x `params.n` samples in one `generate` call (see the module docstring for seeding)."""
        responses = self._generate_chunk(prompts, params)
        width = params.max_new_tokens
        responses = F.pad(responses, (0, width - responses.shape[1]), value=self.pad_id)
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
        # greedy mode always: sampled rollouts pick their token in PerRowSampler (argmax of its output)
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        if not params.greedy:
            uids = prompts.get("uid") or [str(i) for i in range(len(prompts))]
            kwargs["logits_processor"] = LogitsProcessorList([
                PerRowSampler(params, [prompt_seed(self.seed, uid) for uid in uids], input_ids.shape[1])
            ])
        mm_rows = rows.get("multi_modal_inputs")
        if mm_rows and any(mm_rows):
            kwargs.update(merge_multi_modal_inputs(mm_rows, device))
            kwargs["mm_token_type_ids"] = mm_token_type_ids(input_ids, VisionTokens.of(module))
        try:
            out = module.generate(**kwargs)
        finally:
            module.train(was_training)
        return out[:, input_ids.shape[1] :].cpu()
