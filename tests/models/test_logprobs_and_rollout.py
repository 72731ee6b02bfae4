"""Training log-probs must equal a plain forward of the same model on the same tokens."""

import pytest
import torch
from PIL import Image
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from verl_npu.batch import Batch
from verl_npu.models.forward import (
    VisionTokens,
    merge_multi_modal_inputs,
    mm_token_type_ids,
    response_log_probs,
    vision_marker_ids,
)
from verl_npu.rollout.base import SamplingParams
from verl_npu.rollout.hf import HFRollout

RESPONSE_LEN = 6


def _vl_prompts(path):
    proc = AutoProcessor.from_pretrained(path)
    proc.tokenizer.padding_side = "left"
    questions = ["How many sides?", "What is the shape? answer with a number"]
    images = [Image.new("RGB", (56, 56), (255, 0, 0)), Image.new("RGB", (112, 84), (0, 128, 255))]
    texts = [
        proc.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for q in questions
    ]
    enc = proc(text=texts, images=images, return_tensors="pt", padding=True)
    rows = []
    for text, image in zip(texts, images):
        one = proc(text=[text], images=[image], return_tensors="pt")
        rows.append({"pixel_values": one["pixel_values"], "image_grid_thw": one["image_grid_thw"]})
    batch = Batch(
        {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}, {"multi_modal_inputs": rows}
    )
    return proc.tokenizer, batch


def _plain_log_probs(model, rollout: Batch, suppress_vision: bool = True) -> torch.Tensor:
    """Reference: the model's own forward (it computes its own 3-D rope positions). The rollout never
    samples image / video marker tokens, so (`suppress_vision`) they get probability 0 here too."""
    ids = rollout["input_ids"]
    kwargs = {}
    if VisionTokens.of(model).is_vision:
        kwargs = merge_multi_modal_inputs(rollout["multi_modal_inputs"], "cpu")
        kwargs["mm_token_type_ids"] = mm_token_type_ids(ids, VisionTokens.of(model))
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=rollout["attention_mask"], **kwargs).logits
    length = ids.shape[1]
    logits = logits[:, length - RESPONSE_LEN - 1 : length - 1].float()
    if suppress_vision:
        logits[..., vision_marker_ids(model.config)] = float("-inf")
    return torch.log_softmax(logits, -1).gather(-1, rollout["responses"].unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_vl_training_log_probs_equal_plain_forward(tiny_vl_path, remove_padding):
    tokenizer, prompts = _vl_prompts(tiny_vl_path)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_path, dtype=torch.float32).eval()
    torch.manual_seed(0)
    rollout = HFRollout(model, tokenizer).generate(prompts, SamplingParams(n=2, max_new_tokens=RESPONSE_LEN))
    assert rollout["responses"].shape == (4, RESPONSE_LEN)
    with torch.no_grad():
        lp, _ = response_log_probs(
            model,
            rollout["input_ids"],
            rollout["attention_mask"],
            RESPONSE_LEN,
            multi_modal_inputs=rollout["multi_modal_inputs"],
            remove_padding=remove_padding,
        )
    mask = rollout["response_mask"].bool()
    ref = _plain_log_probs(model, rollout)
    torch.testing.assert_close(lp[mask], ref[mask], atol=1e-5, rtol=1e-5)
    # the log-probs are real: not all equal, all <= 0
    assert (lp[mask] <= 0).all() and lp[mask].std() > 0
    # and they describe the distribution the rollout samples from: the vision markers' share is left out
    # (a random-init model gives them real probability, which used to leak into the training log-probs)
    assert (lp[mask] > _plain_log_probs(model, rollout, suppress_vision=False)[mask] + 1e-4).all()


