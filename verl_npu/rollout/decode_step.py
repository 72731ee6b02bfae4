"""One decode step of the `hf` rollout's loop (`rollout.decode`) without the model's top-level forward.

A decode step feeds one token per row through a small model; on the models this engine is for, the step's
time was mostly per-call work around a few small matrix products (`bench/results/vs_trl.md`). The model's
forward re-does at every step what depends only on the step index: the attention mask (transformers' mask
creation, and SDPA turning a boolean mask into an additive one in every layer), the rotary cos / sin of the
step's positions, the keyword plumbing and output objects of three nested forwards. `DecodeStep` does that
once per decode and then, per step, only what the step computes:

- the cos / sin of every new position come from one call of the decoder's own `rotary_emb` on all the new
  positions; it is elementwise in the positions, so step t's slice holds the values a call for step t gives;
- each step's mask is a slice of one built once: what the model's mask creation gives a single query under
  SDPA (the padding mask as a 4-D mask, None without padding), in the additive form (0 / -inf) SDPA makes of
  a boolean mask;
- then the decoder's embedding, its layers, its final norm and `lm_head` on the last position, as the
  model's forward calls them. For the decoder layers of Qwen2 and Qwen2.5-VL (`_OWN_LAYERS`) the layer's
  arithmetic runs here, op for op as transformers' layer computes it (RMSNorm, q / k / v projections,
  rotary embedding, the KV cache's update, transformers' own SDPA attention function, output projection,
  residuals, SiLU MLP), without the module calls around each op; the one rewrite is exact: the rotary's
  ``rotate_half(x) * sin`` = ``cat(-x2, x1) * sin`` is computed as ``cat(x2, x1) * cat(-sin1, sin2)``
  (a sign flip commutes with a rounded product). Other layers are called as modules.

Tokens and log-probs are the ones the model's forward gives, bit for bit (`tests/rollout/test_decode_step.py`
compares both paths on every supported class, with and without padding). `DecodeStep.build` gives None,
and the loop calls the model, for anything else: a class outside `_TOP_LEVEL` (whose forward is known
to be embed -> rotary -> layers -> norm -> lm_head), attention other than SDPA, sliding-window layers, a
rope type other than the default (dynamic ropes depend on the longest position of a call), hooks on a
module the step skips, hub kernels, or a wrapped module (FSDP and peft change the module's class).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: top-level classes (transformers 5) whose forward, for one decode step with position ids given and no
#: images, is: the decoder's `embed_tokens`, its `rotary_emb` of the positions, every decoder layer in order
#: with the same mask, its final `norm`, then `lm_head` on the last position
_TOP_LEVEL = {"Qwen2ForCausalLM", "Qwen2_5_VLForConditionalGeneration", "LlamaForCausalLM", "Qwen3ForCausalLM"}
#: decoder layer class -> (its attention, RMSNorm and MLP classes): the layers whose arithmetic `_own_layer`
#: computes (transformers 5's Qwen2 / Qwen2.5-VL decoder layer)
_OWN_LAYERS = {
    "Qwen2DecoderLayer": ("Qwen2Attention", "Qwen2RMSNorm", "Qwen2MLP"),
    "Qwen2_5_VLDecoderLayer": ("Qwen2_5_VLAttention", "Qwen2_5_VLRMSNorm", "Qwen2MLP"),
}


def _has_hooks(module: torch.nn.Module) -> bool:
    return bool(
        module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks
    )


def _global_hooks() -> bool:
    hooks = torch.nn.modules.module
    return bool(hooks._global_forward_hooks or hooks._global_forward_pre_hooks or hooks._global_backward_hooks)


def _own_layer_parts(layer) -> bool:
    """Whether `_own_layer` computes `layer` exactly: the known classes, plain linear layers, a SiLU MLP, no hooks."""
    names = _OWN_LAYERS.get(type(layer).__name__)
    if names is None:
        return False
    attn, mlp = layer.self_attn, layer.mlp
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    if (type(attn).__name__, type(norms[0]).__name__, type(mlp).__name__) != names or type(norms[1]) is not type(
        norms[0]
    ):
        return False
    linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    if any(type(linear) is not torch.nn.Linear for linear in linears):
        return False
    if type(mlp.act_fn).__name__ not in ("SiLUActivation", "SiLU") or attn.sliding_window is not None:
        return False
    parts = (layer, attn, mlp, *norms, *linears, mlp.act_fn)
    return not any(_has_hooks(part) for part in parts)


def _rms_norm(weight: torch.Tensor, eps: float, hidden: torch.Tensor) -> torch.Tensor:
    """Qwen2 RMSNorm, op for op (its casts to and from float32 are no-ops on float32 states)."""
    dtype = hidden.dtype
    if dtype != torch.float32:
        hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * (hidden if dtype == torch.float32 else hidden.to(dtype))


@dataclass(frozen=True)
class _OwnLayer:
    """What `DecodeStep._own_layer` reads of one decoder layer, gathered once per decode (module attribute
    look-ups were a visible share of a step)."""

    attn: torch.nn.Module
    cache_layer: object
    norm_in: tuple
    norm_post: tuple
    q: tuple
    k: tuple
    v: tuple
    o: tuple
    gate: tuple
    up: tuple
    down: tuple
    head_dim: int
    scaling: float

    @classmethod
    def of(cls, layer, cache) -> _OwnLayer:
        attn, mlp = layer.self_attn, layer.mlp
        norms = [(n.weight, n.variance_epsilon) for n in (layer.input_layernorm, layer.post_attention_layernorm)]
        linears = [
            (m.weight, m.bias)
            for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        ]
        return cls(attn, cache.layers[attn.layer_idx], *norms, *linears, attn.head_dim, attn.scaling)


class DecodeStep:
    """`step(token, t)`: the logits [rows, vocab] after new token t (`token` [rows]) was fed (see the module
    docstring). Built once per decode by `build`, after the prefill."""

    def __init__(
        self,
        module,
        decoder,
        cache,
        cache_name: str,
        masks: Callable,
        width: int,
        text_positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        own_layers: bool,
    ):
        self.module, self.decoder, self.cache, self.cache_name = module, decoder, cache, cache_name
        self.masks, self.width, self.text_positions = masks, width, text_positions
        self.cos, self.sin = cos, sin  # [rows, T, head_dim]
        self.layers = list(decoder.layers[: decoder.config.num_hidden_layers])
        self.own_layers = own_layers
        if own_layers:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            self.attention = ALL_ATTENTION_FUNCTIONS["sdpa"]
            half = cos.shape[-1] // 2
            # [rows, 1, T, head_dim]: step t's slice broadcasts over the heads as the layer's unsqueeze(1) does
            self.cos_heads = cos.unsqueeze(1)
            self.sin_signed = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1).unsqueeze(1)
            self.halves_swapped = torch.cat([torch.arange(half, 2 * half), torch.arange(half)]).to(cos.device)
            self.own = [_OwnLayer.of(layer, cache) for layer in self.layers]
            self.final_norm = (decoder.norm.weight, decoder.norm.variance_epsilon)
            self.head = (module.lm_head.weight, module.lm_head.bias)

    @classmethod
    def build(
        cls,
        module,
        cache,
        cache_name: str,
        full_mask: torch.Tensor,
        width: int,
        new_positions: torch.Tensor,
        cache_in_place: bool,
    ) -> DecodeStep | None:
        """The step for `module`, or None where the loop must call the model (see the module docstring).
        `cache`: the prefilled KV cache; `full_mask` [rows, all keys]: the 2-D attention mask of the whole
        decode; `width`: the prompt's width; `new_positions`: the position ids of the new tokens ([rows, T], or
        [4, rows, T] for Qwen2.5-VL: text positions over the 3-D ones); `cache_in_place`: every layer of `cache`
        grows in place (`rollout.decode.grow_in_place`), whose layer-level `update` alone the own layers call."""
        kind = type(module)
        if kind.__name__ not in _TOP_LEVEL or not kind.__module__.startswith("transformers.") or module.training:
            return None
        decoder = module.get_decoder()
        config = decoder.config
        if (
            config._attn_implementation != "sdpa"
            or any(t != "full_attention" for t in getattr(config, "layer_types", None) or [])
            or getattr(decoder.rotary_emb, "rope_type", None) != "default"
            or getattr(module, "use_kernels", False)
            or getattr(cache, "offloading", False)
        ):
            return None
        skipped = (
            module,
            module.model,
            decoder,
            decoder.embed_tokens,
            decoder.norm,
            decoder.rotary_emb,
            module.lm_head,
        )
        if _global_hooks() or any(_has_hooks(m) for m in skipped):
            return None
        vision = kind.__name__ == "Qwen2_5_VLForConditionalGeneration"
        if vision != (new_positions.dim() == 3):
            return None
        text_positions, rope_positions = (new_positions[0], new_positions[1:]) if vision else (new_positions,) * 2
        embeds = decoder.embed_tokens.weight
        cos, sin = decoder.rotary_emb(embeds.new_empty(0), rope_positions)
        if bool(full_mask.all()):
            masks = lambda length: None  # noqa: E731  the SDPA mask of a single query without padding
        else:
            additive = torch.zeros(full_mask.shape, dtype=embeds.dtype, device=full_mask.device)
            additive = additive.masked_fill_(full_mask == 0, float("-inf"))[:, None, None, :]
            masks = lambda length: additive[..., :length]  # noqa: E731  4-D: the layers take it as is
        layers = decoder.layers[: config.num_hidden_layers]
        own = (
            len(layers) > 0
            and all(_own_layer_parts(layer) for layer in layers)
            and type(decoder.norm).__name__ == _OWN_LAYERS[type(layers[0]).__name__][1]
            and type(module.lm_head) is torch.nn.Linear
            and cache_in_place
        )
        return cls(module, decoder, cache, cache_name, masks, width, text_positions, cos, sin, own)

    def __call__(self, token: torch.Tensor, t: int) -> torch.Tensor:
        hidden = self.decoder.embed_tokens(token.unsqueeze(-1))
        mask = self.masks(self.width + t + 1)
        if self.own_layers:
            cos, sin = self.cos_heads[:, :, t : t + 1], self.sin_signed[:, :, t : t + 1]
            for layer in self.own:
                hidden = self._own_layer(layer, hidden, mask, cos, sin)
        else:
            rope = (self.cos[:, t : t + 1], self.sin[:, t : t + 1])
            positions, cache = self.text_positions[:, t : t + 1], {self.cache_name: self.cache}
            for layer in self.layers:
                hidden = layer(
                    hidden,
                    attention_mask=mask,
                    position_embeddings=rope,
                    position_ids=positions,
                    use_cache=True,
                    **cache,
                )
        if self.own_layers:  # the final norm is the layers' RMSNorm; lm_head a plain linear layer
            hidden = _rms_norm(*self.final_norm, hidden)
            return F.linear(hidden[:, -1:, :], *self.head)[:, -1]
        hidden = self.decoder.norm(hidden)
        return self.module.lm_head(hidden[:, -1:, :])[:, -1]

    def _own_layer(
        self, layer: _OwnLayer, hidden: torch.Tensor, mask, cos: torch.Tensor, sin_signed: torch.Tensor
    ) -> torch.Tensor:
        """One Qwen2 / Qwen2.5-VL decoder layer on [rows, 1, hidden], as its forward computes it."""
        rows = hidden.shape[0]
        heads_shape = (rows, 1, -1, layer.head_dim)
        x = _rms_norm(*layer.norm_in, hidden)
        query = F.linear(x, *layer.q).view(heads_shape).transpose(1, 2)
        key = F.linear(x, *layer.k).view(heads_shape).transpose(1, 2)
        value = F.linear(x, *layer.v).view(heads_shape).transpose(1, 2)
        query = query * cos + query.index_select(-1, self.halves_swapped) * sin_signed
        key = key * cos + key.index_select(-1, self.halves_swapped) * sin_signed
        key, value = layer.cache_layer.update(key, value)
        out, _ = self.attention(
            layer.attn, query, key, value, mask, dropout=0.0, scaling=layer.scaling, sliding_window=None
        )
        hidden = hidden + F.linear(out.reshape(rows, 1, -1).contiguous(), *layer.o)
        x = _rms_norm(*layer.norm_post, hidden)
        return hidden + F.linear(F.silu(F.linear(x, *layer.gate)) * F.linear(x, *layer.up), *layer.down)
