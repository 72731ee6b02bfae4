"""Model / tokenizer / processor loading: tiny:// paths, auto classes, overrides and user errors."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from verl_npu.errors import UserError
from verl_npu.models import loading, tiny


# the session's tiny models (tests/conftest.py): built once for the whole test run
@pytest.fixture(autouse=True)
def _tiny_cache(tiny_cache, monkeypatch):
    monkeypatch.setenv("VERL_NPU_CACHE", str(tiny_cache))


@pytest.fixture
def vl_dir(tiny_vl_path) -> Path:
    return Path(tiny_vl_path)


@pytest.fixture
def text_dir(tiny_lm_path) -> Path:
    return Path(tiny_lm_path)


def _copy(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name not in skip:
            shutil.copy(f, dst / f.name)
    return dst


# ----------------------------------------------------------------------------- paths


def test_resolve_model_path(vl_dir, monkeypatch, tmp_path):
    assert loading.resolve_model_path("tiny://qwen25vl") == str(vl_dir)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert loading.resolve_model_path("~/models/x") == str(tmp_path / "models" / "x")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="'Qwen/Qwen2.5-VL-3B-Instruct' is not a local folder"):
        loading.resolve_model_path("Qwen/Qwen2.5-VL-3B-Instruct")  # a hub id missing from the (empty) cache
    with pytest.raises(UserError, match="actor_rollout_ref.model.path is empty"):
        loading.resolve_model_path("")


def test_missing_path_is_user_error(tmp_path):
    missing = tmp_path / "no_such_model"
    for load in (
        lambda: loading.load_tokenizer_and_processor(str(missing)),
        lambda: loading.load_policy_model(str(missing), dtype=torch.float32),
    ):
        with pytest.raises(UserError) as err:
            load()
        msg = str(err.value)
        assert str(missing) in msg and "does not exist" in msg
        assert "hub id" in msg and "tiny://qwen25vl" in msg


def test_folder_without_config_is_user_error(tmp_path):
    (tmp_path / "weights_only").mkdir()
    (tmp_path / "weights_only" / "notes.txt").write_text("x")
    with pytest.raises(UserError, match=r"no config\.json.*notes\.txt"):
        loading.load_policy_model(str(tmp_path / "weights_only"), dtype=torch.float32)


# ----------------------------------------------------------------------------- tokenizer + processor


def test_tokenizer_and_processor_for_vl_model(vl_dir):
    tok, proc = loading.load_tokenizer_and_processor("tiny://qwen25vl")
    assert type(proc).__name__ == "Qwen2_5_VLProcessor"
    assert type(proc.image_processor).__name__ == "Qwen2VLImageProcessor"
    assert proc.tokenizer is tok
    assert tok.pad_token == "<|endoftext|>" and tok.eos_token == "<|im_end|>"
    assert tok.chat_template == tiny.CHAT_TEMPLATE


def test_text_model_has_no_processor(text_dir):
    tok, proc = loading.load_tokenizer_and_processor(str(text_dir))
    assert proc is None
    assert len(tok) == tiny.VOCAB_SIZE


def test_custom_chat_template_string_and_file(tmp_path, vl_dir):
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    tok, proc = loading.load_tokenizer_and_processor("tiny://qwen25vl", custom_chat_template=template)
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == "[user] hi\n"
    assert proc.apply_chat_template(msgs, tokenize=False) == "[user] hi\n"
    (tmp_path / "t.jinja").write_text(template)
    tok2, _ = loading.load_tokenizer_and_processor("tiny://qwen2", custom_chat_template=str(tmp_path / "t.jinja"))
    assert tok2.apply_chat_template(msgs, tokenize=False) == "[user] hi\n"


def test_tokenizer_without_chat_template_is_user_error(tmp_path, text_dir):
    folder = _copy(text_dir, tmp_path / "base_model", skip=("chat_template.jinja",))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError) as err:
        loading.load_tokenizer_and_processor(str(folder))
    msg = str(err.value)
    assert str(folder) in msg and "no chat template" in msg
    assert "actor_rollout_ref.model.custom_chat_template" in msg
    tok, _ = loading.load_tokenizer_and_processor(str(folder), custom_chat_template=tiny.CHAT_TEMPLATE)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == (
        "<|im_start|>user\nx<|im_end|>\n"
    )


def test_missing_pad_token_falls_back_to_eos(tmp_path, text_dir):
    folder = _copy(text_dir, tmp_path / "nopad")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["pad_token"] = None
    cfg["tokenizer_class"] = "TokenizersBackend"  # Qwen2Tokenizer would default pad to <|endoftext|>
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok, _ = loading.load_tokenizer_and_processor(str(folder))
    assert tok.pad_token == tok.eos_token == "<|im_end|>"


# ----------------------------------------------------------------------------- policy model


def test_load_vl_policy_model_matches_plain_transformers(vl_dir):
    from PIL import Image
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    model = loading.load_policy_model("tiny://qwen25vl", dtype=torch.float32)
    assert isinstance(model, Qwen2_5_VLForConditionalGeneration)
    assert loading.is_vision_language(model) and loading.is_vision_language(model.config)
    assert model.config._attn_implementation == "sdpa"
    plain = Qwen2_5_VLForConditionalGeneration.from_pretrained(vl_dir).eval()
    proc = AutoProcessor.from_pretrained(vl_dir)
    text = proc.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Sides?"}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    batch = proc(text=[text], images=[Image.new("RGB", (84, 56), (200, 30, 30))], return_tensors="pt")
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, plain(**batch).logits)


def test_load_text_policy_model_dtype_and_gradient_checkpointing(text_dir):
    model = loading.load_policy_model(str(text_dir), dtype=torch.bfloat16, gradient_checkpointing=True)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert not loading.is_vision_language(model)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())  # checkpointing on
    model.train()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert model.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0


def test_override_config(text_dir, vl_dir):
    model = loading.load_policy_model(str(text_dir), dtype=torch.float32, override_config={"attention_dropout": 0.25})
    assert model.config.attention_dropout == 0.25
    vl = loading.load_policy_model(
        "tiny://qwen25vl",
        dtype=torch.float32,
        override_config={"attention_dropout": 0.5, "vision_config": {"initializer_range": 0.5}},
    )
    assert vl.config.text_config.attention_dropout == 0.5
    assert vl.config.vision_config.initializer_range == 0.5
    with pytest.raises(UserError, match=r"override_config\.num_hidden_layers='two' is rejected"):
        loading.load_policy_model(str(text_dir), dtype=torch.float32, override_config={"num_hidden_layers": "two"})


def test_external_lib_is_imported_first(tmp_path, monkeypatch, text_dir):
    (tmp_path / "my_model_plugin.py").write_text("import builtins\nbuiltins._verl_npu_plugin_loaded = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        loading.load_policy_model(str(text_dir), dtype=torch.float32, external_lib="my_model_plugin")
        import builtins

        assert getattr(builtins, "_verl_npu_plugin_loaded", False)
    finally:
        import builtins

        if hasattr(builtins, "_verl_npu_plugin_loaded"):
            del builtins._verl_npu_plugin_loaded
        sys.modules.pop("my_model_plugin", None)
    with pytest.raises(UserError, match=r"external_lib='no_such_plugin_xyz' cannot be imported"):
        loading.load_policy_model(str(text_dir), dtype=torch.float32, external_lib="no_such_plugin_xyz")


def test_folder_without_weights_is_user_error(tmp_path, vl_dir):
    folder = _copy(vl_dir, tmp_path / "no_weights", skip=("model.safetensors",))
    with pytest.raises(UserError) as err:
        loading.load_policy_model(str(folder), dtype=torch.float32)
    msg = str(err.value)
    assert str(folder) in msg and "no weights" in msg and "model.safetensors" in msg
    assert "config.json" in msg  # lists what the folder holds


def test_index_with_missing_shard_is_user_error(tmp_path, text_dir):
    folder = _copy(text_dir, tmp_path / "sharded", skip=("model.safetensors",))
    shutil.copy(text_dir / "model.safetensors", folder / "model-00001-of-00002.safetensors")
    index = {
        "metadata": {},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match=r"1 are missing: model-00002-of-00002\.safetensors"):
        loading.load_policy_model(str(folder), dtype=torch.float32)


def test_bad_attention_implementation_is_user_error(text_dir):
    with pytest.raises(UserError, match="attention implementation 'flash_attention_2'"):
        loading.load_policy_model(str(text_dir), dtype=torch.float32, attn_implementation="flash_attention_2")


def test_is_vision_language_by_model_type():
    from transformers import Qwen2_5_VLConfig, Qwen2Config

    assert loading.is_vision_language(Qwen2_5_VLConfig())
    assert not loading.is_vision_language(Qwen2Config())
    assert os.environ.get("VERL_NPU_CACHE")  # the autouse fixture kept tests off ~/.cache
