"""Padding-free attention: the variable-length kernels give the padded path's numbers."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from run_helpers import assert_packed_matches_padded
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_npu.device import varlen_attention_kernel
from verl_npu.models import varlen
from verl_npu.models.loading import enable_activation_checkpointing

RESPONSE = 5


def _mixed_batch(tok):
    """Left-padded prompts of different lengths, right-padded responses of lengths 5, 1, 3."""
    tok.padding_side = "left"
    enc = tok(["a much longer prompt than the others here", "hi", "a medium prompt"], return_tensors="pt", padding=True)
    responses = torch.randint(3, 200, (3, RESPONSE))
    response_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]])
    responses = responses.masked_fill(response_mask == 0, tok.pad_token_id)
    ids = torch.cat([enc["input_ids"], responses], 1)
    mask = torch.cat([enc["attention_mask"], response_mask], 1)
    return ids, mask, response_mask.bool()


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "activation-checkpointing"])
def test_packed_log_probs_and_gradients_equal_the_padded_path(tiny_lm_path, monkeypatch, checkpointing):
    """With activation checkpointing the backward recomputes each layer after the packed call has
    returned: the recomputation must run the same variable-length attention (else the gradients
    would come from attention across sequences, or torch's checkpoint check fails)."""
    tok = AutoTokenizer.from_pretrained(tiny_lm_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    if checkpointing:
        enable_activation_checkpointing(model)
        model.train()
    torch.manual_seed(0)
    ids, mask, resp = _mixed_batch(tok)
    seen = []
    real = varlen.varlen_attention_forward
    monkeypatch.setattr(
        varlen,
        "varlen_attention_forward",
        lambda m, q, k, v, a, **kw: seen.append((a, q.shape)) or real(m, q, k, v, a, **kw),
    )
    assert_packed_matches_padded(model, ids, mask, resp, RESPONSE)
    # the packed forward ran through the varlen kernel, one packed row, and no mask was built
    layers = model.config.num_hidden_layers
    assert len(seen) == layers * (2 if checkpointing else 1) and all(
        a is None and shape[0] == 1 and shape[2] == int(mask.sum()) for a, shape in seen
    )
    # the previous implementation is back for generate and the padded path
    assert model.config._attn_implementation == "sdpa"


def _reference_attention(q, k, v, cu, scale):
    """Dense softmax attention with a block-diagonal causal mask ([T, H, D] layout), for checking."""
    t = q.shape[0]
    seq = torch.repeat_interleave(torch.arange(len(cu) - 1), cu[1:] - cu[:-1])
    allowed = (seq[:, None] == seq[None, :]) & torch.ones(t, t, dtype=torch.bool).tril()
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    scores = torch.einsum("thd,shd->hts", q, k) * scale
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v)


def test_sdpa_sequences_matches_dense_block_diagonal_attention():
    torch.manual_seed(0)
    cu = torch.tensor([0, 4, 5, 9, 16])  # lengths 4, 1, 4, 7: two sequences share a length
    q, k, v = torch.randn(16, 4, 8), torch.randn(16, 2, 8), torch.randn(16, 2, 8)
    out = varlen.VARLEN_KERNELS["sdpa_sequences"](q, k, v, cu, 0.3)
    torch.testing.assert_close(out, _reference_attention(q, k, v, cu, 0.3), atol=1e-5, rtol=1e-5)


def test_sdpa_sequences_with_shared_prompt_keys_batches_by_query_length(monkeypatch):
    """A prompt and its short responses (each response's keys: the prompt's and its own, causal from the
    end) equal explicit per-sequence attention, values and gradients, in float64; and no SDPA call pads
    a query to more than twice its length (a 40-token prompt beside 1-3-token responses)."""
    torch.manual_seed(0)
    q_lengths = torch.tensor([40, 1, 3, 2, 3, 1, 17, 2])
    k_lengths = torch.tensor([40, 41, 43, 42, 43, 41, 17, 19])
    cu, cu_k = varlen._cumulative(q_lengths), varlen._cumulative(k_lengths)
    q = torch.randn(int(cu[-1]), 4, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(int(cu_k[-1]), 2, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(int(cu_k[-1]), 2, 8, dtype=torch.float64, requires_grad=True)
    padded = []
    real_sdpa = varlen.F.scaled_dot_product_attention
    monkeypatch.setattr(
        varlen.F,
        "scaled_dot_product_attention",
        lambda q_, *a, **kw: padded.append(q_.shape[0] * q_.shape[2]) or real_sdpa(q_, *a, **kw),
    )
    out = varlen.VARLEN_KERNELS["sdpa_sequences"](q, k, v, cu, 0.3, cu_k=cu_k)
    expected = []
    for s in range(len(q_lengths)):
        qs, ks, vs = q[cu[s] : cu[s + 1]], k[cu_k[s] : cu_k[s + 1]], v[cu_k[s] : cu_k[s + 1]]
        ks, vs = ks.repeat_interleave(2, 1), vs.repeat_interleave(2, 1)
        seen = torch.arange(len(ks))[None, :] <= torch.arange(len(qs))[:, None] + (len(ks) - len(qs))
        scores = torch.einsum("qhd,khd->hqk", qs, ks).mul(0.3).masked_fill(~seen, float("-inf"))
        expected.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), vs))
    expected = torch.cat(expected)
    torch.testing.assert_close(out, expected)
    for got, want in zip(
        torch.autograd.grad(out.sin().sum(), (q, k, v)), torch.autograd.grad(expected.sin().sum(), (q, k, v))
    ):
        torch.testing.assert_close(got, want)
    assert len(padded) > 1 and sum(padded) <= 2 * int(cu[-1]), padded


