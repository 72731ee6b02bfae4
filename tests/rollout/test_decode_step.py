"""`rollout.decode_step.DecodeStep`: the decode loop's steps without the model's top-level forward give the
tokens and log-probs the model's own forward gives, bit for bit.

Real tiny models (random init, built locally): Qwen2 and Qwen2.5-VL (with pictures), whose decoder layers
the step computes itself, and Llama and Qwen3, whose layers it calls as modules; left-padded prompts (the
additive padding mask) and prompts without padding (no mask), greedy and sampled with log-probs, float32 and
bfloat16. The reference is the same `decode` with `DecodeStep.build` giving None (the loop then calls the
model at every step, as before)."""

import pytest
import torch
from test_hf_decode import _sharpen, _text_batch, _vl_batch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import verl_npu.rollout.decode as decode_mod
from verl_npu.models.forward import vision_marker_ids
from verl_npu.models.loading import MODEL_LOAD_KWARGS
from verl_npu.rollout.base import SamplingParams, stop_and_pad_ids
from verl_npu.rollout.decode import PerRowSampler, decode
from verl_npu.rollout.decode_step import DecodeStep

NEW = 10
REAL_BUILD = DecodeStep.build  # before any test replaces it


def _decode_both(monkeypatch, model, ids, mask, mm, eos, pad, *, sampled: bool, n: int = 2):
    """(tokens, log-probs) with the step and with the model's forward at every step; and the steps built."""
    built = []

    def recording_build(*args, **kwargs):
        built.append(REAL_BUILD(*args, **kwargs))
        return built[-1]

    results = []
    for build in (recording_build, lambda *args, **kwargs: None):
        monkeypatch.setattr(decode_mod.DecodeStep, "build", build)
        params = SamplingParams(n=n, temperature=1.3, top_k=50, top_p=0.9, max_new_tokens=NEW)
        pick = PerRowSampler(params, list(range(7, 7 + ids.shape[0]))) if sampled else decode_mod.greedy_pick
        log_probs = []
        tokens = decode(
            model,
            ids,
            mask,
            max_new_tokens=NEW,
            eos_ids=eos,
            pad_id=pad,
            n=n,
            pick=pick,
            suppress_ids=vision_marker_ids(model.config),
            mm_inputs=mm or None,
            log_probs=log_probs,
        )
        results.append((tokens, log_probs[0]))
    return results, built


def _assert_same(results):
    (tokens, log_probs), (ref_tokens, ref_log_probs) = results
    assert tokens.shape[1] == NEW  # random-init models rarely stop: every step is compared
    assert torch.equal(tokens, ref_tokens)
    assert torch.equal(log_probs, ref_log_probs)
    assert torch.isfinite(log_probs).all() and (log_probs < 0).any()


@pytest.mark.parametrize("kind", ["text", "vl"])
@pytest.mark.parametrize("sampled", [False, True])
def test_own_layers_give_the_models_tokens_and_log_probs(kind, sampled, monkeypatch, tiny_lm_path, tiny_vl_path):
    tok, model, ids, mask, mm = _text_batch(tiny_lm_path) if kind == "text" else _vl_batch(tiny_vl_path)
    assert (mask == 0).any()  # left padding: the additive mask
    eos, pad = stop_and_pad_ids(model, tok)
    results, built = _decode_both(monkeypatch, model, ids, mask, mm, eos, pad, sampled=sampled)
    assert built[0] is not None and built[0].own_layers  # the path under test was taken
    _assert_same(results)


def test_prompts_without_padding_and_bfloat16(monkeypatch, tiny_lm_path):
    tok, model, ids, mask, _ = _text_batch(tiny_lm_path)
    ids, mask = ids[1:2], mask[1:2]  # the longest prompt alone: no padding, no mask
    assert bool(mask.all())
    eos, pad = stop_and_pad_ids(model, tok)
    results, built = _decode_both(monkeypatch, model, ids, mask, {}, eos, pad, sampled=True, n=3)
    assert built[0].own_layers and built[0].masks(ids.shape[1] + 1) is None
    _assert_same(results)
    _, model, ids, mask, _ = _text_batch(tiny_lm_path)
    model = model.to(torch.bfloat16)
    results, built = _decode_both(monkeypatch, model, ids, mask, {}, eos, pad, sampled=True)
    assert built[0].own_layers and built[0].masks(ids.shape[1] + 1).dtype == torch.bfloat16
    _assert_same(results)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_other_decoders_run_their_layers_as_modules(family, monkeypatch, tiny_lm_path):
    tok = AutoTokenizer.from_pretrained(tiny_lm_path)
    sizes = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = (
        LlamaForCausalLM(LlamaConfig(**sizes))
        if family == "llama"
        else Qwen3ForCausalLM(Qwen3Config(head_dim=16, **sizes))
    )
    model.config._attn_implementation = "sdpa"
    model = _sharpen(model)
    _, _, ids, mask, _ = _text_batch(tiny_lm_path)
    results, built = _decode_both(monkeypatch, model, ids, mask, {}, [tok.eos_token_id], tok.pad_token_id, sampled=True)
    assert built[0] is not None and not built[0].own_layers
    _assert_same(results)


def test_the_model_is_called_where_the_step_does_not_apply(monkeypatch, tiny_lm_path):
    tok, _, ids, mask, _ = _text_batch(tiny_lm_path)
    eager = _sharpen(
        AutoModelForCausalLM.from_pretrained(
            tiny_lm_path, dtype=torch.float32, attn_implementation="eager", **MODEL_LOAD_KWARGS
        )
    )
    eos, pad = stop_and_pad_ids(eager, tok)
    _, built = _decode_both(monkeypatch, eager, ids, mask, {}, eos, pad, sampled=False)
    assert built == [None]  # eager attention: the model's forward at every step
    _, model, _, _, _ = _text_batch(tiny_lm_path)
    model.model.register_forward_hook(lambda *args: None)  # a hook on a module the step would skip
    _, built = _decode_both(monkeypatch, model, ids, mask, {}, eos, pad, sampled=False)
    assert built == [None]
    _, model, _, _, _ = _text_batch(tiny_lm_path)
    model.model.layers[0].mlp.register_forward_hook(lambda *args: None)  # a hook inside a layer: called as modules
    results, built = _decode_both(monkeypatch, model, ids, mask, {}, eos, pad, sampled=False)
    assert built[0] is not None and not built[0].own_layers
    _assert_same(results)


@pytest.mark.parametrize("kind", ["text", "vl"])
def test_under_autocast_as_the_actor_generates_in_bfloat16(kind, monkeypatch, tiny_lm_path, tiny_vl_path):
    """The actor worker generates inside its engine's autocast when its compute dtype is not float32."""
    tok, model, ids, mask, mm = _text_batch(tiny_lm_path) if kind == "text" else _vl_batch(tiny_vl_path)
    eos, pad = stop_and_pad_ids(model, tok)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        results, built = _decode_both(monkeypatch, model, ids, mask, mm, eos, pad, sampled=True)
    assert built[0] is not None and built[0].own_layers
    _assert_same(results)
