"""Log-probs and entropy without the full [tokens x vocab] logits (`model.use_fused_kernels`).

The unfused path lets the model's `lm_head` produce logits for every token, then takes a float32
log-softmax (and softmax for the entropy) of the whole [T, V] tensor: several [T, V] float32
tensors live at once, which for a 150k vocabulary is ~600 KB per token each. Here, within
`fused_head`, the model's output projection receives the final hidden states [T, H] and returns
(log-prob, entropy) [T, 2] from `chunked_log_probs`, which projects `chunk` tokens at a time:

    z = (h_c @ W^T + b) / temperature           (float32, [chunk, V], then freed)
    log_prob_t = z_{t, y_t} - logsumexp(z_t)
    entropy_t  = logsumexp(z_t) - sum_v softmax(z_t)_v * z_{t,v}

The backward recomputes each chunk's logits (nothing of size V is kept between the passes) and
uses, with p = softmax(z), for upstream gradients g (log-prob) and e (entropy):

    dL/dz_{t,v} = g_t * (1[v = y_t] - p_{t,v}) - e_t * p_{t,v} * (z_{t,v} - sum_u p_{t,u} z_{t,u})

then dL/draw = dL/dz / temperature, dh = draw @ W, dW = draw^T @ h, db = sum_t draw. The numbers
are those of the unfused path (same float32 softmax), to rounding.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: float32 logits held at once per chunk (bytes): chunk tokens = this / (4 * vocab size).
CHUNK_BYTES = 64 * 1024 * 1024
MIN_CHUNK_TOKENS = 16


def chunk_tokens(vocab_size: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Tokens per chunk so that one chunk's float32 logits take about `chunk_bytes`."""
    return max(MIN_CHUNK_TOKENS, chunk_bytes // (4 * max(int(vocab_size), 1)))


def _matmul_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype the model's own lm_head matmul would use here (autocast's, when autocast is on)."""
    device_type = tensor.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return tensor.dtype


def log_probs_entropy(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool):
    """From (temperature-scaled) logits [..., V]: float32 log p(targets) and, when asked, the entropy
    ``-sum_v p_v log p_v``. The one formula both paths use (compiled by `compiled_log_probs_entropy`)."""
    logp = F.log_softmax(logits.float(), dim=-1)
    log_probs = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1) if with_entropy else None
    return log_probs, entropy


_COMPILED = None


def compiled_log_probs_entropy():
    """`log_probs_entropy` through torch.compile (dynamic shapes: one compilation serves every
    batch size and length), built once per process (`actor.use_torch_compile`)."""
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = torch.compile(log_probs_entropy, dynamic=True)
    return _COMPILED


def suppress_logits(logits: torch.Tensor, suppress: torch.Tensor | None) -> torch.Tensor:
    """`logits` with the tokens `suppress` (ids) set to the lowest finite value: probability 0 (as
    the rollout, which never samples them), and no NaN in `p log p` or a full KL where -inf would give one."""
    if suppress is None or not suppress.numel():
        return logits
    return logits.index_fill(-1, suppress.to(logits.device), torch.finfo(logits.dtype).min)


def _chunk_logits(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias,
    dtype: torch.dtype,
    temperature: float,
    suppress: torch.Tensor | None = None,
):
    raw = F.linear(h.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))
    return suppress_logits(raw.float() / temperature, suppress)


class _ChunkedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk, with_entropy, formula, suppress):
        dtype = _matmul_dtype(hidden)
        n = hidden.shape[0]
        log_probs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n, dtype=torch.float32, device=hidden.device) if with_entropy else None
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, n, chunk):
                stop = min(start + chunk, n)
                z = _chunk_logits(hidden[start:stop], weight, bias, dtype, temperature, suppress)
                lp, ent = formula(z, targets[start:stop], with_entropy)
                log_probs[start:stop] = lp
                if with_entropy:
                    entropy[start:stop] = ent
                del z, lp, ent
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.dtype, ctx.temperature, ctx.chunk, ctx.with_entropy = dtype, temperature, chunk, with_entropy
        ctx.suppress = suppress
        if entropy is None:
            return log_probs
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_lp, grad_ent=None):
        hidden, weight, bias, targets = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        n = hidden.shape[0]
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, n, ctx.chunk):
                stop = min(start + ctx.chunk, n)
                h = hidden[start:stop]
                z = _chunk_logits(h, weight, bias, ctx.dtype, ctx.temperature, ctx.suppress)
                p = torch.softmax(z, dim=-1)
                dz = torch.zeros_like(z)
                if grad_lp is not None:
                    dz -= p * grad_lp[start:stop].float().unsqueeze(-1)
                    dz.scatter_add_(-1, targets[start:stop].unsqueeze(-1), grad_lp[start:stop].float().unsqueeze(-1))
                if ctx.with_entropy and grad_ent is not None:
                    mean_z = (p * z).sum(-1, keepdim=True)
                    dz -= grad_ent[start:stop].float().unsqueeze(-1) * p * (z - mean_z)
                del z, p
                draw = dz / ctx.temperature
                if need_h:
                    grad_h[start:stop] = (draw @ weight.float()).to(hidden.dtype)
                if need_w:
                    grad_w += draw.t() @ h.float()
                if need_b:
                    grad_b += draw.sum(0)
                del dz, draw
        grad_w = grad_w.to(weight.dtype) if need_w else None
        grad_b = grad_b.to(bias.dtype) if need_b else None
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


def chunked_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk: int | None = None,
    compile: bool = False,
    suppress: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(targets) and (optionally) the entropy, float32, for hidden states [..., H] under the
    output projection `weight` [V, H] (+ `bias` [V]) and `temperature`, `chunk` tokens at a time
    (default: `chunk_tokens(V)`). Differentiable in `hidden`, `weight` and `bias`; the backward
    recomputes each chunk's logits. `compile`: each chunk's forward formula runs through
    `compiled_log_probs_entropy`. `suppress`: token ids of probability 0 (`suppress_logits`)."""
    lead = hidden.shape[:-1]
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_t = targets.reshape(-1).long()
    chunk = int(chunk or chunk_tokens(weight.shape[0]))
    formula = compiled_log_probs_entropy() if compile else log_probs_entropy
    out = _ChunkedLogProbs.apply(
        flat_h, weight, bias, flat_t, float(temperature), chunk, bool(with_entropy), formula, suppress
    )
    if with_entropy:
        log_probs, entropy = out
        return log_probs.reshape(lead), entropy.reshape(lead)
    return out.reshape(lead), None


