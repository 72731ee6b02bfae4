"""actor_rollout_ref.model.enable_activation_offload (issue 39): accepted; the engine runs each training
forward inside the device's offload context (torch.autograd.graph.save_on_cpu on NPU/CUDA), through which
the inputs of gradient-checkpointed layers pass; on CPU it is a no-op that validate notes."""

from __future__ import annotations

import contextlib

import pytest
import torch
from test_engine import _batch, _engine, _forward, _loss

from verl_npu.config import load_recipe
from verl_npu.device import DeviceInfo, detect_device
from verl_npu.workers.engine import micro_batching


@contextlib.contextmanager
def _counting(packed: list):
    """saved_tensors_hooks that record every tensor autograd saves (and give it back unchanged)."""

    def pack(t):
        packed.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def test_cpu_accepts_it_as_a_noted_noop():
    rc = load_recipe("tiny_gsm8k", ["actor_rollout_ref.model.enable_activation_offload=true"])
    assert rc.backend.actor_rollout_ref.model.enable_activation_offload is True
    assert any("enable_activation_offload" in w and "changes nothing" in w for w in rc.warnings)
    assert isinstance(detect_device("cpu").offload_activations(), contextlib.nullcontext)
    assert isinstance(DeviceInfo("cuda").offload_activations(), torch.autograd.graph.save_on_cpu)


def test_the_engine_trains_inside_the_offload_context_with_the_same_result(monkeypatch):
    settings = dict(mini_rows=6, epochs=1, shuffle=False, grad_clip=1e9, micro=micro_batching(False, 2, None))
    plain = _engine()
    expected = plain.train(_batch(), _forward, _loss, **settings)
    packed: list = []
    monkeypatch.setattr(DeviceInfo, "offload_activations", lambda self: _counting(packed))
    offloaded = _engine()
    offloaded.offload_activations = True
    got = offloaded.train(_batch(), _forward, _loss, **settings)
    assert packed, "the forward ran inside the device's offload context"
    assert got["toy/loss"] == pytest.approx(expected["toy/loss"])
    for name, param in plain.module.named_parameters():
        torch.testing.assert_close(dict(offloaded.module.named_parameters())[name], param)


def _hidden_sized_saves(path, checkpointing: bool) -> tuple[int, int, int]:
    from verl_npu.models.loading import load_policy_model

    model = load_policy_model(path, dtype=torch.float32, gradient_checkpointing=checkpointing).train()
    ids = torch.randint(0, model.config.vocab_size, (2, 7))
    packed: list = []
    with _counting(packed):
        loss = model(input_ids=ids).logits.float().mean()
    loss.backward()
    return sum(s == (2, 7, model.config.hidden_size) for s in packed), len(packed), model.config.num_hidden_layers


def test_checkpointed_layer_inputs_pass_through_the_offload_hooks(tiny_lm_path):
    kept, total, layers = _hidden_sized_saves(tiny_lm_path, checkpointing=True)
    kept_plain, total_plain, _ = _hidden_sized_saves(tiny_lm_path, checkpointing=False)
    # with checkpointing, each decoder layer's input [batch, tokens, hidden] is still saved through autograd
    # (so save_on_cpu moves it to the host) while the layers' inner activations are not saved at all
    assert layers <= kept < kept_plain and total < total_plain
