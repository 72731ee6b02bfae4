"""The `hf` rollout's own decode loop against transformers' `generate` on real tiny models.

Greedy: token for token equal to `generate(do_sample=False)` on padded batches of prompts of
different lengths, for the text model (Qwen2) and the vision-language model (Qwen2.5-VL, whose
3-D rope positions must continue correctly during decoding). Sampled: the same per-row seeds give
the same tokens as `generate` with the same sampler as its last logits processor (the path the
rollout used before it had its own loop)."""

import pytest
import torch
from PIL import Image
from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    LogitsProcessor,
    LogitsProcessorList,
)

from verl_npu.batch import Batch
from verl_npu.models.forward import VisionTokens, mm_token_type_ids, vision_marker_ids
from verl_npu.models.loading import MODEL_LOAD_KWARGS
from verl_npu.rollout.base import SamplingParams, stop_and_pad_ids
from verl_npu.rollout.decode import PerRowSampler, decode
from verl_npu.rollout.hf import HFRollout

NEW = 12


def _sharpen(model):
    """Re-draw the matrices with std 0.1 (seeded): the tiny random-init models' greedy output is one
    token repeated, which would not show a wrong position or a lost image; these weights make every
    row's greedy path depend on its prompt, image and positions."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() >= 2:
                weight.normal_(0, 0.1, generator=generator)
    return model.eval()


def _text_batch(path, extra_left_pad=0):
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = _sharpen(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **MODEL_LOAD_KWARGS))
    enc = tok(
        ["hi", "a much longer prompt with many more words in it", "three words here"], return_tensors="pt", padding=True
    )
    ids, mask = enc["input_ids"], enc["attention_mask"]
    if extra_left_pad:  # the data pipeline pads every prompt to data.max_prompt_length
        ids = torch.cat([torch.full((ids.shape[0], extra_left_pad), tok.pad_token_id), ids], 1)
        mask = torch.cat([torch.zeros(ids.shape[0], extra_left_pad, dtype=mask.dtype), mask], 1)
    return tok, model, ids, mask, {}


def _vl_batch(path):
    proc = AutoProcessor.from_pretrained(path)
    proc.tokenizer.padding_side = "left"
    model = _sharpen(AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, **MODEL_LOAD_KWARGS))
    questions = ["How many sides?", "What is the shape? answer with a number please, quickly"]
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
    assert (enc["attention_mask"] == 0).any()  # prompts of different lengths: left padding
    mm = {"pixel_values": enc["pixel_values"], "image_grid_thw": enc["image_grid_thw"]}
    return proc.tokenizer, model, enc["input_ids"], enc["attention_mask"], mm


def _repeat(ids, mask, mm, n):
    """Every prompt n times in a row, as `generate` needs them (images too: each one's patches)."""
    mm = dict(mm)
    if mm:
        patches = mm["pixel_values"].split(mm["image_grid_thw"].prod(-1).tolist())
        mm["pixel_values"] = torch.cat([p for p in patches for _ in range(n)])
        mm["image_grid_thw"] = mm["image_grid_thw"].repeat_interleave(n, 0)
    return ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0), mm


def _hf_generate(model, tok, ids, mask, mm, n=1, **kw):
    eos, pad = stop_and_pad_ids(model, tok)
    ids, mask, mm = _repeat(ids, mask, mm, n)
    extra = dict(mm)
    if mm:
        extra["mm_token_type_ids"] = mm_token_type_ids(ids, VisionTokens.of(model))
    suppress = vision_marker_ids(model.config)
    if suppress:
        extra["suppress_tokens"] = suppress
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=NEW,
            eos_token_id=eos,
            pad_token_id=pad,
            do_sample=False,
            temperature=None,
            top_k=None,
            top_p=None,
            **extra,
            **kw,
        )
    return out[:, ids.shape[1] :]


def _ours(model, tok, ids, mask, mm, **kw):
    eos, pad = stop_and_pad_ids(model, tok)
    return decode(
        model,
        ids,
        mask,
        max_new_tokens=NEW,
        eos_ids=eos,
        pad_id=pad,
        suppress_ids=vision_marker_ids(model.config),
        mm_inputs=mm,
        **kw,
    )


@pytest.mark.parametrize("kind", ["text", "vl"])
@pytest.mark.parametrize("n", [1, 2])
def test_greedy_decode_equals_generate(kind, n, tiny_lm_path, tiny_vl_path):
    tok, model, ids, mask, mm = _text_batch(tiny_lm_path) if kind == "text" else _vl_batch(tiny_vl_path)
    ref = _hf_generate(model, tok, ids, mask, mm, n=n)
    ours = _ours(model, tok, ids, mask, mm, n=n)  # each prompt prefilled once, its cache repeated n times
    assert ref.shape == (ids.shape[0] * n, NEW)  # a random-init model rarely stops: the whole length is compared
    assert torch.equal(ours, ref)
    # prompts differ in their greedy paths: positions and images matter
    assert len({tuple(r.tolist()) for r in ours}) == ids.shape[0]


