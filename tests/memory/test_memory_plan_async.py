"""The memory plan of separate_async's split layout (issue 37): the rollout processes' devices and the trainer's are
planned apart. The trainer's devices hold no rollout phase; each rollout process's device holds its own fp32 copy
of the policy (weights only) and the hf engine's cache for its share of a step's responses; the host counts the
rollout processes and the controller's copy of the pushed weights. Numbers by hand, on a small model."""

from __future__ import annotations

import math

from verl_npu.config import load_recipe
from verl_npu.memory import plan as mp
from verl_npu.memory.recipe import ROLLOUT_DEVICE, build_plan
from verl_npu.memory.settings import settings_from_recipe

SMALL = mp.ModelSize(hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=10, tied=True)
ASYNC = [
    "trainer.v1.trainer_mode=separate_async",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=2",
    "trainer.v1.separate_async.parameter_sync_step=1",
]


def _plan(overrides, accelerator):
    s = settings_from_recipe(load_recipe("tiny_gsm8k", overrides), accelerator=accelerator)
    return s, build_plan(s, SMALL, device_bytes=64 << 30, device_name="test")


def test_separate_async_plans_the_rollout_devices_apart_from_the_trainers():
    sync_s, sync = _plan([], False)
    s, split = _plan(ASYNC, False)
    assert sync_s.rollout_processes == 0 and s.rollout_processes == 2
    names = [p.name for p in split.phases]
    assert "rollout" in [p.name for p in sync.phases] and "rollout" not in names and ROLLOUT_DEVICE in names
    rollout = next(p for p in split.phases if p.name == ROLLOUT_DEVICE)
    rows = math.ceil(s.train_batch * s.n / 2)
    kv = mp.kv_bytes_per_token(SMALL, 1, 4) * rows * s.seq
    assert {p.name: p.bytes for p in rollout.parts} == {
        "rollout model copy": 4 * SMALL.params,
        "hf KV cache": kv,
        "sampling logits": 4 * rows * SMALL.vocab * 2,
    }
    # no gradients or optimizer state on a rollout device; the trainer's phases are the sync plan's, less the rollout
    assert not any("grads" in p.name or "AdamW" in p.name for p in rollout.parts)
    assert [(p.name, p.total) for p in split.phases if p.name != ROLLOUT_DEVICE] == [
        (p.name, p.total) for p in sync.phases if p.name != "rollout"
    ]
    host = {p.name: p.bytes for p in split.host}
    assert host["rollout processes"] == 2 * mp.CPU_WORKER_BASE_BYTES
    assert host["weights being pushed"] == 4 * SMALL.params
    assert host["the rollout processes' tensors"] == 2 * rollout.total
    # on an accelerator the rollout device also holds autocast's casts and the matmul workspaces
    _, acc = _plan(ASYNC, True)
    parts = {p.name for p in next(p for p in acc.phases if p.name == ROLLOUT_DEVICE).parts}
    assert {"autocast weight copies", "cuBLAS workspaces"} <= parts
