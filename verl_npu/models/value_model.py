"""Value models (the critic's): one value per token, for text and vision-language models.

A text model's value model is transformers' token-classification model of its architecture with one
label: the backbone and a `score` Linear (hidden -> 1), as verl's critic has it.

A vision-language model has no token-classification class in transformers (Qwen2-VL and Qwen2.5-VL
are refused by `AutoModelForTokenClassification`), so its value model is `VisionLanguageValueModel`:
the class the actor loads for that config (`AutoModelForImageTextToText`, vision tower included)
under `pretrained_model`, and a value head `v_head.summary` (Linear hidden -> 1). These are the
parameter names of verl's critic for such models (trl's `AutoModelForCausalLMWithValueHead`), so a
checkpoint's per-rank files name `pretrained_model.<the model's own names>` and `v_head.summary.*`,
and its `huggingface/` folder holds the model's own names plus `v_head.summary.*`, as trl saves it
(transformers loads it as the vision-language model, ignoring the head; `load_vision_language_value_model`
takes the head back). The language-model head (`pretrained_model.lm_head`) is kept so that the names
are verl's, but never runs: the values are the head's output on the decoder's last hidden states.
The head has no dropout (trl's has 0.1 by default): as the text critic (classifier_dropout 0), a
training forward gives the values an inference forward gives, which the clipped value loss compares.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import torch

from verl_npu.models.loading import (
    MODEL_LOAD_KWARGS,
    apply_override_config,
    enable_activation_checkpointing,
    is_vision_language,
    load_config,
    load_policy_model,
    resolve_model_path,
)

log = logging.getLogger("verl_npu")

#: verl's (trl's) names: the wrapped model's parameters under PREFIX, the head under HEAD_PREFIX
PREFIX = "pretrained_model."
HEAD_PREFIX = "v_head."


class ValueHead(torch.nn.Module):
    """hidden -> one value (`summary`, trl's name for the Linear)."""

    def __init__(self, hidden_size: int, initializer_range: float):
        super().__init__()
        self.summary = torch.nn.Linear(hidden_size, 1)
        # as transformers initialises a token-classification `score` (the text critic's head)
        torch.nn.init.normal_(self.summary.weight, std=initializer_range)
        torch.nn.init.zeros_(self.summary.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.summary(hidden)


@dataclass
class ValueOutput:
    """What `VisionLanguageValueModel` returns: `logits` [B, K, 1], one value per kept position (the
    name a model output has, so the forward code reads a value model as it reads a language model)."""

    logits: torch.Tensor


def _keep(hidden: torch.Tensor, logits_to_keep) -> torch.Tensor:
    """hidden [B, L, H] at the positions transformers' `logits_to_keep` names: an int k keeps the last k
    (0: all), a 1-D tensor the positions it lists."""
    if isinstance(logits_to_keep, int):
        return hidden if logits_to_keep == 0 else hidden[:, -logits_to_keep:]
    return hidden[:, logits_to_keep]


class VisionLanguageValueModel(torch.nn.Module):
    """A vision-language model (`pretrained_model`) with a value head (`v_head`).

    Called as the model itself is (token ids, attention mask, position ids incl. 3-D rope, pixel
    values and grid sizes, `logits_to_keep`), it runs the model's own base (vision tower, merger and
    decoder: `pretrained_model.base_model`) and returns the head's values at the kept positions as
    `logits` [B, K, 1]. It answers what the forward code asks of a model (`config`,
    `set_attn_implementation`, `get_rope_index`) with the wrapped model's answers."""

    def __init__(self, pretrained_model: torch.nn.Module):
        super().__init__()
        self.pretrained_model = pretrained_model
        text = pretrained_model.config.get_text_config()
        self.v_head = ValueHead(text.hidden_size, float(getattr(text, "initializer_range", 0.02)))
        # FSDP2 wraps the model's decoder layers and vision blocks as it does the actor's
        self._no_split_modules = list(getattr(pretrained_model, "_no_split_modules", None) or [])

    @property
    def config(self):
        return self.pretrained_model.config

    @property
    def all_tied_weights_keys(self) -> dict:
        """The wrapped model's tied weights under this module's names (a checkpoint saves them once)."""
        tied = getattr(self.pretrained_model, "all_tied_weights_keys", None) or {}
        return {PREFIX + k: PREFIX + v for k, v in dict(tied).items()}

    def set_attn_implementation(self, implementation) -> None:
        self.pretrained_model.set_attn_implementation(implementation)

    def get_rope_index(self, *args, **kwargs):
        return self.pretrained_model.base_model.get_rope_index(*args, **kwargs)

    def can_generate(self) -> bool:
        return False

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        use_cache=False,
        logits_to_keep=0,
        **multi_modal_inputs,
    ) -> ValueOutput:
        out = self.pretrained_model.base_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            **multi_modal_inputs,
        )
        return ValueOutput(logits=self.v_head(_keep(out[0], logits_to_keep)))

    def save_pretrained(self, out_dir, *, state_dict: dict, **kwargs) -> None:
        """The full weights in trl's Hugging Face layout: the model's own names (transformers loads the
        folder as the vision-language model) plus `v_head.summary.*`."""
        own = {k[len(PREFIX) :] if k.startswith(PREFIX) else k: v for k, v in state_dict.items()}
        self.pretrained_model.save_pretrained(out_dir, state_dict=own, **kwargs)


