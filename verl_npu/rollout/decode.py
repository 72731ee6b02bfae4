"""The `hf` rollout's decode loop: one prefill, then one KV-cached forward per new token.

It replaces transformers' `generate` for the rollout because `generate` prefills (and encodes the
images of) each of the n copies of a prompt, and adds per-step machinery (a logits-processor
list, stopping criteria, re-preparing the model inputs, growing the attention mask and position
ids by concatenation, the model rebuilding its 4-D mask): on the small models this engine is for,
the two together were more than a third of the rollout's time (`bench/results/vs_trl.md`, "Profile of
`gen`"). The loop calls the model's own `forward` with what `generate` would pass it, so greedy
decoding gives `generate(do_sample=False)`'s tokens (tested token for token on a text and a
vision-language model):

- positions: for a text model, `cumsum(attention_mask) - 1` (0 on left padding) for the prompt,
  then the last prompt position + 1, + 2, ... for each new token; for Qwen2/2.5-VL, the model's
  own 3-D rope positions of the prompt (`get_rope_index`), stacked under the text positions as
  transformers does ([4, rows, length]), continued the same way;
- the attention mask grows by one 1 per step for every row (a finished row keeps attending; its
  later tokens are padding and are cut by the caller);
- the KV cache grows in place: after the prefill each layer's keys and values move into a buffer with
  room for every new token, and each step writes its token's keys and values there and hands the
  attention the filled part (a view of the same shape and values transformers' `DynamicLayer` would
  give). `DynamicLayer` grows by concatenation, which copies the whole cache at every step and was
  about a tenth of the rollout's time on the small models (`bench/results/vs_trl.md`);
- each decode step after the prefill runs through `decode_step.DecodeStep` where it applies (known model
  classes, SDPA, no hooks): the model's decoder without its top-level forward, with the rotary cos / sin and
  the padding mask built once per decode; the same logits bit for bit. Elsewhere the loop calls the model;
- each prompt is prefilled once, its images encoded once; its KV cache, last logits, positions and
  attention mask are then repeated for its n samples (transformers' `generate` would prefill and
  encode each of the n copies);
- images go into the prefill only (their features are in the KV cache afterwards);
- the logits of the last position are taken in float32; forbidden tokens (image / video markers)
  get -inf, and EOS gets -inf while fewer than `min_new_tokens` tokens are out;
- a row that produced an EOS token gets `pad_id` from then on; the loop ends when every row has
  finished or after `max_new_tokens` tokens. With `synced=True` (FSDP-sharded modules: every rank
  must run the same number of forwards) it ends only when every rank's rows have finished.

`PerRowSampler` is the sampled `pick`: each row draws from its own seeded random stream.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import torch.distributed as dist
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
from transformers.cache_utils import DynamicLayer

from verl_npu.models.forward import VisionTokens, mm_token_type_ids, rope_positions
from verl_npu.rollout.base import SamplingParams
from verl_npu.rollout.decode_step import DecodeStep

#: picks the next token of every row: (float32 scores [rows, vocab], new-token index t) -> [rows]
Pick = Callable[[torch.Tensor, int], torch.Tensor]


def forward_device(module, worker_device: torch.device | None = None) -> torch.device:
    """Where `module` computes, hence where its inputs go: the worker's device when given (under FSDP2
    parameter offload the parameters rest on the host and reach the accelerator for each forward), else
    its parameters' device (a plain module: tests, a single process)."""
    return worker_device or next(module.parameters()).device


def greedy_pick(scores: torch.Tensor, t: int) -> torch.Tensor:
    return scores.argmax(-1)


class PerRowSampler:
    """Samples the next token of every row from its own random stream.

    Row r = i * n + j (prompt i, sample j) uses uniform number t of row j of a [n, max_new_tokens]
    table drawn from `torch.Generator().manual_seed(seeds[i])`, where t is the index of the new
    token. The token is the first index whose cumulative probability (softmax of the scores after
    transformers' temperature, top-k and top-p warpers, in that order, the order `generate`
    applies them when sampling) reaches u x total mass, i.e. an exact draw from that distribution.
    """

    def __init__(self, params: SamplingParams, seeds: list[int]):
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

    def __call__(self, scores: torch.Tensor, t: int) -> torch.Tensor:
        return self.draw(self.warp(scores), t)

    def warp(self, scores: torch.Tensor) -> torch.Tensor:
        """The scores of the distribution a token is drawn from: temperature, top-k, top-p (-inf outside)."""
        for warp in self.warpers:  # the warpers read only the scores
            scores = warp(None, scores)
        return scores

    def draw(self, scores: torch.Tensor, t: int) -> torch.Tensor:
        """Token t of every row from already warped scores."""
        cdf = torch.softmax(scores, dim=-1).cumsum(-1)
        u = self.uniforms[:, min(t, self.uniforms.shape[1] - 1)].to(cdf.device).unsqueeze(-1) * cdf[:, -1:]
        return torch.searchsorted(cdf, u).clamp_(max=scores.shape[-1] - 1).squeeze(-1)


