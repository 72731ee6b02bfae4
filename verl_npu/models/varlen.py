"""Variable-length (packed) causal attention for the padding-free path, on every device.

`response_log_probs(remove_padding=True)` packs a micro-batch's real tokens into one [1, T] row.
Inside `packed_attention(model, lengths)` the language model's attention runs through
`varlen_attention_forward` (registered in transformers' AttentionInterface as
``verl_npu_varlen``, with no mask function, so transformers builds no [T, T] mask): every
sequence attends causally to itself only, from the cumulative lengths ``cu_seqlens``
([0, l0, l0+l1, ..., T]). The kernel is chosen by the device layer
(`DeviceInfo.varlen_attention_kernel`), one name per kernel in `VARLEN_KERNELS`:

- ``sdpa_sequences``: `torch.nn.functional.scaled_dot_product_attention` on the sequences gathered
  into right-padded [S, H, Lmax, D] batches, one per power-of-two query-length class (causal, so no
  mask unless prompts are shared), on CPU and wherever no fused kernel exists; only attention sees
  that padding, everything else runs packed;
- ``flash_attn``: flash-attention's `flash_attn_varlen_func` (CUDA with `flash-attn` installed);
- ``npu_fusion``: `torch_npu.npu_fusion_attention` in the TND layout with `actual_seq_qlen` /
  `actual_seq_kvlen` and a causal `sparse_mode` (Ascend).

All three compute softmax(q k^T * scaling + causal mask within the sequence) v per head, with
grouped-query heads (k/v heads shared by num_heads / num_kv_heads query heads).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

ATTENTION_NAME = "verl_npu_varlen"


@dataclass
class _Packed:
    cu_seqlens: torch.Tensor | None = None  # int64 [S + 1], on CPU: the queries of each sequence
    kernel: str = "sdpa_sequences"
    model: object = None  # the model whose attention is switched (for recomputation)
    key_index: torch.Tensor | None = None  # shared prompts: packed positions of each sequence's keys
    cu_k: torch.Tensor | None = None  # shared prompts: int64 [S + 1] delimiting key_index
    plans: dict = field(default_factory=dict)  # device -> `_sdpa_plan` of cu / cu_k, shared by the layers


_STATE = _Packed()


def _sdpa_sequences(q, k, v, cu: torch.Tensor, scaling: float, cu_k: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D] -> [T, H, D] with SDPA on the sequences gathered into right-padded
    [S, H, Lmax, D] batches (with a causal mask a real query never reaches a padded key), and the real
    positions gathered back. Attention only is padded; no [T, T] mask exists.

    Sequences are batched by query length (one SDPA call per power-of-two length class), so no batch
    pads a query to more than twice its length: a shared prompt (70 tokens) and its 32 responses of
    3 tokens would otherwise run 33 x 70 queries for 166 real ones.

    With `cu_k` (shared prompts) the keys of sequence s are k[cu_k[s]:cu_k[s+1]], at least as many
    as its queries, and the causal mask is aligned to the last key: the queries are the last
    tokens of the key sequence (a response after its prompt).

    The gather indices and masks depend on the lengths only, so inside `packed_attention` they are
    worked out once (`_sdpa_plan`) and every layer of the forward reuses them."""
    batches, order = _sdpa_plan(cu, cu_k, q.device)
    outs = [_sdpa_padded(q, k, v, batch, scaling) for batch in batches]
    if order is None:
        return outs[0]
    return torch.cat(outs).index_select(0, order)


@dataclass
class _SdpaBatch:
    """One SDPA call of `_sdpa_sequences`: S sequences right-padded to `longest` queries (and `k_longest` keys)."""

    sequences: int
    longest: int
    src: torch.Tensor  # [S x longest] packed position of each padded query (0 under padding)
    real: torch.Tensor  # the rows of the padded output that are real queries, sequence after sequence
    k_longest: int = 0
    k_src: torch.Tensor | None = None  # [S x k_longest] shared prompts: position in k of each padded key
    mask: torch.Tensor | None = None  # [S, 1, longest, k_longest] shared prompts: which keys each query sees


def _sdpa_plan(cu: torch.Tensor, cu_k: torch.Tensor | None, device) -> tuple[list[_SdpaBatch], torch.Tensor | None]:
    """The SDPA calls of `_sdpa_sequences` for these lengths and the order that puts their outputs back
    in packed order (None: one call, already in order); cached in the packed state while it holds `cu`."""
    cached = _STATE.cu_seqlens is cu and _STATE.cu_k is cu_k
    if cached and device in _STATE.plans:
        return _STATE.plans[device]
    lengths = cu[1:] - cu[:-1]
    classes = torch.ceil(torch.log2(lengths.clamp(min=1).double())).long()
    if bool((classes == classes[0]).all()):
        plan = [_sdpa_batch(cu, cu_k, torch.arange(len(lengths)), device)[0]], None
    else:
        batches, rows = [], []
        for c in torch.unique(classes).tolist():
            batch, at = _sdpa_batch(cu, cu_k, (classes == c).nonzero().squeeze(-1), device)
            batches.append(batch)
            rows.append(at)
        order = torch.empty(int(cu[-1]), dtype=torch.long)
        order[torch.cat(rows)] = torch.arange(int(cu[-1]))  # packed position -> its row in cat(outs)
        plan = batches, order.to(device)
    if cached:
        _STATE.plans[device] = plan
    return plan


