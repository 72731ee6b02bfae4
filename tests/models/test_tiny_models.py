"""Tiny local models: build, cache, tokenizer, chat template, processor, forward/backward/generate."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from verl_npu.errors import UserError
from verl_npu.models import tiny


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("verl_npu_cache")


@pytest.fixture(scope="module")
def vl_dir(cache_dir) -> Path:
    return tiny.materialize("tiny://qwen25vl", cache_dir=cache_dir)


@pytest.fixture(scope="module")
def text_dir(cache_dir) -> Path:
    return tiny.materialize("tiny://qwen2", cache_dir=cache_dir)


@pytest.fixture(scope="module")
def processor(vl_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(vl_dir)


@pytest.fixture(scope="module")
def vl_model(vl_dir):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(vl_dir)


def _image(width: int, height: int, seed: int = 0) -> Image.Image:
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=g, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def _vl_prompt(question: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]


# ----------------------------------------------------------------------------- cache


def test_materialize_layout_and_reuse(cache_dir, vl_dir):
    assert vl_dir.parent == cache_dir / "tiny"
    assert vl_dir.name == f"qwen25vl-{tiny.build_hash('qwen25vl')}"
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "processor_config.json",
    ):
        assert (vl_dir / name).is_file(), name
    mtime = (vl_dir / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    again = tiny.materialize("tiny://qwen25vl", cache_dir=cache_dir)
    assert time.perf_counter() - start < 1.0
    assert again == vl_dir
    assert (vl_dir / "model.safetensors").stat().st_mtime_ns == mtime  # not rebuilt
    assert not [p for p in (cache_dir / "tiny").iterdir() if ".building-" in p.name]


def test_materialize_uses_env_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VERL_NPU_CACHE", str(tmp_path / "envcache"))
    assert tiny.default_cache_dir() == tmp_path / "envcache"
    monkeypatch.delenv("VERL_NPU_CACHE")
    assert tiny.default_cache_dir() == Path.home() / ".cache" / "verl_npu"


def test_materialize_race_keeps_the_winner(monkeypatch, tmp_path):
    """Another process renames its build into place while ours is building: ours is dropped."""
    final = tmp_path / "tiny" / f"qwen2-{tiny.build_hash('qwen2')}"

    def racing_builder(out_dir, *, seed=0):
        # the "other process" finishes first
        final.mkdir(parents=True)
        (final / "config.json").write_text('{"who": "winner"}')
        (Path(out_dir) / "config.json").write_text('{"who": "loser"}')
        return Path(out_dir)

    monkeypatch.setitem(tiny.TINY_BUILDERS, "qwen2", racing_builder)
    got = tiny.materialize("tiny://qwen2", cache_dir=tmp_path)
    assert got == final
    assert (got / "config.json").read_text() == '{"who": "winner"}'
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == [final.name]


def test_foreign_incomplete_cache_folder_is_user_error(monkeypatch, tmp_path):
    final = tmp_path / "tiny" / f"qwen2-{tiny.build_hash('qwen2')}"
    final.mkdir(parents=True)
    (final / "stray.txt").write_text("not a model")

    def builder(out_dir, *, seed=0):
        (Path(out_dir) / "config.json").write_text("{}")

    monkeypatch.setitem(tiny.TINY_BUILDERS, "qwen2", builder)
    with pytest.raises(UserError, match="incomplete.*delete it"):
        tiny.materialize("tiny://qwen2", cache_dir=tmp_path)
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == [final.name]


def test_failed_build_leaves_no_folder(monkeypatch, tmp_path):
    def broken_builder(out_dir, *, seed=0):
        (Path(out_dir) / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setitem(tiny.TINY_BUILDERS, "qwen2", broken_builder)
    with pytest.raises(RuntimeError, match="disk full"):
        tiny.materialize("tiny://qwen2", cache_dir=tmp_path)
    assert list((tmp_path / "tiny").iterdir()) == []


def test_unknown_tiny_name_lists_known_ones(tmp_path):
    with pytest.raises(UserError, match=r"tiny://qwen25vl, tiny://qwen2") as err:
        tiny.materialize("tiny://llama", cache_dir=tmp_path)
    assert "tiny://llama" in str(err.value)
    assert tiny.is_tiny_uri("tiny://qwen2") and not tiny.is_tiny_uri("/models/qwen2") and not tiny.is_tiny_uri(None)


def test_unknown_size_override_is_user_error(tmp_path):
    with pytest.raises(UserError, match="hidden_sise"):
        tiny.build_tiny_qwen2(tmp_path, hidden_sise=64)


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_vocab_specials_and_round_trip(vl_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(vl_dir)
    assert len(tok) == tiny.VOCAB_SIZE <= 600
    assert tok.pad_token == "<|endoftext|>" and tok.eos_token == "<|im_end|>"
    for special in tiny.QWEN25_SPECIAL_TOKENS:
        ids = tok(special, add_special_tokens=False).input_ids
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == special
    for text in [
        "Find x. Round to the nearest tenth if necessary. x = 12.5",
        "<think> The hexagon has 6 sides. </think> \\boxed{6}",
        "Ünïcödé ✓ 三角形 \t tabs\n\nnewlines  'll it's",
        "$\\frac{3}{4} + \\sqrt{2} = \\angle ABC^\\circ$",
    ]:
        ids = tok(text, add_special_tokens=False).input_ids
        assert tok.decode(ids) == text
    # no BOS: encoding adds nothing around the text
    assert tok("7").input_ids == tok("7", add_special_tokens=False).input_ids


def test_digits_are_single_tokens(vl_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(vl_dir)
    digit_ids = set()
    for d in "0123456789":
        ids = tok(d, add_special_tokens=False).input_ids
        assert len(ids) == 1, d
        digit_ids.add(ids[0])
    assert len(digit_ids) == 10
    ids = tok("2024", add_special_tokens=False).input_ids
    assert tok.convert_ids_to_tokens(ids) == ["2", "0", "2", "4"]


def test_saved_tokenizer_matches_built_one_for_both_models(vl_dir, text_dir):
    """transformers may load the qwen2 folder with its Qwen2Tokenizer class; tokens must not change."""
    from transformers import AutoTokenizer

    built = tiny.build_tokenizer()
    text = "It's 3.14!\n\n  <|im_start|>user\nFind   the area of ABCD.<|im_end|>\n héllo"
    for folder in (vl_dir, text_dir):
        loaded = AutoTokenizer.from_pretrained(folder)
        assert loaded(text).input_ids == built(text).input_ids, folder.name


def test_tokenizer_ids_match_config(vl_dir, vl_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(vl_dir)
    cfg = vl_model.config
    assert cfg.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert cfg.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")
    assert cfg.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
    assert cfg.vision_end_token_id == tok.convert_tokens_to_ids("<|vision_end|>")
    assert cfg.text_config.vocab_size == len(tok)
    gen = vl_model.generation_config
    assert gen.eos_token_id == [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    assert gen.pad_token_id == tok.pad_token_id


def test_model_sizes(vl_model):
    cfg = vl_model.config
    text, vision = cfg.text_config, cfg.vision_config
    assert (text.hidden_size, text.intermediate_size, text.num_hidden_layers) == (128, 256, 2)
    assert (text.num_attention_heads, text.num_key_value_heads) == (4, 2)
    assert text.rope_parameters["mrope_section"] == [4, 6, 6]
    assert sum(text.rope_parameters["mrope_section"]) * 2 == text.hidden_size // text.num_attention_heads
    assert (vision.depth, vision.hidden_size, vision.num_heads, vision.intermediate_size) == (2, 64, 2, 128)
    assert (vision.patch_size, vision.spatial_merge_size, vision.out_hidden_size) == (14, 2, 128)
    assert cfg.tie_word_embeddings
    assert vl_model.lm_head.weight.data_ptr() == vl_model.get_input_embeddings().weight.data_ptr()


# ----------------------------------------------------------------------------- chat template + processor


def test_chat_template_renders_chatml_with_image(processor):
    tok = processor.tokenizer
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many sides?"}]},
        {"role": "assistant", "content": "6"},
        {"role": "user", "content": [{"type": "text", "text": "And this?"}, {"image": "file.png"}]},
    ]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many sides?<|im_end|>\n"
        "<|im_start|>assistant\n6<|im_end|>\n"
        "<|im_start|>user\nAnd this?<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # no default system message; no generation prompt unless asked
    plain = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert plain == "<|im_start|>user\nhi<|im_end|>\n"
    assert processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == rendered


@pytest.mark.parametrize("width,height,grid", [(56, 56, (1, 4, 4)), (112, 84, (1, 6, 8))])
def test_processor_expands_image_tokens(processor, width, height, grid):
    text = processor.apply_chat_template(_vl_prompt("Count."), tokenize=False, add_generation_prompt=True)
    out = processor(text=[text], images=[_image(width, height)], return_tensors="pt")
    assert tuple(out["image_grid_thw"][0].tolist()) == grid
    t, h, w = grid
    n_image_tokens = (out["input_ids"][0] == processor.image_token_id).sum().item()
    assert n_image_tokens == t * h * w // 4  # merge 2 x 2
    assert out["pixel_values"].shape == (t * h * w, 3 * 2 * 14 * 14)


def test_processor_caps_large_images(processor):
    text = processor.apply_chat_template(_vl_prompt("Count."), tokenize=False, add_generation_prompt=True)
    out = processor(text=[text], images=[_image(640, 480)], return_tensors="pt")
    t, h, w = out["image_grid_thw"][0].tolist()
    assert h * w * 14 * 14 <= tiny.IMAGE_MAX_PIXELS


# ----------------------------------------------------------------------------- model


def _batch(processor):
    texts = [
        processor.apply_chat_template(_vl_prompt(q), tokenize=False, add_generation_prompt=True)
        for q in ("How many sides does the polygon in the picture have?", "Count the sides.")
    ]
    images = [_image(56, 56, seed=1), _image(112, 84, seed=2)]
    return processor(text=texts, images=images, return_tensors="pt", padding=True)


def test_forward_backward_and_generate(processor, vl_model):
    batch = _batch(processor)
    assert processor.tokenizer.padding_side == "left"
    model = vl_model
    model.train()
    model.zero_grad()
    out = model(**batch, labels=batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100))
    assert out.logits.shape == (*batch["input_ids"].shape, 512)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    vision_grad = model.model.visual.patch_embed.proj.weight.grad
    text_grad = model.model.language_model.layers[0].self_attn.q_proj.weight.grad
    assert vision_grad is not None and vision_grad.abs().sum() > 0
    assert text_grad is not None and text_grad.abs().sum() > 0
    model.zero_grad()
    model.eval()

    torch.manual_seed(0)
    with torch.no_grad():
        generated = model.generate(**batch, max_new_tokens=6, do_sample=True, min_new_tokens=6)
    prompt_len = batch["input_ids"].shape[1]
    assert generated.shape == (2, prompt_len + 6)
    assert torch.equal(generated[:, :prompt_len], batch["input_ids"])
    assert ((generated[:, prompt_len:] >= 0) & (generated[:, prompt_len:] < 512)).all()


def test_reload_with_explicit_class_gives_identical_logits(vl_dir, processor, vl_model):
    from transformers import Qwen2_5_VLForConditionalGeneration

    batch = _batch(processor)
    other = Qwen2_5_VLForConditionalGeneration.from_pretrained(vl_dir).eval()
    vl_model.eval()
    with torch.no_grad():
        a = vl_model(**batch).logits
        b = other(**batch).logits
    assert torch.equal(a, b)
    # the saved weights are exactly the seeded build: a fresh in-memory build gives the same logits
    fresh = tiny._seeded_init(0, lambda: Qwen2_5_VLForConditionalGeneration(other.config)).eval()
    with torch.no_grad():
        assert torch.equal(fresh(**batch).logits, a)


def test_text_model_loads_and_generates(text_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(text_dir)
    model = AutoModelForCausalLM.from_pretrained(text_dir).eval()
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.vocab_size) == (128, 2, 512)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert out.shape[1] == prompt["input_ids"].shape[1] + 5


def test_build_is_deterministic(tmp_path):
    a = load_file(tiny.build_tiny_qwen2(tmp_path / "a", seed=0) / "model.safetensors")
    b = load_file(tiny.build_tiny_qwen2(tmp_path / "b", seed=0) / "model.safetensors")
    c = load_file(tiny.build_tiny_qwen2(tmp_path / "c", seed=1) / "model.safetensors")
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "c" / "tokenizer.json").read_bytes()
    # the caller's RNG stream is untouched by a build
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    tiny.build_tiny_qwen2(tmp_path / "d", seed=3)
    assert torch.equal(torch.rand(3), expected)


def test_seed_in_the_uri_builds_other_weights_in_its_own_folder(cache_dir, text_dir):
    seeded = tiny.materialize("tiny://qwen2?seed=3", cache_dir=cache_dir)
    assert seeded != text_dir and seeded.parent == text_dir.parent
    assert tiny.materialize("tiny://qwen2?seed=0", cache_dir=cache_dir) == text_dir  # seed 0 is the default
    a, b = load_file(text_dir / "model.safetensors"), load_file(seeded / "model.safetensors")
    assert any(not torch.equal(a[k], b[k]) for k in a)
    ref = load_file(tiny.build_tiny_qwen2(cache_dir / "ref3", seed=3) / "model.safetensors")
    assert all(torch.equal(ref[k], b[k]) for k in ref)
    assert tiny.parse_tiny_uri("tiny://qwen25vl?seed=12") == ("qwen25vl", 12, {})


def test_sizes_in_the_uri_build_a_smaller_model_with_the_same_tokenizer(cache_dir, text_dir):
    from transformers import AutoConfig

    uri = "tiny://qwen2?seed=1&num_hidden_layers=1&hidden_size=64"
    assert tiny.parse_tiny_uri(uri) == ("qwen2", 1, {"num_hidden_layers": 1, "hidden_size": 64})
    small = tiny.materialize(uri, cache_dir=cache_dir)
    assert small.parent == text_dir.parent and small != tiny.materialize("tiny://qwen2?seed=1", cache_dir=cache_dir)
    config = AutoConfig.from_pretrained(small)
    assert (config.num_hidden_layers, config.hidden_size) == (1, 64)
    assert config.vocab_size == AutoConfig.from_pretrained(text_dir).vocab_size
    assert (small / "tokenizer.json").read_bytes() == (text_dir / "tokenizer.json").read_bytes()
    n_small = sum(t.numel() for t in load_file(small / "model.safetensors").values())
    n_full = sum(t.numel() for t in load_file(text_dir / "model.safetensors").values())
    assert n_small < n_full / 3, (n_small, n_full)
    assert tiny.materialize("tiny://qwen2?hidden_size=64&num_hidden_layers=1&seed=1", cache_dir=cache_dir) == small


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("tiny://qwen2?hidden_size=62", "hidden_size 62 is not a multiple of num_attention_heads 4"),
        ("tiny://qwen2?num_key_value_heads=3", "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
        ("tiny://qwen2?depth=1", r"bad option 'depth=1'.*size keys: hidden_size"),
        ("tiny://qwen2?num_hidden_layers=0", "bad option 'num_hidden_layers=0'"),
        ("tiny://qwen2?rms_norm_eps=1", "bad option 'rms_norm_eps=1'"),
    ],
)
def test_bad_tiny_sizes_are_user_errors(uri, message, tmp_path):
    with pytest.raises(UserError, match=message):
        tiny.materialize(uri, cache_dir=tmp_path)
    assert not (tmp_path / "tiny").exists()  # refused before anything is built


@pytest.mark.parametrize(
    "uri", ["tiny://qwen2?seed=-1", "tiny://qwen2?seed=x", "tiny://qwen2?rev=1", "tiny://qwen2?seed="]
)
def test_bad_tiny_seed_is_user_error(uri, tmp_path):
    with pytest.raises(UserError, match=r"tiny://qwen2\?seed=N"):
        tiny.materialize(uri, cache_dir=tmp_path)
