"""Ulysses sequence parallelism (``ulysses_sequence_parallel_size > 1``) for packed sequences.

Within a sequence-parallel (SP) group of P ranks, every rank holds the same packed micro-batch
([1, T] tokens, padding-free) but runs the model on only T/P of its tokens. Everything outside
attention is per-token, so it needs no communication. Attention needs every token of a sequence,
so around it two all-to-alls swap what is split:

    q/k/v  [B, H, T/P, D]  --seq_to_heads-->  [B, H/P, T, D]   attention on all T tokens, H/P heads
    output [B, T, H/P, D]  --heads_to_seq-->  [B, T/P, H, D]

How a caller runs a model with SP (the steps `response_log_probs` needs):

1. Pack the micro-batch as usual: ``ids [1, T]`` and text position ids ``pos [1, T]`` that restart
   at 0 for every sequence (3-D rope: ``[k, 1, T]`` whose row 0 is the text positions).
2. ``local_ids, pad = pad_and_shard(ids, -1, group)`` and ``local_pos, _ = pad_and_shard(pos, -1,
   group)``: the sequence is padded to a multiple of P (padding gets position 0, i.e. every pad
   token is a one-token sequence of its own, so it never mixes with real tokens) and each rank
   keeps its contiguous slice.
3. Run the model with ``attn_implementation="verl_npu_ulysses"`` (call
   `register_ulysses_attention()` first) inside ``with sequence_parallel(group, global_pos):``
   where ``global_pos`` is the *padded, unsharded* position tensor (``F.pad`` of step 1's ``pos``
   with zeros to ``T + pad``; identical on every rank). Feed ``local_ids`` and ``local_pos``
   (rope uses the local positions; the attention mask uses the global ones).
4. ``logits = gather_sequence(local_logits, 1, group, pad)`` gives the [1, T, V] logits of the
   whole packed row on every rank (or gather per-token log-probs, which is cheaper).

Gradients: the backward of `gather_sequence` is this rank's slice of the incoming gradient, so
summing the parameter gradients over the SP group gives exactly the gradient of the
single-process run. FSDP *averages* gradients over all its ranks, SP peers included, while SP
peers see the same data: pass ``grad_scale=P`` to `gather_sequence` (or multiply the loss by P)
to keep the gradient of the whole data-parallel batch unchanged.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

ATTENTION_NAME = "verl_npu_ulysses"

# Inner attention implementations that take packed sequences as position ids (varlen kernels
# derive cu_seqlens from them); every other one gets an explicit block-diagonal causal mask.
_VARLEN_PREFIXES = ("flash_attention", "npu_flash", "kernels-community/flash")


@dataclass
class SPContext:
    """The current sequence-parallel state of this process.

    `group`: the SP process group (None: no SP). `inner`: the attention implementation that runs
    on full sequences (a name in transformers' `AttentionInterface`, e.g. "sdpa", "eager",
    "flash_attention_2"). `global_position_ids`: text position ids of the whole padded packed
    row, [B, T] (same on every rank), set per forward by `sequence_parallel`.
    """

    group: object | None = None
    inner: str = "sdpa"
    global_position_ids: torch.Tensor | None = None
    _mask_cache: dict = field(default_factory=dict)


_STATE = SPContext()


def set_sp_group(group, inner: str | None = None) -> None:
    """Make `group` the current SP group (None turns SP off); `inner` sets the inner attention."""
    _STATE.group = group
    if inner is not None:
        _STATE.inner = inner
    _STATE._mask_cache.clear()


def get_sp_group():
    return _STATE.group


def sp_size(group=None) -> int:
    group = group if group is not None else _STATE.group
    if group is None or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def sp_rank(group=None) -> int:
    group = group if group is not None else _STATE.group
    if group is None or not dist.is_initialized():
        return 0
    return dist.get_rank(group)


def _text_positions_2d(position_ids: torch.Tensor) -> torch.Tensor:
    """[T] -> [1, T]; [B, T] as is; [k, B, T] (3-D rope, row 0 = text positions) -> [B, T]."""
    if position_ids.dim() == 1:
        return position_ids.unsqueeze(0)
    if position_ids.dim() == 3:
        return position_ids[0]
    return position_ids


def set_global_position_ids(position_ids: torch.Tensor | None) -> None:
    """Record the padded, unsharded position ids of the packed row for the next forward."""
    _STATE.global_position_ids = None if position_ids is None else _text_positions_2d(position_ids)
    _STATE._mask_cache.clear()


@contextlib.contextmanager
def sequence_parallel(group, global_position_ids: torch.Tensor | None, inner: str | None = None):
    """Within the block: SP group `group` and the global (padded, unsharded) position ids are the
    current ones; the previous state is restored on exit (also on errors)."""
    saved = (_STATE.group, _STATE.inner, _STATE.global_position_ids)
    set_sp_group(group, inner)
    set_global_position_ids(global_position_ids)
    try:
        yield _STATE
    finally:
        _STATE.group, _STATE.inner, _STATE.global_position_ids = saved
        _STATE._mask_cache.clear()


# ----------------------------------------------------------------------------- collectives

# Set to True the first time the backend refuses all_to_all_single (then all_gather is used).
_A2A_UNSUPPORTED = False


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    """Split `x` into P equal chunks along `scatter_dim`, send chunk i to rank i, and concatenate
    the P chunks received (in rank order) along `gather_dim`."""
    global _A2A_UNSUPPORTED
    world = dist.get_world_size(group)
    if world == 1:
        return x
    scatter_dim %= x.dim()
    gather_dim %= x.dim()
    if x.shape[scatter_dim] % world:
        raise ValueError(f"all-to-all: size {x.shape[scatter_dim]} of dim {scatter_dim} is not divisible by {world}")
    chunks = x.chunk(world, dim=scatter_dim)
    if not _A2A_UNSUPPORTED:
        send = torch.stack(chunks, dim=0).contiguous()  # [P, ...]: chunk i is the i-th block of dim 0
        recv = torch.empty_like(send)
        try:
            dist.all_to_all_single(recv, send, group=group)
            return torch.cat(recv.unbind(0), dim=gather_dim)
        except (RuntimeError, NotImplementedError) as exc:
            if "support" not in str(exc).lower() and not isinstance(exc, NotImplementedError):
                raise
            _A2A_UNSUPPORTED = True
    # Fallback for backends without all_to_all: every rank gathers every rank's whole tensor and
    # keeps the chunks meant for it (P times the traffic, same numbers).
    gathered = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(gathered, x.contiguous(), group=group)
    me = dist.get_rank(group)
    return torch.cat([g.chunk(world, dim=scatter_dim)[me] for g in gathered], dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """All-to-all whose backward is the reverse all-to-all (scatter and gather dims swapped)."""

    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims = (scatter_dim, gather_dim)
        ctx.group = group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad.contiguous(), gather_dim, scatter_dim, ctx.group), None, None, None


def seq_to_heads(x: torch.Tensor, group=None, head_dim: int = 1, seq_dim: int = 2) -> torch.Tensor:
    """[.., H, .., T/P, ..] on each rank -> [.., H/P, .., T, ..]: rank r gets heads
    [r*H/P, (r+1)*H/P) of all T tokens (tokens in rank order). Default layout [B, H, T, D]."""
    group = group if group is not None else _STATE.group
    if sp_size(group) == 1:
        return x
    return _AllToAll.apply(x, head_dim, seq_dim, group)


def heads_to_seq(x: torch.Tensor, group=None, seq_dim: int = 1, head_dim: int = 2) -> torch.Tensor:
    """Inverse of `seq_to_heads`: [.., T, .., H/P, ..] -> [.., T/P, .., H, ..]. Default layout
    [B, T, H, D] (what transformers' attention functions return)."""
    group = group if group is not None else _STATE.group
    if sp_size(group) == 1:
        return x
    return _AllToAll.apply(x, seq_dim, head_dim, group)


def pad_and_shard(x: torch.Tensor, dim: int, sp_group=None, pad_value=0) -> tuple[torch.Tensor, int]:
    """Pad `x` along `dim` with `pad_value` to a multiple of P and return (this rank's contiguous
    slice of length padded/P, number of padded elements). Differentiable (the gradient of the
    input is zero outside this rank's slice)."""
    group = sp_group if sp_group is not None else _STATE.group
    world, rank = sp_size(group), sp_rank(group)
    dim %= x.dim()
    length = x.shape[dim]
    pad = (-length) % world
    if pad:
        spec = [0, 0] * (x.dim() - dim - 1) + [0, pad]
        x = F.pad(x, spec, value=pad_value)
    chunk = x.shape[dim] // world
    return x.narrow(dim, rank * chunk, chunk), pad


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local, dim, group, pad, grad_scale):
        world = dist.get_world_size(group)
        ctx.dim, ctx.group, ctx.pad, ctx.grad_scale = dim, group, pad, grad_scale
        ctx.rank, ctx.chunk = dist.get_rank(group), local.shape[dim]
        parts = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(parts, local.contiguous(), group=group)
        full = torch.cat(parts, dim=dim)
        return full.narrow(dim, 0, full.shape[dim] - pad)

    @staticmethod
    def backward(ctx, grad):
        dim = ctx.dim
        if ctx.pad:
            spec = [0, 0] * (grad.dim() - dim - 1) + [0, ctx.pad]
            grad = F.pad(grad, spec)
        grad = grad.narrow(dim, ctx.rank * ctx.chunk, ctx.chunk)
        if ctx.grad_scale != 1.0:
            grad = grad * ctx.grad_scale
        return grad.contiguous(), None, None, None, None