def _sdpa_batch(cu, cu_k, seqs: torch.Tensor, device) -> tuple[_SdpaBatch, torch.Tensor]:
    """The SDPA call for the sequences `seqs` (indices into cu), and the packed positions of its real
    output rows in order."""
    starts, lengths = cu[:-1][seqs], (cu[1:] - cu[:-1])[seqs]
    longest = int(lengths.max())
    pos = torch.arange(longest)
    valid = pos[None, :] < lengths[:, None]  # [S, Lmax]
    src = torch.where(valid, starts[:, None] + pos[None, :], 0).reshape(-1)
    real = valid.reshape(-1).nonzero().squeeze(-1)  # sequence after sequence, real queries only
    batch = _SdpaBatch(len(lengths), longest, src.to(device), real.to(device))
    if cu_k is not None:
        k_starts, k_lengths = cu_k[:-1][seqs], (cu_k[1:] - cu_k[:-1])[seqs]
        batch.k_longest = int(k_lengths.max())
        k_pos = torch.arange(batch.k_longest)
        batch.k_src = (
            torch.where(k_pos[None, :] < k_lengths[:, None], k_starts[:, None] + k_pos[None, :], 0)
            .reshape(-1)
            .to(device)
        )
        # query i of a sequence sees key j iff j <= i + (keys - queries) and j is a real key; a padded
        # query (i >= queries) sees every real key, so no row of the mask is empty
        shift = (k_lengths - lengths)[:, None, None]
        mask = (k_pos[None, None, :] <= pos[None, :, None] + shift) & (k_pos[None, None, :] < k_lengths[:, None, None])
        batch.mask = mask.unsqueeze(1).to(device)
    return batch, src[real]


def _sdpa_padded(q, k, v, batch: _SdpaBatch, scaling: float) -> torch.Tensor:
    """One SDPA call (`batch`): the outputs of its sequences' real queries [sum of lengths, H, D], in order."""
    groups = q.shape[1] // k.shape[1]

    def gather(x, index, rows):  # [T, h, D] -> [S, h, rows, D]
        return x.index_select(0, index).view(batch.sequences, rows, *x.shape[1:]).transpose(1, 2)

    if batch.k_src is None:
        ks, vs = gather(k, batch.src, batch.longest), gather(v, batch.src, batch.longest)
    else:
        ks, vs = (gather(x, batch.k_src, batch.k_longest) for x in (k, v))
    if groups > 1:
        ks, vs = ks.repeat_interleave(groups, dim=1), vs.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(
        gather(q, batch.src, batch.longest), ks, vs, attn_mask=batch.mask, is_causal=batch.mask is None, scale=scaling
    )
    return out.transpose(1, 2).reshape(-1, *q.shape[1:]).index_select(0, batch.real)


def _flash_attn(q, k, v, cu: torch.Tensor, scaling: float, cu_k: torch.Tensor | None = None) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func

    cu_k = cu if cu_k is None else cu_k
    cu32, cu_k32 = (x.to(device=q.device, dtype=torch.int32) for x in (cu, cu_k))
    # flash-attention (>= 2.1) aligns the causal mask to the last key when there are more keys
    return flash_attn_varlen_func(
        q,
        k,
        v,
        cu32,
        cu_k32,
        int((cu[1:] - cu[:-1]).max()),
        int((cu_k[1:] - cu_k[:-1]).max()),
        softmax_scale=scaling,
        causal=True,
    )


_NPU_CAUSAL_MASK_SIZE = 2048  # the op's compressed causal mask is 2048 x 2048 (sparse_mode 3)


def _npu_fusion(q, k, v, cu: torch.Tensor, scaling: float, cu_k: torch.Tensor | None = None) -> torch.Tensor:
    import torch_npu

    mask = torch.ones(_NPU_CAUSAL_MASK_SIZE, _NPU_CAUSAL_MASK_SIZE, dtype=torch.bool, device=q.device).triu(1)
    ends = cu[1:].tolist()
    # sparse_mode 3 is the causal mask aligned to the bottom right (the last key), also when a
    # sequence has more keys than queries (shared prompts)
    return torch_npu.npu_fusion_attention(
        q,
        k,
        v,
        q.shape[1],
        input_layout="TND",
        scale=scaling,
        keep_prob=1.0,
        atten_mask=mask,
        sparse_mode=3,
        actual_seq_qlen=ends,
        actual_seq_kvlen=ends if cu_k is None else cu_k[1:].tolist(),
    )[0]


VARLEN_KERNELS: dict[str, Callable] = {
    "sdpa_sequences": _sdpa_sequences,
    "flash_attn": _flash_attn,
    "npu_fusion": _npu_fusion,
}


