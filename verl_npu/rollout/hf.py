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

With `rollout.calculate_log_probs` the engine also returns `rollout_log_probs`: each sampled token's
log-prob under the distribution it was drawn from (temperature, top-k, top-p applied and renormalised),
which is what vLLM reports with verl's `logprobs_mode=processed_logprobs`; the actor's log-probs apply the
temperature only, so top-k / top-p make the two differ (rollout correction measures that gap).

Only `rollout.temperature`, `top_k` and `top_p` shape the distribution: sampling defaults in the
model's `generation_config.json` (e.g. `repetition_penalty`) are not applied, so the rollout
samples from the distribution the actor's log-probs describe.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verl_npu.batch import Batch, trim_left_padding
from verl_npu.config.typed import ROOT, section
from verl_npu.models.forward import merge_multi_modal_inputs, vision_marker_ids
from verl_npu.registry import ROLLOUT_ENGINES
from verl_npu.rollout.base import RolloutEngine, SamplingParams, finish_rollout, stop_and_pad_ids
from verl_npu.rollout.decode import PerRowSampler, decode, forward_device, greedy_pick
from verl_npu.rollout.requests import prompt_seed


@ROLLOUT_ENGINES.register(
    "hf",
    on_actor_module=True,
    tensor_parallel=False,
    images_in_multiturn=True,
    memory="actor_module",
    doc="transformers generate on the actor's own module (CPU, tests, one device)",
)
class HFRollout(RolloutEngine):
    def __init__(
        self,
        module: torch.nn.Module,
        tokenizer,
        *,
        seed: int = 0,
        synced: bool = False,
        log_probs: bool = False,
        compute_device: torch.device | None = None,
    ):
        self.module = module
        self.compute_device = forward_device(module, compute_device)
        # rollout.calculate_log_probs: keep the sampled tokens' log-probs (`rollout_log_probs`)
        self.log_probs = log_probs
        self.seed = seed
        # sharded (FSDP) modules: every rank must run the same number of forward passes, so ranks
        # keep stepping until all of them are done
        self.synced = synced
        self.tokenizer = tokenizer
        self.eos_ids, self.pad_id = stop_and_pad_ids(module, tokenizer)
        self.suppress_ids = vision_marker_ids(module.config)

    @classmethod
    def from_config(
        cls, module, tokenizer, processor, cfg, *, rank: int = 0, world_size: int = 1, device=None, weights=None
    ) -> HFRollout:
        # every rank seeds from data.seed: a prompt's samples depend on its uid only (see above);
        # the engine samples from `module` itself, so it never reads `weights`
        cfg = section(ROOT, cfg)
        rollout = cfg.actor_rollout_ref.rollout
        engine = cls(
            module,
            tokenizer,
            seed=cfg.data.seed,
            synced=world_size > 1,
            log_probs=rollout.calculate_log_probs,
            compute_device=device.worker_device() if device is not None else None,
        )
        mt = rollout.multi_turn
        custom = rollout.agent.agent_loop_config_path  # custom agent loops (custom_loops.py)
        if mt.enable or custom:  # multi-turn with tools: verl_npu/rollout/agent_loop.py
            from verl_npu.rollout.agent_loop import build_agent_loop

            vision = processor if getattr(processor, "image_processor", None) is not None else None
            engine.agent_loop = build_agent_loop(
                engine,
                mt,
                rollout.agent.default_agent_loop,
                processor=vision,
                min_pixels=cfg.data.min_pixels,
                max_pixels=cfg.data.max_pixels,
                custom=(cfg, custom) if custom else None,
            )
        return engine

    @torch.no_grad()
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """All prompts x `params.n` samples decoded together (see the module docstring for seeding)."""
        if getattr(self, "agent_loop", None) is not None:
            return self.agent_loop.run(prompts, params, record_log_probs=self.log_probs)
        log_probs: list | None = [] if self.log_probs else None
        responses = self._decode(prompts, params, log_probs)
        width = params.max_new_tokens
        responses = F.pad(responses, (0, width - responses.shape[1]), value=self.pad_id)
        rows = finish_rollout(prompts, responses, self.eos_ids, self.pad_id, params.n)
        if log_probs:  # as the vllm engine returns them: 0 past the response
            values = F.pad(log_probs[0].cpu(), (0, width - log_probs[0].shape[1]))
            rows.set("rollout_log_probs", values * rows["response_mask"].to(values.dtype))
        return rows

    def _decode(self, prompts: Batch, params: SamplingParams, log_probs: list | None = None) -> torch.Tensor:
        module = self.module
        was_training = module.training
        module.eval()
        device = self.compute_device
        trimmed = trim_left_padding(prompts)  # the left padding every prompt has
        input_ids, attention_mask = trimmed["input_ids"], trimmed["attention_mask"]
        pick = greedy_pick
        if not params.greedy:
            uids = prompts.get("uid") or [str(i) for i in range(len(prompts))]
            pick = PerRowSampler(params, [prompt_seed(self.seed, uid) for uid in uids])
        mm = prompts.get("multi_modal_inputs")
        try:
            out = decode(
                module,
                input_ids.to(device),
                attention_mask.to(device),
                n=params.n,
                max_new_tokens=params.max_new_tokens,
                eos_ids=self.eos_ids,
                pad_id=self.pad_id,
                pick=pick,
                suppress_ids=self.suppress_ids,
                min_new_tokens=params.max_new_tokens if params.ignore_eos else 0,
                mm_inputs=merge_multi_modal_inputs(mm, device) if mm and any(mm) else None,
                synced=self.synced,
                log_probs=log_probs,
            )
        finally:
            module.train(was_training)
        return out.cpu()