def text_rollout(path, texts: list[str], n: int, seed: int | None = None) -> tuple:
    """(the tiny text model in float32, eval mode; its hf rollout of `texts`, left-padded, `n` samples each),
    the global RNG seeded with `seed` just before the rollout when given."""
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    enc = tok(texts, return_tensors="pt", padding=True)
    prompts = Batch({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    if seed is not None:
        torch.manual_seed(seed)
    return model, HFRollout(model, tok).generate(prompts, SamplingParams(n=n, max_new_tokens=RESPONSE_LEN))


@pytest.mark.parametrize("remove_padding", [False, True])
def test_text_log_probs_equal_plain_forward_with_padding(tiny_lm_path, remove_padding):
    model, rollout = text_rollout(
        tiny_lm_path, ["a short one", "a much longer prompt with many more words in it"], n=3, seed=1
    )
    with torch.no_grad():
        lp, ent = response_log_probs(
            model,
            rollout["input_ids"],
            rollout["attention_mask"],
            RESPONSE_LEN,
            with_entropy=True,
            remove_padding=remove_padding,
        )
    mask = rollout["response_mask"].bool()
    torch.testing.assert_close(lp[mask], _plain_log_probs(model, rollout)[mask], atol=1e-5, rtol=1e-5)
    assert (ent[mask] > 0).all()


def test_temperature_scales_logits(tiny_lm_path):
    tok = AutoTokenizer.from_pretrained(tiny_lm_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32).eval()
    ids = tok(["one two three four"], return_tensors="pt")["input_ids"]
    mask = torch.ones_like(ids)
    with torch.no_grad():
        hot, _ = response_log_probs(model, ids, mask, 2, temperature=2.0)
        logits = model(input_ids=ids).logits[:, -3:-1] / 2.0
    ref = torch.log_softmax(logits, -1).gather(-1, ids[:, -2:].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(hot, ref, atol=1e-5, rtol=1e-5)


def test_rollout_masks_tokens_after_eos(tiny_lm_path):
    from verl_npu.rollout.base import finish_rollout

    prompts = Batch({"input_ids": torch.tensor([[5, 6]]), "attention_mask": torch.ones(1, 2, dtype=torch.long)})
    responses = torch.tensor([[7, 9, 8, 7], [9, 9, 7, 7]])  # 9 = EOS
    out = finish_rollout(prompts, responses, eos_ids=[9], pad_id=0, n=2)
    assert out["response_mask"].tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]
    assert out["responses"].tolist() == [[7, 9, 0, 0], [9, 0, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]
    assert out["input_ids"].shape == (2, 6)


def test_greedy_rollout_is_deterministic_and_ignore_eos_fills_length(tiny_lm_path):
    tok = AutoTokenizer.from_pretrained(tiny_lm_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32).eval()
    enc = tok(["count the sides"], return_tensors="pt")
    prompts = Batch({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    engine = HFRollout(model, tok)
    greedy = SamplingParams(n=2, do_sample=False, max_new_tokens=5, ignore_eos=True)
    a = engine.generate(prompts, greedy)
    b = engine.generate(prompts, greedy)
    assert torch.equal(a["responses"], b["responses"])
    assert torch.equal(a["responses"][0], a["responses"][1])
    assert a["response_mask"].sum().item() == 10


def test_samples_depend_on_the_prompt_not_on_its_batch(tiny_lm_path, monkeypatch):
    """One decode (one prefill) per batch, still seeded per prompt: the same uid gets the same samples
    alone or in a batch (1 vs N workers); the same seed gives the same samples twice."""
    import verl_npu.rollout.hf as hf

    tok = AutoTokenizer.from_pretrained(tiny_lm_path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32).eval()
    calls = []
    real_decode = hf.decode
    monkeypatch.setattr(
        hf,
        "decode",
        lambda module, ids, *a, **kw: calls.append((ids.shape[0], kw["n"])) or real_decode(module, ids, *a, **kw),
    )
    enc = tok(["first prompt here", "the second one"], return_tensors="pt", padding=True)
    both = Batch({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}, {"uid": ["u1", "u2"]})
    engine = HFRollout(model, tok, seed=7)
    params = SamplingParams(n=3, max_new_tokens=5, ignore_eos=True)
    together = engine.generate(both, params)
    assert calls == [(2, 3)]  # all prompts x n samples in one call
    assert torch.equal(engine.generate(both, params)["responses"], together["responses"])
    alone = engine.generate(both.slice(1, 2), params)
    assert torch.equal(together["responses"][3:], alone["responses"])
    # the n samples of a prompt come from different streams
    assert len({tuple(r.tolist()) for r in together["responses"][:3]}) > 1
    other_seed = HFRollout(model, tok, seed=8).generate(both.slice(1, 2), params)
    assert not torch.equal(other_seed["responses"], alone["responses"])


def test_per_row_sampler_draws_from_the_warped_distribution():
    """The inverse-CDF draw follows softmax(logits / T) restricted by top-k."""
    from verl_npu.rollout.decode import PerRowSampler

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]])
    rows = 4000
    params = SamplingParams(n=rows, temperature=0.8, top_k=4, max_new_tokens=1)
    sampler = PerRowSampler(params, [123])
    tokens = sampler(logits.expand(rows, -1).clone(), 0)
    assert tokens.shape == (rows,)
    counts = torch.bincount(tokens, minlength=5).float() / rows
    expected = torch.softmax(torch.tensor([2.0, 1.0, 0.0, float("-inf"), 0.5]) / 0.8, -1)
    assert counts[3] == 0  # cut by top-k
    torch.testing.assert_close(counts, expected, atol=0.03, rtol=0)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_returned_logits_give_the_same_log_probs(tiny_lm_path, remove_padding):
    model, rollout = text_rollout(tiny_lm_path, ["short", "a longer prompt than that"], n=2)
    with torch.no_grad():
        lp, _, logits = response_log_probs(
            model,
            rollout["input_ids"],
            rollout["attention_mask"],
            RESPONSE_LEN,
            temperature=0.7,
            remove_padding=remove_padding,
            return_logits=True,
        )
    assert logits.shape == (4, RESPONSE_LEN, model.config.vocab_size)
    from_logits = torch.log_softmax(logits, -1).gather(-1, rollout["responses"].unsqueeze(-1)).squeeze(-1)
    mask = rollout["response_mask"].bool()
    torch.testing.assert_close(from_logits[mask], lp[mask], atol=1e-5, rtol=1e-5)


def test_hf_rollout_computes_on_the_workers_device_not_its_parameters(tiny_lm_path):
    """Under FSDP2 parameter offload the parameters rest on the host while the forward runs on the GPU: the
    rollout must put its inputs on the worker's device (on an H200 it put them on the parameters' device, the
    CPU, and decode failed: bench/results/cuda_check.md). Checked here by the wiring, which needs no GPU."""
    from verl_npu.config import load_recipe
    from verl_npu.device import DeviceInfo

    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_path)
    cfg = load_recipe("tiny_tool_gsm8k").typed
    engine = HFRollout.from_config(model, tokenizer, None, cfg, device=DeviceInfo("cuda"))
    assert engine.compute_device == torch.device("cuda", 0)
    assert engine.agent_loop.torch_device() == torch.device("cuda", 0)
    local = HFRollout.from_config(model, tokenizer, None, cfg, device=DeviceInfo("cpu"))
    assert local.compute_device == torch.device("cpu") and local.agent_loop.torch_device() == torch.device("cpu")