def gather_sequence(local: torch.Tensor, dim: int, sp_group=None, pad: int = 0, grad_scale: float = 1.0):
    """All-gather the per-rank slices along `dim` (rank order) and drop the last `pad` elements:
    the inverse of `pad_and_shard`. Backward: this rank's slice of the gradient, times
    `grad_scale` (see the module docstring for when to use P)."""
    group = sp_group if sp_group is not None else _STATE.group
    if sp_size(group) == 1:
        return local if not pad else local.narrow(dim, 0, local.shape[dim] - pad)
    return _GatherSequence.apply(local, dim % local.dim(), group, pad, float(grad_scale))


# ----------------------------------------------------------------------------- attention


def packed_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """Boolean [B, 1, T, T] mask, True where query i may attend key j: j <= i and both in the same
    packed sequence. A new sequence starts wherever the position does not grow by exactly 1 from
    the previous token (so restarts at 0, and every padding token at position 0, start one)."""
    pos = _text_positions_2d(position_ids)
    step = torch.diff(pos, dim=-1, prepend=pos[:, :1] - 1)
    seq_id = (step != 1).cumsum(-1)  # [B, T]
    length = pos.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=pos.device).tril()
    same = seq_id[:, :, None] == seq_id[:, None, :]
    return (same & causal).unsqueeze(1)


