"""global_profiler.tool=torch_memory (issue 39): memory snapshots of the device's caching allocator on CUDA and
NPU (verl's tool and its global_tool_config.torch_memory options), refused by name on CPU. The snapshot is
taken through the device's memory module; CPU has none, so the worker side is checked against a stand-in
that records the calls torch.cuda.memory / torch.npu.memory would get (the accelerator run is not possible
on the CI machine)."""

from __future__ import annotations

import pytest

from verl_npu.config import load_recipe
from verl_npu.errors import ConfigErrors
from verl_npu.workers.profiler import MemorySnapshot, WorkerProfiler

ROLE = ["actor_rollout_ref.actor.profiler.enable=true", "actor_rollout_ref.actor.profiler.all_ranks=true"]
TOOL = ["global_profiler.tool=torch_memory", "global_profiler.steps=[1]"]


def test_cpu_refuses_it_by_name_and_says_what_it_records():
    with pytest.raises(
        ConfigErrors,
        match=r"does not support the torch_memory profiler \(memory snapshots.*on cpu: it runs on cuda / npu",
    ):
        load_recipe("tiny_gsm8k", [*TOOL, *ROLE, "trainer.device=cpu"])


def test_its_options_are_checked_by_name():
    with pytest.raises(ConfigErrors, match=r"torch_memory has \['depth'\]; verl-npu reads trace_alloc_max_entries"):
        load_recipe(
            "tiny_gsm8k",
            [*TOOL, *ROLE, "trainer.device=cpu", "global_profiler.global_tool_config={torch_memory: {depth: 3}}"],
        )


class _MemoryModule:
    """What the device's memory module is asked (torch.cuda.memory's private snapshot API)."""

    def __init__(self):
        self.calls = []

    def _record_memory_history(self, **kwargs):
        self.calls.append(("record", kwargs))

    def _dump_snapshot(self, path):
        self.calls.append(("dump", path))
        with open(path, "wb") as f:
            f.write(b"snapshot")


class _Device:
    def __init__(self):
        self.torch_module = type("M", (), {"memory": _MemoryModule()})()


def test_the_worker_records_between_start_and_stop_and_dumps_one_snapshot_per_rank(tmp_path):

    device = _Device()
    arr = load_recipe(
        "tiny_gsm8k", [*ROLE, "global_profiler.tool=torch", "global_profiler.steps=[1]"]
    ).typed.actor_rollout_ref
    profiler = WorkerProfiler(arr, 3, device)
    profiler.start(str(tmp_path / "step_1"), "torch_memory", {"trace_alloc_max_entries": 500, "stack_depth": 0})
    assert isinstance(profiler._running, MemorySnapshot)
    written = profiler.stop()
    calls = device.torch_module.memory.calls
    assert calls[0] == ("record", {"enabled": "all", "context": None, "stacks": "python", "max_entries": 500})
    assert calls[1] == ("dump", str(tmp_path / "step_1" / "rank_3" / "memory_snapshot.pickle"))
    assert calls[2] == ("record", {"enabled": None})
    assert written.endswith("rank_3/memory_snapshot.pickle")
    assert (tmp_path / "step_1" / "rank_3" / "memory_snapshot.pickle").read_bytes() == b"snapshot"
