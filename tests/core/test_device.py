"""The device layer: real answers on CPU; NPU through a simulated torch_npu; CUDA through a patched
torch.cuda. The simulated NPU implements just the torch.npu calls the layer makes, with state
(counters, RNG states) so the tests can see what the layer did."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from verl_npu.device import DeviceInfo, apply_env_defaults, detect_device, env_defaults, ray_runtime_env
from verl_npu.device_tables import CUDA_ENV_DEFAULTS, NPU_ENV_DEFAULTS
from verl_npu.errors import UserError

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30


class FakeNpu:
    """Stands in for the `torch.npu` module that torch_npu registers."""

    def __init__(self, name: str = "Ascend910B2", count: int = 8, available: bool = True):
        self.name = name
        self.count = count
        self.available = available
        self.current = 0
        self.allocated = 3 * GIB
        self.reserved = 5 * GIB
        self.peak = 7 * GIB
        self.calls: list[str] = []
        self.seeds: list[int] = []
        self.rng = [torch.tensor([i, 0], dtype=torch.uint8) for i in range(count)]

    def is_available(self):
        return self.available

    def device_count(self):
        return self.count

    def current_device(self):
        return self.current

    def set_device(self, index):
        self.current = index

    def get_device_name(self, index=0):
        return self.name

    def memory_allocated(self):
        return self.allocated

    def memory_reserved(self):
        return self.reserved

    def max_memory_allocated(self):
        return self.peak

    def mem_get_info(self):
        return 40 * GIB, 64 * GIB

    def reset_peak_memory_stats(self):
        self.calls.append("reset_peak")
        self.peak = self.allocated

    def empty_cache(self):
        self.calls.append("empty_cache")

    def synchronize(self):
        self.calls.append("synchronize")

    def manual_seed_all(self, seed):
        self.seeds.append(seed)
        self.rng = [torch.tensor([seed % 256, i], dtype=torch.uint8) for i in range(self.count)]

    def get_rng_state_all(self):
        return [state.clone() for state in self.rng]

    def set_rng_state_all(self, states):
        self.rng = [state.clone() for state in states]

    def set_rng_state(self, state, index):
        self.rng[index] = state.clone()


def install_fake_npu(monkeypatch, npu: FakeNpu, fusion_attention: bool = True) -> FakeNpu:
    """Make `import torch_npu` succeed and `torch.npu` be `npu` for one test."""
    module = types.ModuleType("torch_npu")
    module.npu = npu
    if fusion_attention:
        module.npu_fusion_attention = lambda *args, **kwargs: None
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    return npu


@pytest.fixture
def no_accelerators(monkeypatch):
    """A CPU-only host whatever this machine has: torch_npu does not import, CUDA unavailable."""
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # makes `import torch_npu` raise ImportError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)


# ----------------------------------------------------------------------------------------------
# CPU, for real


def test_cpu_is_detected_and_answers(no_accelerators):
    dev = detect_device()
    assert dev.kind == "cpu"
    assert dev.torch_module is None
    assert dev.dist_backend == "gloo"
    assert dev.visible_devices_env is None
    assert dev.ray_resource is None
    assert dev.ray_actor_options(num_devices=4, num_cpus=2) == {"num_cpus": 2}
    assert dev.ray_bundle(num_devices=4, num_cpus=2) == {"CPU": 2}
    assert dev.count() == os.cpu_count()
    assert dev.torch_device(3) == torch.device("cpu")
    assert dev.train_dtype() == torch.float32
    assert dev.attn_implementation() == "sdpa"
    assert dev.supports_bf16() is True
    assert dev.describe().startswith("cpu:")
    dev.set_device(1)  # no-ops on cpu
    dev.empty_cache()
    dev.synchronize()


@pytest.mark.parametrize("spelling", [None, "", "auto", "AUTO"])
def test_auto_spellings_detect(no_accelerators, spelling):
    assert detect_device(spelling).kind == "cpu"


def test_cpu_memory_is_real():
    dev = DeviceInfo("cpu")
    before = dev.memory()
    assert set(before) == {"allocated_gb", "reserved_gb", "peak_gb", "free_gb", "total_gb"}
    assert all(value > 0 for value in before.values()), before
    assert before["free_gb"] <= before["total_gb"]
    assert before["peak_gb"] >= before["allocated_gb"]

    block = torch.ones(64 * (1 << 20) // 4)  # 64 MiB, touched
    during = dev.memory()
    assert during["allocated_gb"] - before["allocated_gb"] > 0.04
    del block
    after_free = dev.memory()
    assert after_free["peak_gb"] >= during["allocated_gb"] - 1e-3

    dev.reset_peak_memory()
    after_reset = dev.memory()
    if os.access("/proc/self/clear_refs", os.W_OK):
        # The 64 MiB block is gone, so the new peak is near the current RSS, below the old peak.
        assert after_reset["peak_gb"] < during["allocated_gb"]
        assert after_reset["peak_gb"] - after_reset["allocated_gb"] < 0.03


def test_cpu_seeding_is_reproducible_and_rng_state_round_trips():
    dev = DeviceInfo("cpu")
    dev.manual_seed(1234)
    first = torch.rand(8)
    dev.manual_seed(1234)
    assert torch.equal(torch.rand(8), first)
    dev.manual_seed(4321)
    assert not torch.equal(torch.rand(8), first)

    assert dev.rng_state() == {}
    dev.set_rng_state(dev.rng_state())
    # A checkpoint written on an NPU resumes on CPU without device randomness.
    dev.set_rng_state({"npu": [torch.zeros(2, dtype=torch.uint8)]})


def test_oom_errors_are_recognised():
    dev = DeviceInfo("cpu")
    with pytest.raises(RuntimeError) as real_cpu_oom:
        torch.empty(1 << 55, dtype=torch.uint8)
    assert dev.is_oom_error(real_cpu_oom.value)
    assert dev.is_oom_error(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert dev.is_oom_error(RuntimeError("NPU out of memory. Tried to allocate 1.00 GiB"))
    assert dev.is_oom_error(MemoryError())
    assert not dev.is_oom_error(RuntimeError("shape '[2, 3]' is invalid for input of size 5"))
    assert not dev.is_oom_error(ValueError("out of memory"))


# ----------------------------------------------------------------------------------------------
# Explicit trainer.device


def test_explicit_cpu_wins_over_an_accelerator(monkeypatch, fake_cuda):
    assert detect_device().kind == "cuda"
    assert detect_device("cpu").kind == "cpu"


def test_requesting_absent_npu_is_a_user_error(no_accelerators):
    with pytest.raises(UserError) as info:
        detect_device("npu")
    message = str(info.value)
    assert "trainer.device=npu" in message
    assert "torch_npu does not import" in message
    assert "cpu: " in message and "cuda: torch.cuda.is_available() is False" in message


def test_requesting_absent_cuda_is_a_user_error(no_accelerators):
    with pytest.raises(UserError, match=r"trainer.device=cuda .*torch.cuda.is_available\(\) is False"):
        detect_device("cuda")


def test_unknown_device_kind_is_a_user_error():
    with pytest.raises(UserError, match=r"trainer.device='tpu'.*npu, cuda or cpu, or leave it unset"):
        detect_device("tpu")


def test_unknown_kind_cannot_build_device_info():
    with pytest.raises(ValueError):
        DeviceInfo("tpu")


# ----------------------------------------------------------------------------------------------
# Simulated NPU


def test_npu_is_detected_first_and_answers(monkeypatch, fake_cuda):
    npu = install_fake_npu(monkeypatch, FakeNpu("Ascend910B2", count=8))
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    dev = detect_device()  # CUDA is "available" too: NPU comes first
    assert dev.kind == "npu"
    assert dev.torch_module is npu
    assert dev.dist_backend == "hccl"
    assert dev.visible_devices_env == "ASCEND_RT_VISIBLE_DEVICES"
    assert dev.ray_resource == "NPU"
    assert dev.ray_actor_options() == {"num_cpus": 1, "resources": {"NPU": 1}}
    assert dev.ray_actor_options(num_devices=2, num_cpus=4) == {"num_cpus": 4, "resources": {"NPU": 2}}
    assert dev.ray_bundle(1, 2) == {"CPU": 2, "NPU": 1}
    assert dev.count() == 8
    assert dev.describe() == "npu: 8 x Ascend910B2, backend hccl"
    assert dev.supports_bf16() is True
    assert dev.train_dtype() == torch.bfloat16
    assert dev.attn_implementation() == "flash_attention_2"

    dev.set_device(5)
    assert npu.current == 5
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "6")  # what Ray sets for a one-NPU actor
    dev.set_device(5)
    assert npu.current == 0
    assert dev.local_device_index(5) == 0
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")  # NOSET / torchrun
    assert dev.local_device_index(5) == 5


def test_npu_memory_and_housekeeping(monkeypatch):
    npu = install_fake_npu(monkeypatch, FakeNpu())
    dev = detect_device("npu")
    assert dev.memory() == {"allocated_gb": 3.0, "reserved_gb": 5.0, "peak_gb": 7.0, "free_gb": 40.0, "total_gb": 64.0}
    dev.reset_peak_memory()
    assert dev.memory()["peak_gb"] == 3.0
    dev.empty_cache()
    dev.synchronize()
    assert npu.calls == ["reset_peak", "empty_cache", "synchronize"]


def test_npu_seed_and_rng_round_trip(monkeypatch):
    npu = install_fake_npu(monkeypatch, FakeNpu(count=2))
    dev = detect_device("npu")
    dev.manual_seed(99)
    assert npu.seeds == [99]
    cpu_draw = torch.rand(3)
    dev.manual_seed(99)
    assert torch.equal(torch.rand(3), cpu_draw)  # the torch CPU generator is seeded too

    saved = dev.rng_state()
    assert list(saved) == ["npu"] and len(saved["npu"]) == 2
    dev.manual_seed(5)
    assert not torch.equal(npu.rng[0], saved["npu"][0])
    dev.set_rng_state(saved)
    assert all(torch.equal(a, b) for a, b in zip(npu.rng, saved["npu"]))

    # Resuming with fewer visible devices restores the first ones.
    npu.count = 1
    dev.set_rng_state({"npu": [torch.tensor([7, 7], dtype=torch.uint8)] * 2})
    assert npu.rng[0].tolist() == [7, 7]


@pytest.mark.parametrize(
    "name, soc, bf16",
    [
        ("Ascend910A", None, False),
        ("Ascend910ProA", None, False),
        ("Ascend910PremiumA", None, False),
        ("Ascend910B2", None, True),
        ("Ascend910B4", None, True),
        ("Ascend910_9392", None, True),
        ("Ascend310P3", None, False),
        ("Ascend910", 102, False),  # name does not tell: SoC version Ascend910A
        ("Ascend910", 221, True),  # SoC version Ascend910B2
    ],
)
def test_npu_bf16_support(monkeypatch, name, soc, bf16):
    install_fake_npu(monkeypatch, FakeNpu(name))
    if soc is not None:
        monkeypatch.setattr(sys.modules["torch_npu"].npu, "get_soc_version", lambda: soc, raising=False)
    dev = detect_device("npu")
    assert dev.supports_bf16() is bf16
    assert dev.train_dtype() == (torch.bfloat16 if bf16 else torch.float32)


def test_npu_without_fusion_attention_uses_eager(monkeypatch):
    install_fake_npu(monkeypatch, FakeNpu(), fusion_attention=False)
    assert detect_device("npu").attn_implementation() == "eager"


def test_npu_installed_but_not_available(monkeypatch, no_accelerators):
    install_fake_npu(monkeypatch, FakeNpu(available=False))
    assert detect_device().kind == "cpu"
    with pytest.raises(UserError, match=r"trainer.device=npu .*is_available\(\) is False"):
        detect_device("npu")


# ----------------------------------------------------------------------------------------------
# Simulated CUDA


def test_cuda_answers(monkeypatch, fake_cuda):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    dev = detect_device()
    assert dev.kind == "cuda"
    assert detect_device("gpu").kind == "cuda"
    assert dev.torch_module is torch.cuda
    assert dev.dist_backend == "nccl"
    assert dev.visible_devices_env == "CUDA_VISIBLE_DEVICES"
    assert dev.ray_resource == "GPU"
    assert dev.ray_actor_options(num_devices=2) == {"num_cpus": 1, "num_gpus": 2}
    assert dev.ray_bundle(1, 3) == {"CPU": 3, "GPU": 1}
    assert dev.count() == 4
    assert dev.torch_device(1) == torch.device("cuda", 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert dev.torch_device(1) == torch.device("cuda", 0)
    assert dev.attn_implementation() == "sdpa"
    assert dev.train_dtype() == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert dev.train_dtype() == torch.float32


# ----------------------------------------------------------------------------------------------
# Environment defaults and the Ray runtime env


def test_npu_env_defaults_apply_only_when_unset():
    env = {"HCCL_CONNECT_TIMEOUT": "7200", "TASK_QUEUE_ENABLE": ""}
    applied = apply_env_defaults("npu", env=env)
    applied_vars = [var for var, _, _ in applied]
    assert env["HCCL_CONNECT_TIMEOUT"] == "7200"  # the user's value wins
    assert env["TASK_QUEUE_ENABLE"] == ""  # set-but-empty is still the user's choice
    assert "HCCL_CONNECT_TIMEOUT" not in applied_vars and "TASK_QUEUE_ENABLE" not in applied_vars
    assert env["VLLM_ASCEND_ENABLE_NZ"] == "0"
    assert env["HCCL_EXEC_TIMEOUT"] == "3600"
    assert env["HCCL_HOST_SOCKET_PORT_RANGE"] == env["HCCL_NPU_SOCKET_PORT_RANGE"] == "auto"
    assert env["USE_OPTIMIZED_MODEL"] == "0"
    assert env["TOKENIZERS_PARALLELISM"] == "false"
    assert "PYTORCH_NPU_ALLOC_CONF" in env
    assert len(applied) == len(env_defaults("npu")) - 2
    assert all(reason for _, _, reason in applied)
    assert apply_env_defaults("npu", env=env) == []  # idempotent


def test_env_defaults_per_kind():
    cuda_env: dict[str, str] = {}
    assert [v for v, _, _ in apply_env_defaults("cuda", env=cuda_env)] == ["NCCL_DEBUG", "TOKENIZERS_PARALLELISM"]
    assert cuda_env == {"NCCL_DEBUG": "WARN", "TOKENIZERS_PARALLELISM": "false"}
    cpu_env: dict[str, str] = {}
    apply_env_defaults("cpu", env=cpu_env)
    assert cpu_env == {"TOKENIZERS_PARALLELISM": "false"}
    assert not {d.var for d in CUDA_ENV_DEFAULTS} & {d.var for d in NPU_ENV_DEFAULTS}
    with pytest.raises(ValueError):
        env_defaults("tpu")


def test_apply_env_defaults_uses_os_environ(monkeypatch):
    for default in env_defaults("npu"):
        monkeypatch.delenv(default.var, raising=False)  # registers the var so monkeypatch restores it
    monkeypatch.setenv("HCCL_EXEC_TIMEOUT", "900")
    applied = dict((var, value) for var, value, _ in apply_env_defaults("npu"))
    assert os.environ["HCCL_EXEC_TIMEOUT"] == "900" and "HCCL_EXEC_TIMEOUT" not in applied
    assert os.environ["HCCL_CONNECT_TIMEOUT"] == applied["HCCL_CONNECT_TIMEOUT"] == "1800"


def test_ray_runtime_env_carries_driver_values_and_defaults():
    runtime = ray_runtime_env("npu", env={"HCCL_EXEC_TIMEOUT": "900", "ASCEND_RT_VISIBLE_DEVICES": "0,1"})
    env_vars = runtime["env_vars"]
    assert env_vars["HCCL_EXEC_TIMEOUT"] == "900"
    assert env_vars["VLLM_ASCEND_ENABLE_NZ"] == "0"
    assert set(env_vars) == {d.var for d in env_defaults("npu")}
    assert "ASCEND_RT_VISIBLE_DEVICES" not in env_vars  # Ray assigns devices per actor
    assert ray_runtime_env("cpu", env={}) == {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}


def test_docs_explain_every_npu_default():
    text = (REPO / "docs" / "devices.md").read_text(encoding="utf-8")
    for default in env_defaults("npu") + env_defaults("cuda"):
        assert f"`{default.var}`" in text, default.var
        assert f"`{default.value}`" in text, (default.var, default.value)
    assert "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES" in text


# ----------------------------------------------------------------------------------------------
# Import cost


def test_importing_the_layer_does_not_import_torch():
    code = "import sys, verl_npu.device; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_config_and_cli_do_not_import_the_layer():
    code = (
        "import importlib, importlib.util, sys\n"
        "present = [m for m in ('verl_npu.config', 'verl_npu.cli') if importlib.util.find_spec(m)]\n"
        "for m in present: importlib.import_module(m)\n"
        "print(len(present), 'verl_npu.device' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"config/cli not importable yet: {out.stderr.strip().splitlines()[-1:]}")
    present, imported = out.stdout.split()
    if present == "0":
        pytest.skip("verl_npu.config and verl_npu.cli do not exist yet")
    assert imported == "False"


# ----------------------------------------------------------------------------------------------
# Resolved once


#: the modules that detect the device: a run's driver (`run_training`, and `verl-npu run`, which prints it
#: and hands it on; `run_sft`, the SFT run's), and the commands that are not a run (cluster, doctor); every
#: worker is handed it
DETECTORS = {
    "verl_npu/trainer/entry.py",
    "verl_npu/cli.py",
    "verl_npu/cluster.py",
    "verl_npu/doctor.py",
    "verl_npu/sft/loop.py",
}


def test_the_device_is_detected_by_the_driver_and_handed_to_the_workers():
    import ast

    callers = set()
    for file in (REPO / "verl_npu").rglob("*.py"):
        rel = str(file.relative_to(REPO))
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name == "detect_device" and rel != "verl_npu/device.py":
                    callers.add(rel)
    assert callers == DETECTORS
    # what the driver hands over pickles (Ray carries it to every worker) and needs no detection there
    import pickle

    assert pickle.loads(pickle.dumps(DeviceInfo("cpu"))) == DeviceInfo("cpu")


def test_cuda_turns_cudnn_attention_off_and_cpu_leaves_it():
    """cuDNN SDPA builds a plan per new shape (seconds per RL step on an H200: bench/results/cuda_check.md);
    a cuda worker turns it off before building its models, other kinds leave torch's choice alone."""
    import torch

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        DeviceInfo("cpu").use_kernels()
        assert torch.backends.cuda.cudnn_sdp_enabled()
        DeviceInfo("cuda").use_kernels()
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