def test_greedy_decode_with_ignore_eos_never_stops(tiny_lm_path):
    tok, model, ids, mask, mm = _text_batch(tiny_lm_path)
    eos, _ = stop_and_pad_ids(model, tok)
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(model.config.vocab_size))
    model.lm_head.bias.data[eos[0]] = 100.0  # EOS is every row's argmax
    assert (_ours(model, tok, ids, mask, mm)[:, 0] == eos[0]).all()
    assert _ours(model, tok, ids, mask, mm).shape[1] == 1  # every row finished at once
    forced = _ours(model, tok, ids, mask, mm, min_new_tokens=NEW)
    assert forced.shape[1] == NEW and not torch.isin(forced, torch.tensor(eos)).any()
    assert torch.equal(forced, _hf_generate(model, tok, ids, mask, mm, min_new_tokens=NEW))


def test_shared_left_padding_is_dropped_without_changing_tokens(tiny_lm_path):
    tok, model, ids, mask, mm = _text_batch(tiny_lm_path, extra_left_pad=20)
    engine = HFRollout(model, tok)
    widths = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    rollout = engine.generate(
        Batch({"input_ids": ids, "attention_mask": mask}), SamplingParams(n=1, do_sample=False, max_new_tokens=NEW)
    )
    ref = _hf_generate(model, tok, ids, mask, mm)
    assert torch.equal(rollout["responses"][:, : ref.shape[1]], ref)
    assert widths[0] == ids.shape[1] - 20  # the prefill never saw the 20 shared padding columns
    assert rollout["prompts"].shape == ids.shape  # the batch keeps its layout


class _AsLogitsProcessor(LogitsProcessor):
    """The rollout's sampler as `generate`'s last logits processor: 0 at the drawn token, -inf elsewhere."""

    def __init__(self, sampler, prompt_width):
        self.sampler, self.prompt_width = sampler, prompt_width

    def __call__(self, input_ids, scores):
        token = self.sampler(scores.float(), input_ids.shape[1] - self.prompt_width)
        return torch.full_like(scores, float("-inf")).scatter_(-1, token.unsqueeze(-1), 0.0)


@pytest.mark.parametrize("kind", ["text", "vl"])
def test_sampled_decode_equals_generate_with_the_same_seeds(kind, tiny_lm_path, tiny_vl_path):
    tok, model, ids, mask, mm = _text_batch(tiny_lm_path) if kind == "text" else _vl_batch(tiny_vl_path)
    params = SamplingParams(n=3, temperature=1.3, top_k=50, top_p=0.9, max_new_tokens=NEW)
    seeds = list(range(11, 11 + ids.shape[0]))
    ours = _ours(model, tok, ids, mask, mm, n=3, pick=PerRowSampler(params, seeds))
    ref = _hf_generate(
        model,
        tok,
        ids,
        mask,
        mm,
        n=3,
        logits_processor=LogitsProcessorList([_AsLogitsProcessor(PerRowSampler(params, seeds), ids.shape[1])]),
    )
    assert torch.equal(ours, ref)
    assert len({tuple(r.tolist()) for r in ours[:3]}) > 1  # a prompt's samples come from different streams
    other = _ours(model, tok, ids, mask, mm, n=3, pick=PerRowSampler(params, [s + 100 for s in seeds]))
    assert not torch.equal(other, ours)


def test_kv_cache_grows_in_place_with_the_values_concatenation_gives(tiny_lm_path):
    """`grow_in_place`: every layer's keys / values become the filled part of one buffer per layer, row
    i * n + j a copy of prompt row i (as `batch_repeat_interleave`), and each decode step's states are
    written after it (as `DynamicLayer`'s concatenation would hold them); past the buffer is an error."""
    from transformers.cache_utils import DynamicCache

    from verl_npu.rollout.decode import _cache_name, _InPlaceLayer, grow_in_place

    tok, model, ids, mask, _ = _text_batch(tiny_lm_path)
    name = _cache_name(model)  # `cache` from transformers 5.24 on, `past_key_values` before
    caches = []
    with torch.no_grad():
        for _ in range(2):
            cache = DynamicCache(config=model.config)
            model(input_ids=ids, attention_mask=mask, use_cache=True, **{name: cache})
            caches.append(cache)
    plain, grown = caches
    plain.batch_repeat_interleave(3)
    grow_in_place(grown, 3, new_tokens=2)
    assert all(type(layer) is _InPlaceLayer for layer in grown.layers)
    token = torch.full((len(ids) * 3, 1), 5)
    step_mask = torch.cat([mask.repeat_interleave(3, 0), torch.ones(len(ids) * 3, 2, dtype=mask.dtype)], 1)
    with torch.no_grad():
        for t in range(2):
            outs = [
                model(
                    input_ids=token,
                    attention_mask=step_mask[:, : ids.shape[1] + t + 1],
                    use_cache=True,
                    **{name: cache},
                ).logits
                for cache in (plain, grown)
            ]
            assert torch.equal(outs[0], outs[1])
    for a, b in zip(plain.layers, grown.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        assert b.keys.data_ptr() == b.key_buffer.data_ptr()  # a view of the buffer, not a copy
    with pytest.raises(RuntimeError, match="KV cache buffer holds"):
        grown.layers[0].update(grown.layers[0].keys[:, :, :1], grown.layers[0].values[:, :, :1])