def prompt_positions(module, input_ids: torch.Tensor, attention_mask: torch.Tensor, mm_inputs: dict) -> torch.Tensor:
    """The prompt's position ids as `generate` feeds them to the model: [rows, P] for a text model,
    [4, rows, P] (text positions over the 3-D rope positions) for Qwen2/2.5-VL."""
    text = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    vt = VisionTokens.of(module)
    if not vt.is_vision:
        return text
    return torch.cat([text.unsqueeze(0), rope_positions(module, input_ids, attention_mask, mm_inputs, vt)], dim=0)


def decode_attention_masks(module, attention_mask: torch.Tensor) -> Callable[[int], torch.Tensor]:
    """The attention mask of a decode step over `length` keys, from the 2-D mask [rows, all keys]:
    the 2-D mask's first `length` columns, which the model turns into its 4-D mask at every step;
    or, where that 4-D mask is known to be just the padding mask (SDPA attention, no sliding-window
    layer, some padding: a single query may attend to every unpadded key before it), that boolean
    [rows, 1, 1, length] mask sliced from one built once, which the model takes as is."""
    text = module.config.get_text_config()
    sliding = "sliding_attention" in (getattr(text, "layer_types", None) or [])
    if text._attn_implementation != "sdpa" or sliding or bool(attention_mask.all()):
        return lambda length: attention_mask[:, :length]
    full = attention_mask.bool()[:, None, None, :]
    return lambda length: full[..., :length]


def _takes_logits_to_keep(module) -> bool:
    return "logits_to_keep" in inspect.signature(module.forward).parameters


