"""`hf` rollout: the actor's own transformers module, sampled by our decode loop.

It runs anywhere torch runs (the CPU demo, tests, a single accelerator) and always samples from
the actor's current weights, so there is nothing to synchronise after an update.

All prompts of a worker batch and their n samples are decoded together, by `decode.decode` (one
prefill, then one KV-cached forward per new token; greedy decoding gives transformers'
`generate(do_sample=False)` tokens). The left padding that every prompt of the batch shares is
dropped first: the data pipeline pads prompts to `data.max_prompt_length`, and attending over
columns that no row uses only costs time (their keys are masked out, so the result is the same).
Sampling stays seeded per prompt: `PerRowSampler` draws each row's next token by inverse-CDF
sampling from the temperature / top-k / top-p distribution, using uniforms from the row's own
generator (seeded from `seed` and the prompt's uid, one stream per sample). A prompt therefore
gets the same samples whichever worker generates it and whatever else is in its batch, so runs
on 1 and on N workers (and resumed runs) see the same responses, up to the float differences of
different batch shapes (a token whose cumulative probability sits within rounding of its uniform
could flip).

Only `rollout.temperature`, `top_k` and `top_p` shape the distribution: sampling defaults in the
model's `generation_config.json` (e.g. `repetition_penalty`) are not applied, so the rollout
samples from the distribution the actor's log-probs describe.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verl_npu.batch import Batch
from verl_npu.models.forward import merge_multi_modal_inputs, vision_marker_ids
from verl_npu.rollout.base import (
    RolloutEngine,
    SamplingParams,
    finish_rollout,
    stop_and_pad_ids,
)
from verl_npu.rollout.decode import PerRowSampler, decode, greedy_pick
from verl_npu.rollout.requests import prompt_seed
from verl_npu.workers.micro import trim_left_padding


class HFRollout(RolloutEngine):
    def __init__(self, module: torch.nn.Module, tokenizer, *, seed: int = 0, synced: bool = False):
        self.module = module
        self.seed = seed
        # sharded (FSDP) modules: every rank must run the same number of forward passes, so ranks
        # keep stepping until all of them are done
        self.synced = synced
        self.tokenizer = tokenizer
        self.eos_ids, self.pad_id = stop_and_pad_ids(module, tokenizer)
        self.suppress_ids = vision_marker_ids(module.config)

    @classmethod
    def from_config(cls, module, tokenizer, processor, cfg, *, rank: int = 0, world_size: int = 1) -> "HFRollout":
        # every rank seeds from data.seed: a prompt's samples depend on its uid only (see above)
        engine = cls(module, tokenizer, seed=int(cfg.data.seed), synced=world_size > 1)
        mt = cfg.actor_rollout_ref.rollout.get("multi_turn")
        if mt is not None and mt.get("enable"):  # multi-turn with tools: verl_npu/rollout/agent_loop.py
            from verl_npu.rollout.agent_loop import build_agent_loop

            agent = cfg.actor_rollout_ref.rollout.get("agent") or {}
            engine.agent_loop = build_agent_loop(engine, mt, agent.get("default_agent_loop", "single_turn_agent"))
        return engine

    @torch.no_grad()
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """All prompts x `params.n` samples decoded together (see the module docstring for seeding)."""
        if getattr(self, "agent_loop", None) is not None:
            return self.agent_loop.run(prompts, params)
        responses = self._decode(prompts, params)
        width = params.max_new_tokens
        responses = F.pad(responses, (0, width - responses.shape[1]), value=self.pad_id)
        return finish_rollout(prompts, responses, self.eos_ids, self.pad_id, params.n)

    def _decode(self, prompts: Batch, params: SamplingParams) -> torch.Tensor:
        module = self.module
        was_training = module.training
        module.eval()
        device = next(module.parameters()).device
        trimmed = trim_left_padding(prompts)  # the left padding every prompt has
        input_ids, attention_mask = trimmed["input_ids"], trimmed["attention_mask"]
        pick = greedy_pick
        if not params.greedy:
            uids = prompts.get("uid") or [str(i) for i in range(len(prompts))]
            pick = PerRowSampler(params, [prompt_seed(self.seed, uid) for uid in uids])
        mm = prompts.get("multi_modal_inputs")
        try:
            out = decode(
                module, input_ids.to(device), attention_mask.to(device), n=params.n,
                max_new_tokens=params.max_new_tokens, eos_ids=self.eos_ids, pad_id=self.pad_id, pick=pick,
                suppress_ids=self.suppress_ids, min_new_tokens=params.max_new_tokens if params.ignore_eos else 0,
                mm_inputs=merge_multi_modal_inputs(mm, device) if mm and any(mm) else None,
                synced=self.synced,
            )
        finally:
            module.train(was_training)
        return out.cpu()