def varlen_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention-function signature: query [1, H, T, D], key/value [1, Hkv, T, D] of the
    packed row; returns ([1, T, H, D], None). Needs `packed_attention` around the model call."""
    cu = _STATE.cu_seqlens
    if cu is None:
        raise RuntimeError(f"{ATTENTION_NAME} attention runs only inside verl_npu.models.varlen.packed_attention")
    if query.shape[0] != 1 or int(cu[-1]) != query.shape[2]:
        raise RuntimeError(
            f"{ATTENTION_NAME}: expected one packed row of {int(cu[-1])} tokens, got {tuple(query.shape)}"
        )
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    # squeeze, not [0]: the backward of a view, where `x[0]`'s would fill a zero tensor of x's size and copy into it
    q, k, v = (x.squeeze(0).transpose(0, 1) for x in (query, key, value))  # [T, H, D]
    if _STATE.key_index is not None:  # shared prompts: each sequence's keys, its prompt's included
        index = _STATE.key_index.to(k.device)
        k, v = k.index_select(0, index), v.index_select(0, index)
        out = VARLEN_KERNELS[_STATE.kernel](q, k, v, cu, float(scaling), cu_k=_STATE.cu_k)
    else:
        out = VARLEN_KERNELS[_STATE.kernel](q, k, v, cu, float(scaling))
    return out.unsqueeze(0), None


def register_varlen_attention() -> str:
    """Register `varlen_attention_forward` (idempotent); no mask function, so no [T, T] mask is built."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, varlen_attention_forward)
    return ATTENTION_NAME


@contextlib.contextmanager
def packed_attention(
    model,
    lengths: torch.Tensor,
    kernel: str,
    *,
    key_index: torch.Tensor | None = None,
    key_lengths: torch.Tensor | None = None,
):
    """Within the block, `model`'s language-model attention is the variable-length `kernel` over the
    sequences of `lengths` (tokens per packed sequence, in order); the previous implementation is
    restored afterwards. A vision tower keeps its own attention.

    Shared prompts (`verl_npu.models.shared_prompt`): with `key_index` / `key_lengths`, sequence s
    attends to the packed positions key_index[sum(key_lengths[:s]) : sum(key_lengths[:s+1])] (its
    prompt's and its own), causally from the end: its queries are the last of those keys."""
    if kernel not in VARLEN_KERNELS:
        raise ValueError(f"unknown variable-length attention kernel {kernel!r}; known: {', '.join(VARLEN_KERNELS)}")
    register_varlen_attention()
    cu, cu_k = _cumulative(lengths), None
    if key_index is not None:
        cu_k = _cumulative(key_lengths)
        if int(cu_k[-1]) != len(key_index) or bool((key_lengths.cpu() < lengths.cpu()).any()):
            raise ValueError("key_lengths must add up to len(key_index), each at least its sequence's length")
    with _packed_state(cu, kernel, model, key_index, cu_k):
        yield


def _cumulative(lengths: torch.Tensor) -> torch.Tensor:
    lengths = lengths.detach().to("cpu", torch.int64)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    cu[1:] = lengths.cumsum(0)
    return cu


@contextlib.contextmanager
def _packed_state(cu: torch.Tensor, kernel: str, model, key_index=None, cu_k=None):
    """`model`'s text attention is the variable-length kernel over the sequences `cu` delimits; the
    previous implementation and packed state come back afterwards. Used by `packed_attention` and,
    for a forward's recomputation, by `checkpoint_context_fn`."""
    text_cfg = model.config.get_text_config()
    composite = text_cfg is not model.config
    fields = ("cu_seqlens", "kernel", "model", "key_index", "cu_k", "plans")
    previous, old_state = text_cfg._attn_implementation, tuple(getattr(_STATE, f) for f in fields)
    model.set_attn_implementation({"text_config": ATTENTION_NAME} if composite else ATTENTION_NAME)
    for name, value in zip(fields, (cu, kernel, model, key_index, cu_k, {})):
        setattr(_STATE, name, value)
    try:
        yield
    finally:
        for name, value in zip(fields, old_state):
            setattr(_STATE, name, value)
        model.set_attn_implementation({"text_config": previous} if composite else previous)


def checkpoint_context_fn():
    """`context_fn` for non-reentrant activation checkpointing (torch.utils.checkpoint).

    Activation checkpointing recomputes a layer's forward during the backward, after
    `packed_attention` has returned and restored the model's usual attention. Called at each
    checkpointed forward, this captures the packed state of that moment (if any) and returns a
    recomputation context that switches the same variable-length attention and sequence lengths on
    again, so the recomputed layer is the layer that ran (same numbers, same saved tensors)."""
    if _STATE.cu_seqlens is None or _STATE.model is None:
        return contextlib.nullcontext(), contextlib.nullcontext()
    return contextlib.nullcontext(), _packed_state(
        _STATE.cu_seqlens, _STATE.kernel, _STATE.model, _STATE.key_index, _STATE.cu_k
    )