def test_npu_kernel_passes_the_tnd_layout_and_cumulative_lengths(monkeypatch):
    """On Ascend the fused op gets TND tensors, cumulative sequence ends and the causal sparse mode;
    a stand-in torch_npu computes what the op documents (dense block-diagonal causal attention)."""
    calls = []

    def npu_fusion_attention(
        q, k, v, head_num, input_layout, scale, keep_prob, atten_mask, sparse_mode, actual_seq_qlen, actual_seq_kvlen
    ):
        calls.append((head_num, input_layout, sparse_mode, actual_seq_qlen, actual_seq_kvlen, atten_mask.shape))
        assert actual_seq_qlen == actual_seq_kvlen and keep_prob == 1.0
        cu = torch.tensor([0] + list(actual_seq_qlen))
        return (_reference_attention(q, k, v, cu, scale), None, None)

    fake = types.ModuleType("torch_npu")
    fake.npu_fusion_attention = npu_fusion_attention
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    assert varlen_attention_kernel("npu") == "npu_fusion"
    assert varlen_attention_kernel("cpu") == "sdpa_sequences"
    torch.manual_seed(1)
    cu = torch.tensor([0, 3, 8])
    q, k, v = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)  # [1, H, T, D]
    with monkeypatch.context() as m:
        m.setattr(varlen, "_STATE", varlen._Packed(cu, "npu_fusion"))
        npu_out, _ = varlen.varlen_attention_forward(None, q, k, v, None, scaling=0.25)
        m.setattr(varlen, "_STATE", varlen._Packed(cu, "sdpa_sequences"))
        cpu_out, _ = varlen.varlen_attention_forward(None, q, k, v, None, scaling=0.25)
    assert calls == [(4, "TND", 3, [3, 8], [3, 8], (2048, 2048))]
    assert npu_out.shape == (1, 8, 4, 16)
    torch.testing.assert_close(npu_out, cpu_out, atol=1e-5, rtol=1e-5)


def test_varlen_attention_outside_a_packed_call_is_an_error():
    with pytest.raises(RuntimeError, match="packed_attention"):
        varlen.varlen_attention_forward(
            None, torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), None
        )
