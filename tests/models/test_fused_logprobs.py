"""`model.use_fused_kernels`: chunked log-probs / entropy equal the unfused path, values and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from verl_npu.models.forward import response_log_probs
from verl_npu.models.fused_logprobs import chunk_tokens, chunked_log_probs, fused_head

TOL = dict(atol=1e-5, rtol=1e-5)


def _unfused(hidden, weight, bias, targets, temperature):
    logits = F.linear(hidden, weight, bias).float() / temperature
    logp = torch.log_softmax(logits, -1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_chunked_values_and_gradients_equal_the_full_logits(with_bias, chunk):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 11, 16, generator=gen, requires_grad=True)
    weight = (torch.randn(97, 16, generator=gen) * 0.5).requires_grad_(True)
    bias = (torch.randn(97, generator=gen) * 0.1).requires_grad_(True) if with_bias else None
    targets = torch.randint(0, 97, (2, 11), generator=gen)
    up_lp, up_ent = torch.randn(2, 11, generator=gen), torch.randn(2, 11, generator=gen)  # upstream gradients

    lp, ent = chunked_log_probs(hidden, weight, bias, targets, temperature=0.7, with_entropy=True, chunk=chunk)
    ((lp * up_lp).sum() + (ent * up_ent).sum()).backward()
    fused_grads = [t.grad.clone() for t in (hidden, weight, bias) if t is not None]
    for t in (hidden, weight, bias):
        if t is not None:
            t.grad = None

    ref_lp, ref_ent = _unfused(hidden, weight, bias, targets, 0.7)
    ((ref_lp * up_lp).sum() + (ref_ent * up_ent).sum()).backward()
    torch.testing.assert_close(lp, ref_lp, **TOL)
    torch.testing.assert_close(ent, ref_ent, **TOL)
    for got, t in zip(fused_grads, [t for t in (hidden, weight, bias) if t is not None]):
        torch.testing.assert_close(got, t.grad, **TOL)


def test_chunk_size_bounds_the_float32_logits():
    assert chunk_tokens(151_936) * 151_936 * 4 <= 64 * 1024 * 1024 + 16 * 151_936 * 4
    assert chunk_tokens(100) > 1000


def test_the_head_is_restored_after_the_fused_block(tiny_lm_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    ids = torch.tensor([[1, 2, 3]])
    with fused_head(model, temperature=1.0, with_entropy=True) as head:
        head.targets = torch.tensor([[2, 3, 0]])
        pair = model(input_ids=ids).logits
    assert pair.shape == (1, 3, 2)
    assert model(input_ids=ids).logits.shape[-1] == model.config.vocab_size


def _batch(vocab: int, prompt: int = 7, response: int = 5):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (3, prompt + response), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding of a short prompt
    mask[1, prompt + 3 :] = 0  # a short response
    return ids, mask, response


@pytest.mark.parametrize("remove_padding", [False, True])
def test_model_log_probs_entropy_and_gradients_equal_unfused(tiny_lm_path, remove_padding):
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    ids, mask, response = _batch(model.config.vocab_size)
    results = {}
    for fused in (False, True):
        model.zero_grad(set_to_none=True)
        lp, ent = response_log_probs(
            model, ids, mask, response, temperature=0.8, with_entropy=True, remove_padding=remove_padding, fused=fused
        )
        resp_mask = mask[:, -response:].float()
        ((lp * resp_mask).sum() - 0.3 * (ent * resp_mask).sum()).backward()
        results[fused] = (
            lp.detach(),
            ent.detach(),
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        )
    (lp0, ent0, g0), (lp1, ent1, g1) = results[False], results[True]
    keep = mask[:, -response:].bool()
    torch.testing.assert_close(lp1[keep], lp0[keep], **TOL)
    torch.testing.assert_close(ent1[keep], ent0[keep], **TOL)
    assert g0.keys() == g1.keys() and ({"lm_head.weight", "model.embed_tokens.weight"} & g0.keys())
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], atol=1e-5, rtol=1e-4, msg=name)


def test_vl_model_log_probs_equal_unfused(tiny_vl_path):
    from test_logprobs_and_rollout import _vl_prompts
    from transformers import AutoModelForImageTextToText

    tokenizer, prompts = _vl_prompts(tiny_vl_path)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_path, dtype=torch.float32).eval()
    ids = torch.cat([prompts["input_ids"], torch.randint(3, 100, (2, 4))], dim=1)
    mask = torch.cat([prompts["attention_mask"], torch.ones(2, 4, dtype=torch.long)], dim=1)
    with torch.no_grad():
        out = [
            response_log_probs(
                model,
                ids,
                mask,
                4,
                multi_modal_inputs=prompts["multi_modal_inputs"],
                with_entropy=True,
                remove_padding=True,
                fused=fused,
            )
            for fused in (False, True)
        ]
    torch.testing.assert_close(out[1][0], out[0][0], **TOL)
    torch.testing.assert_close(out[1][1], out[0][1], **TOL)


# ---- actor.use_torch_compile ------------------------------------------------------------------
@pytest.mark.slow
def test_torch_compile_gives_the_same_log_probs_entropy_and_gradients(tiny_lm_path):
    """One compilation (tens of seconds on CPU) serves both paths and every shape (dynamic=True)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    ids, mask, response = _batch(model.config.vocab_size)
    results = {}
    for fused, compile in ((False, False), (False, True), (True, True)):
        model.zero_grad(set_to_none=True)
        lp, ent = response_log_probs(
            model,
            ids,
            mask,
            response,
            temperature=0.8,
            with_entropy=True,
            remove_padding=True,
            fused=fused,
            compile=compile,
        )
        keep = mask[:, -response:].float()
        ((lp * keep).sum() - 0.3 * (ent * keep).sum()).backward()
        results[fused, compile] = (
            lp.detach(),
            ent.detach(),
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        )
    lp0, ent0, g0 = results[False, False]
    keep = mask[:, -response:].bool()
    for variant in ((False, True), (True, True)):
        lp1, ent1, g1 = results[variant]
        torch.testing.assert_close(lp1[keep], lp0[keep], **TOL)
        torch.testing.assert_close(ent1[keep], ent0[keep], **TOL)
        for name in g0:
            torch.testing.assert_close(g1[name], g0[name], atol=1e-5, rtol=1e-4, msg=name)


def test_fused_kernel_backend_torch_is_accepted_and_triton_refused_by_name():
    from verl_npu.config import load_recipe
    from verl_npu.errors import ConfigErrors

    key = "actor_rollout_ref.model.fused_kernel_options.impl_backend"
    rc = load_recipe("tiny_gsm8k", ["actor_rollout_ref.model.use_fused_kernels=true", f"{key}=torch"])
    assert rc.backend.actor_rollout_ref.model.use_fused_kernels is True
    with pytest.raises(ConfigErrors) as info:
        load_recipe("tiny_gsm8k", [f"{key}=triton"])
    (problem,) = info.value.problems
    assert problem.key == f"backend_config.{key}" and "triton" in problem.message
