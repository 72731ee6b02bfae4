"""The host figure of the memory plan (issue 26): a worker process's base, the tensors a CPU worker holds
and what the C allocator keeps beside them (bench/results/memory_plan.md, "Host figure")."""

from __future__ import annotations

from verl_npu.config import load_recipe
from verl_npu.memory import plan as mp
from verl_npu.memory.recipe import build_plan
from verl_npu.memory.settings import settings_from_recipe

OUT = [
    "af_output_dir=/tmp/out",
    "data.train_files=/tmp/t.parquet",
    "data.val_files=/tmp/t.parquet",
    "actor_rollout_ref.model.path=/tmp/none",
]
MODEL = mp.ModelSize(hidden=512, layers=8, heads=8, kv_heads=2, head_dim=64, intermediate=1536, vocab=512)


def _host(plan) -> dict[str, int]:
    return {p.name: p.bytes for p in plan.host}


def _cpu_plan(*overrides):
    s = settings_from_recipe(load_recipe("tiny_gsm8k", [*OUT, "trainer.device=cpu", *overrides]), False)
    return s, build_plan(s, MODEL, device_bytes=1 << 36, device_name="cpu")


def test_retained_blocks_are_a_fixed_fraction_of_the_peak_tensors():
    assert mp.cpu_allocator_retained_bytes(0) == 0
    assert mp.cpu_allocator_retained_bytes(1000) == int(mp.CPU_ALLOCATOR_RETAINED * 1000)
    assert 0 < mp.CPU_ALLOCATOR_RETAINED < 1


def test_one_cpu_worker_host_is_base_tensors_and_retained_blocks():
    s, plan = _cpu_plan()
    host = _host(plan)
    peak = max(p.total for p in plan.phases)
    assert host["worker processes"] == mp.CPU_WORKER_BASE_BYTES
    assert host["the workers' tensors (the CPU is the device)"] == peak
    assert host["C allocator's retained blocks"] == int(mp.CPU_ALLOCATOR_RETAINED * peak)
    assert "driver process" not in host and "Ray's processes" not in host  # one worker runs in the driver
    batch = s.train_batch * s.n * s.seq * 8 * 6
    assert (
        sum(host.values())
        == mp.CPU_WORKER_BASE_BYTES
        + peak
        + int(mp.CPU_ALLOCATOR_RETAINED * peak)
        + host.get("checkpoint export (rank 0)", 0)
        + batch
    )


def test_two_cpu_workers_count_each_worker_and_the_driver():
    _, plan = _cpu_plan("trainer.n_gpus_per_node=2")
    host = _host(plan)
    peak = max(p.total for p in plan.phases)
    assert host["worker processes"] == 2 * mp.CPU_WORKER_BASE_BYTES
    assert host["driver process"] == mp.CPU_WORKER_BASE_BYTES and host["Ray's processes"] == mp.RAY_BYTES
    assert host["C allocator's retained blocks"] == 2 * int(mp.CPU_ALLOCATOR_RETAINED * peak)


def test_accelerator_workers_hold_no_tensors_on_the_host_and_keep_their_base():
    s = settings_from_recipe(load_recipe("tiny_gsm8k", [*OUT, "trainer.device=cpu"]), True)
    host = _host(build_plan(s, MODEL, device_bytes=64 << 30, device_name="910B"))
    assert host["worker processes"] == mp.WORKER_BASE_BYTES
    assert "C allocator's retained blocks" not in host
    assert "the workers' tensors (the CPU is the device)" not in host


def test_checkpoint_save_on_cpu_gathers_the_full_model_on_rank_0_when_sharded():
    def save_parts(plan):
        return {p.name: p.bytes for p in next(ph for ph in plan.phases if ph.name == "checkpoint save").parts}

    _, two = _cpu_plan("trainer.n_gpus_per_node=2")
    assert save_parts(two)["the full model gathered on rank 0"] == 4 * MODEL.params
    _, one = _cpu_plan()  # one worker saves its own tensors: nothing is gathered
    assert save_parts(one)["one gathered tensor"] == MODEL.vocab * MODEL.hidden * 4
    s = settings_from_recipe(load_recipe("tiny_gsm8k", [*OUT, "trainer.device=cpu", "trainer.n_gpus_per_node=2"]), True)
    accel = save_parts(build_plan(s, MODEL, device_bytes=64 << 30, device_name="910B"))
    assert "the full model gathered on rank 0" not in accel  # an accelerator gathers it into host memory