@dataclass
class FusedHead:
    """What the model's output projection computes while `fused_head` is active: set `targets`
    (shaped like the hidden states without their last axis) before each model call."""

    temperature: float = 1.0
    with_entropy: bool = False
    compile: bool = False
    targets: torch.Tensor | None = None
    suppress: torch.Tensor | None = None  # token ids of probability 0 (the rollout never samples them)


@contextlib.contextmanager
def fused_head(
    model, temperature: float, with_entropy: bool, compile: bool = False, suppress: torch.Tensor | None = None
):
    """Within the block the model's output projection returns, instead of logits [..., V], the
    tensor [..., 2] of (log p(targets), entropy) computed by `chunked_log_probs` from its input
    hidden states and its own weight (the entropy column is 0 without `with_entropy`). The
    computation runs inside the projection's forward, where FSDP has gathered the weight (and
    gathers it again for the backward), so it works sharded as unsharded."""
    head = model.get_output_embeddings()
    state = FusedHead(float(temperature), bool(with_entropy), bool(compile), suppress=suppress)

    def forward(hidden):
        if state.targets is None or state.targets.shape != hidden.shape[:-1]:
            raise RuntimeError(
                f"fused log-probs: targets {None if state.targets is None else tuple(state.targets.shape)}"
                f" do not match the hidden states {tuple(hidden.shape[:-1])}"
            )
        lp, ent = chunked_log_probs(
            hidden,
            head.weight,
            head.bias,
            state.targets,
            state.temperature,
            state.with_entropy,
            compile=state.compile,
            suppress=state.suppress,
        )
        return torch.stack([lp, ent if ent is not None else torch.zeros_like(lp)], dim=-1)

    head.forward = forward
    try:
        yield state
    finally:
        del head.forward  # back to the class's forward