def _inner_is_varlen(inner: str) -> bool:
    return inner.startswith(_VARLEN_PREFIXES)


def _mask_for(inner: str, positions: torch.Tensor, dtype: torch.dtype, device, cacheable: bool) -> torch.Tensor:
    key = (inner, dtype, str(device))
    cached = _STATE._mask_cache.get(key) if cacheable else None
    if cached is None:
        mask = packed_causal_mask(positions.to(device))
        if inner != "sdpa":  # eager-style functions add the mask to the scores
            mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)
        cached = mask
        if cacheable:
            _STATE._mask_cache[key] = mask
    return cached


class _GroupedView:
    """`module` with another `num_key_value_groups` (kv heads repeated before the all-to-all)."""

    def __init__(self, module, groups: int):
        self._module = module
        self.num_key_value_groups = groups

    def __getattr__(self, name):
        return getattr(self._module, name)


def _gathered_positions(local_positions: torch.Tensor, group) -> torch.Tensor:
    parts = [torch.empty_like(local_positions) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local_positions.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def _inner_function(module, inner_name: str):
    from transformers import AttentionInterface

    if inner_name == "eager":  # each model file defines its own eager function
        import sys

        return sys.modules[type(module).__module__].eager_attention_forward
    if inner_name == ATTENTION_NAME or inner_name not in AttentionInterface._global_mapping:
        raise ValueError(
            f"{ATTENTION_NAME}: inner attention {inner_name!r} is not a registered attention implementation"
        )
    return AttentionInterface._global_mapping[inner_name]


def ulysses_attention_forward(module, query, key, value, attention_mask, **kwargs):
    """transformers attention function: q [B, H, T/P, D], k/v [B, Hkv, T/P, D] (rope applied) ->
    output [B, T/P, H, D] of causal attention within the packed sequences of the whole row.

    The inner implementation (`SPContext.inner`) runs on [B, H/P, T, D] with the block-diagonal
    causal mask of the global position ids (from `sequence_parallel`; when not set, the local
    position ids the model passes are all-gathered, one collective per layer). Varlen inner
    implementations (flash attention) get the global position ids instead of a mask.
    Non-causal modules (vision towers) and P == 1 without global positions go to the inner
    implementation unchanged.
    """
    inner_name = _STATE.inner
    inner = _inner_function(module, inner_name)
    group = _STATE.group
    world = sp_size(group)
    if not getattr(module, "is_causal", True):
        return inner(module, query, key, value, attention_mask, **kwargs)

    positions = _STATE.global_position_ids
    cacheable = positions is not None  # the cache is cleared whenever the global positions change
    if positions is None:
        local = kwargs.get("position_ids")
        if local is None:
            raise RuntimeError(
                f"{ATTENTION_NAME}: no position ids; run the model inside ulysses.sequence_parallel(group, "
                f"global_position_ids) or pass position_ids"
            )
        local = _text_positions_2d(local)
        positions = local if world == 1 else _gathered_positions(local, group)

    if world > 1:
        if kwargs.get("use_cache"):
            raise ValueError(
                f"{ATTENTION_NAME}: sequence parallelism needs use_cache=False in the model call "
                "(a KV cache would hold only this rank's tokens)"
            )
        heads, kv_heads = query.shape[1], key.shape[1]
        if heads % world:
            raise ValueError(f"{ATTENTION_NAME}: {heads} attention heads are not divisible by SP size {world}")
        if kv_heads % world:
            if world % kv_heads:
                raise ValueError(
                    f"{ATTENTION_NAME}: {kv_heads} kv heads and SP size {world}: one must divide the other"
                )
            # fewer kv heads than ranks: repeat each so that every rank gets one
            key = key.repeat_interleave(world // kv_heads, dim=1)
            value = value.repeat_interleave(world // kv_heads, dim=1)
        query = seq_to_heads(query, group)
        key = seq_to_heads(key, group)
        value = seq_to_heads(value, group)
        if positions.shape[-1] != query.shape[2]:
            raise ValueError(
                f"{ATTENTION_NAME}: global position ids cover {positions.shape[-1]} tokens but the gathered "
                f"sequence has {query.shape[2]}; pass the padded, unsharded position ids"
            )

    groups = query.shape[1] // key.shape[1]
    if groups != getattr(module, "num_key_value_groups", groups):
        module = _GroupedView(module, groups)
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith(("cu_seq_lens", "max_length_"))}
    if _inner_is_varlen(inner_name):
        kwargs["position_ids"] = positions.to(query.device)
        mask = None
    else:
        kwargs.pop("position_ids", None)
        mask = _mask_for(inner_name, positions, query.dtype, query.device, cacheable)
    out, weights = inner(module, query, key, value, mask, **kwargs)  # out [B, T, H/P, D]
    if world > 1:
        out = heads_to_seq(out, group)
    return out, weights


def register_ulysses_attention(name: str = ATTENTION_NAME) -> str:
    """Register `ulysses_attention_forward` in transformers' AttentionInterface under `name`
    (idempotent) and return the name. No attention-mask function is registered for it, so the
    model passes attention_mask=None and the mask is built here over the full sequence."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, ulysses_attention_forward)
    return name


def check_heads(config, sp: int) -> str | None:
    """The head constraints of Ulysses for SP size `sp`, as error text (None when they hold):
    num_attention_heads % sp == 0 and (num_key_value_heads % sp == 0 or sp % num_key_value_heads == 0)."""
    if sp <= 1:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    if heads is None:
        return "the model config has no num_attention_heads; Ulysses sequence parallelism cannot split its heads"
    if heads % sp:
        return (
            f"num_attention_heads={heads} is not divisible by ulysses_sequence_parallel_size={sp}; "
            f"choose a size that divides {heads}"
        )
    if kv_heads % sp and sp % kv_heads:
        return (
            f"num_key_value_heads={kv_heads} and ulysses_sequence_parallel_size={sp}: one must divide the other; "
            f"choose a size that divides {kv_heads} or a multiple of it that divides {heads}"
        )
    return None