def _cache_name(module) -> str:
    """The forward argument that takes the KV cache: ``cache`` from transformers 5.24 on (which warns
    about ``past_key_values`` on every call), ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


class _InPlaceLayer(DynamicLayer):
    """A `DynamicLayer` whose keys / values are the filled part of buffers allocated once (`grow_in_place`):
    `update` writes the new states after the filled part instead of concatenating."""

    key_buffer: torch.Tensor
    value_buffer: torch.Tensor

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.key_buffer.shape[-2]:
            raise RuntimeError(f"KV cache buffer holds {self.key_buffer.shape[-2]} positions, asked for {end}")
        self.key_buffer[..., start:end, :].copy_(key_states)
        self.value_buffer[..., start:end, :].copy_(value_states)
        self.keys, self.values = self.key_buffer[..., :end, :], self.value_buffer[..., :end, :]
        return self.keys, self.values


def grow_in_place(cache, n: int, new_tokens: int) -> bool:
    """Repeat the prefilled `cache` n times along the rows (as `batch_repeat_interleave(n)`) and give each
    plain `DynamicLayer` room for `new_tokens` more positions, filled in place by `_InPlaceLayer.update`.
    Other layer kinds (sliding windows, quantized or offloaded caches) and caches without `layers` are
    only repeated, and keep growing their own way. True when every layer now grows in place."""
    layers = getattr(cache, "layers", None)
    if layers is None or not all(type(layer) is DynamicLayer for layer in layers):
        if n > 1:
            cache.batch_repeat_interleave(n)
        return False
    every_layer = True
    for layer in layers:
        if not layer.is_initialized or layer.keys.numel() == 0:
            if n > 1:
                layer.batch_repeat_interleave(n)
            every_layer = False
            continue
        buffers = []
        for states in (layer.keys, layer.values):
            rows, heads, length, dim = states.shape
            buffer = states.new_empty(rows * n, heads, length + new_tokens, dim)
            # row i * n + j of the buffer continues prompt row i, as repeat_interleave orders them
            buffer[:, :, :length].view(rows, n, heads, length, dim).copy_(states.unsqueeze(1))
            buffers.append(buffer)
        layer.__class__ = _InPlaceLayer
        layer.key_buffer, layer.value_buffer = buffers
        layer.keys, layer.values = (buffer[..., : layer.keys.shape[-2], :] for buffer in buffers)
    return every_layer


def _all_ranks_finished(finished: torch.Tensor, synced: bool) -> bool:
    done = finished.all()
    if synced:
        flag = done.to(torch.int32).reshape(1)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        done = flag[0]
    return bool(done)


@torch.no_grad()
def decode(
    module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    n: int = 1,
    pick: Pick = greedy_pick,
    suppress_ids: list[int] | None = None,
    min_new_tokens: int = 0,
    mm_inputs: dict | None = None,
    synced: bool = False,
    log_probs: list | None = None,
) -> torch.Tensor:
    """New tokens [prompts * n, <= max_new_tokens] for left-padded prompts `input_ids` [prompts, P]:
    rows i * n .. i * n + n - 1 continue prompt i (see the module docstring for what each step
    computes). The prompts are prefilled once each (images encoded once each) and their KV cache
    is repeated n times. `mm_inputs` are the processor tensors of the prompts' images
    (`pixel_values`, `image_grid_thw`, ...), concatenated in prompt order.

    `log_probs` (a list, filled in place): gets the float32 [rows, new tokens] log-probs of the chosen tokens
    under the distribution they were drawn from, as vLLM's `processed_logprobs` reports them: the
    log-softmax of the step's scores after the forbidden-token masks and, when sampling, the pick's `warp`
    (temperature, top-k, top-p); greedy picks use the unwarped scores (vLLM's greedy requests the same)."""
    mm_inputs = dict(mm_inputs or {})
    width = input_ids.shape[1]
    rows = input_ids.shape[0] * n
    device = input_ids.device
    if VisionTokens.of(module).is_vision and mm_inputs:
        mm_inputs["mm_token_type_ids"] = mm_token_type_ids(input_ids, VisionTokens.of(module))
    positions = prompt_positions(module, input_ids, attention_mask, mm_inputs)
    extra = {"logits_to_keep": 1} if _takes_logits_to_keep(module) else {}
    out = module(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=True, **mm_inputs, **extra
    )
    cache_name = _cache_name(module)
    cache = out.cache if cache_name == "cache" else out.past_key_values
    logits = out.logits[:, -1]
    in_place = grow_in_place(cache, n, max_new_tokens)
    if n > 1:
        logits = logits.repeat_interleave(n, dim=0)
        positions = positions.repeat_interleave(n, dim=-2)  # the row dimension of [rows, P] and [4, rows, P]
        attention_mask = attention_mask.repeat_interleave(n, dim=0)
    # position of new token t: last prompt position + 1 + t (every row of a 4-row VL position id alike)
    new_positions = positions[..., -1:] + 1 + torch.arange(max_new_tokens, device=device)
    full_mask = torch.cat([attention_mask, attention_mask.new_ones(rows, max_new_tokens)], dim=1)
    step = DecodeStep.build(module, cache, cache_name, full_mask, width, new_positions, in_place)
    step_mask = decode_attention_masks(module, full_mask) if step is None else None
    eos = torch.tensor(eos_ids, device=device)
    suppress = torch.tensor(suppress_ids or [], dtype=torch.long, device=device)
    tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    warp = getattr(pick, "warp", None) if log_probs is not None else None
    chosen = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device) if log_probs is not None else None
    if chosen is not None:
        log_probs.append(chosen)
    for t in range(max_new_tokens):
        scores = logits.float()
        if suppress.numel():
            scores.index_fill_(-1, suppress, float("-inf"))
        if t < min_new_tokens:
            scores.index_fill_(-1, eos, float("-inf"))
        if chosen is None:
            token = pick(scores, t)
        else:
            scores = warp(scores) if warp is not None else scores
            token = pick.draw(scores, t) if warp is not None else pick(scores, t)
            chosen[:, t] = torch.log_softmax(scores, dim=-1).gather(-1, token.unsqueeze(-1)).squeeze(-1)
        token = token.masked_fill_(finished, pad_id)
        tokens[:, t] = token
        finished |= torch.isin(token, eos)
        if t + 1 == max_new_tokens or _all_ranks_finished(finished, synced):
            if chosen is not None:
                log_probs[-1] = chosen[:, : t + 1]
            return tokens[:, : t + 1]
        if step is not None:
            logits = step(token, t)
            continue
        logits = module(
            input_ids=token.unsqueeze(-1),
            attention_mask=step_mask(width + t + 1),
            position_ids=new_positions[..., t : t + 1],
            use_cache=True,
            **{cache_name: cache},
        ).logits[:, -1]
    return tokens[:, :0]