def _weight_files(folder: str) -> list[str]:
    """The safetensors files of a model folder (those of its index, or model.safetensors)."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(folder, n) for n in names]
    single = os.path.join(folder, "model.safetensors")
    return [single] if os.path.isfile(single) else []


def saved_value_head(folder: str) -> dict[str, torch.Tensor]:
    """`summary.weight` / `summary.bias` of a folder whose weights hold `v_head.*` (a trained critic's
    huggingface/ folder, verl-npu's or trl's); empty for a plain model."""
    from safetensors import safe_open

    found = {}
    for path in _weight_files(folder):
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                if key.startswith(HEAD_PREFIX):
                    found[key[len(HEAD_PREFIX) :]] = f.get_tensor(key)
    return found


def load_vision_language_value_model(
    path, *, dtype: torch.dtype, gradient_checkpointing: bool, **load_options
) -> VisionLanguageValueModel:
    """`VisionLanguageValueModel` of the vision-language model at `path`, loaded with the actor's loader
    (`load_policy_model`, which takes `load_options`: attn_implementation, override_config, trust_remote_code).
    The value head is new (initialised from the current torch seed) unless the folder's weights hold one
    (`v_head.summary.*`: a critic saved with its huggingface/ weights), which is then loaded."""
    loader_log = logging.getLogger("transformers.modeling_utils")
    level = loader_log.level
    loader_log.setLevel(logging.ERROR)  # a saved critic's v_head.* are "unused weights" to transformers: ours below
    try:
        model = load_policy_model(path, dtype=dtype, **load_options)
    finally:
        loader_log.setLevel(level)
    value_model = VisionLanguageValueModel(model)
    value_model.v_head.to(dtype)
    local = resolve_model_path(path)
    head = saved_value_head(local) if os.path.isdir(local) else {}
    if head:
        value_model.v_head.load_state_dict({k: v.to(dtype) for k, v in head.items()})
        log.info("critic: value head v_head.summary loaded from %s", path)
    if gradient_checkpointing:
        enable_activation_checkpointing(model)
    return value_model


def load_value_model(
    path,
    *,
    dtype: torch.dtype,
    attn_implementation: str,
    override_config: dict | None,
    trust_remote_code: bool,
    gradient_checkpointing: bool,
) -> torch.nn.Module:
    """The critic's value model of `path`: `VisionLanguageValueModel` for a vision-language model, else
    the token-classification model with one label and no classifier dropout (its `score` Linear is new,
    initialised by transformers, when `path` holds a causal LM)."""
    config = load_config(path, trust_remote_code=trust_remote_code)
    apply_override_config(config, override_config)
    if is_vision_language(config):
        return load_vision_language_value_model(
            path,
            dtype=dtype,
            attn_implementation=attn_implementation,
            override_config=override_config,
            trust_remote_code=trust_remote_code,
            gradient_checkpointing=gradient_checkpointing,
        )
    from transformers import AutoModelForTokenClassification

    config.num_labels = 1
    config.classifier_dropout = 0.0
    model = AutoModelForTokenClassification.from_pretrained(
        resolve_model_path(path),
        config=config,
        dtype=dtype,
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
        **MODEL_LOAD_KWARGS,
    )
    if gradient_checkpointing:
        enable_activation_checkpointing(model)
    return model
