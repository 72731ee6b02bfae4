"""verl-npu on a real two-node Ray cluster, on this one machine.

Ray's own multi-node test cluster (`ray.cluster_utils.Cluster`) starts a head node and a second
node: a raylet each, 1 CPU each, both on 127.0.0.1, each with the launcher's marker resource
`verl_npu_node_rank_R` (docs/multinode.md). The trainer then runs the way node 0's launcher runs
it: in a driver process of its own, with RAY_ADDRESS set and `trainer.nnodes=2
trainer.n_gpus_per_node=1`, so its RayWorkerGroup joins the cluster and, since no node has room
for both 1-CPU bundles of its placement group, puts one worker on each node. Checked:

- the preflight (`python -m verl_npu.cluster preflight --address ...`) passes on the live cluster;
- the two workers ran on the two different Ray nodes (the node ids the worker group logs);
- the run trains like one worker: per-step metrics equal within float tolerance, and EVERY rank's
  own final view of the weights (`broadcast("parameter_snapshot")`) equals the one-worker weights;
- the cluster is torn down, also when the test fails, and no process it started is left.

Everything stays on the loopback interface: Ray replaces a 127.0.0.1 address by the machine's
outward IP unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (then the loopback address is kept), and
GLOO_SOCKET_IFNAME=lo keeps gloo on it. The cluster has a temporary folder of its own (RAY_TMPDIR),
so a `ray.init()` elsewhere on the machine never finds it, and it never finds theirs.

Parametrized over the rollout engine; `vllm` runs only where vllm imports. The model is the tiny
Qwen2 (head size 32, which vLLM's attention backends accept).

Also runnable as a script: `python tests/e2e/test_multinode_ray.py SPEC.json` is the driver process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

if __name__ == "__main__":  # the driver process, run as a script: the helpers' folder, as tests/conftest.py puts it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from run_helpers import run_overrides, step_metrics, text_data, write_varied_reward

REPO = Path(__file__).resolve().parents[2]
COMPARED = [
    "critic/score/mean",
    "response_length/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
    "actor/pg_clipfrac",
]
STEPS = 3
DRIVER_TIMEOUT_S = 300
MARKER = "VERL_NPU_TEST_RAY_CLUSTER"  # set in every process the cluster starts: how leftovers are found
NODE_RANK_RESOURCE = "verl_npu_node_rank_"  # verl_npu.cluster.NODE_RANK_RESOURCE_PREFIX


# ---------------------------------------------------------------------------- the cluster
def _processes_with(marker: str) -> list[int]:
    """Pids of the processes (other than this one) whose environment holds `marker` (NAME=VALUE)."""
    wanted = marker.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if wanted in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone, or not ours to read
            continue
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _describe(pids: list[int]) -> str:
    lines = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:160]
            lines.append(f"{pid}: {cmdline.decode(errors='replace')}")
        except OSError:
            lines.append(f"{pid}: (gone)")
    return "\n".join(lines)


@contextlib.contextmanager
def two_node_cluster():
    """A head node and a second node (1 CPU each, on 127.0.0.1), removed on the way out, also on an
    error. Yields its address, its node ids in node-rank order and the environment a driver needs."""
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="vnr-")  # short: Ray's unix sockets live below it (108-byte limit)
    os.mkdir(os.path.join(tmp, "ray"))  # Ray's default temp dir is $RAY_TMPDIR/ray
    marker = f"{MARKER}={uuid.uuid4().hex}"
    env = {
        MARKER: marker.split("=", 1)[1],
        "RAY_TMPDIR": tmp,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "GLOO_SOCKET_IFNAME": "lo",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    cluster = Cluster()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the node processes (and the workers they start) inherit it
    try:
        nodes = [
            cluster.add_node(
                num_cpus=1,
                node_ip_address="127.0.0.1",
                include_dashboard=False,
                resources={f"{NODE_RANK_RESOURCE}{rank}": 1},
                **({"dashboard_port": _free_port()} if rank == 0 else {}),
            )  # not Ray's shared 8265
            for rank in range(2)
        ]
        cluster.wait_for_nodes()
        yield SimpleNamespace(address=cluster.address, node_ids=[n.node_id for n in nodes], env=dict(env))
    finally:
        try:
            cluster.shutdown()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            deadline = time.time() + 30
            while _processes_with(marker) and time.time() < deadline:
                time.sleep(0.2)
            shutil.rmtree(tmp, ignore_errors=True)
    left = _processes_with(marker)
    assert not left, f"processes of the Ray cluster are still running:\n{_describe(left)}"


# ---------------------------------------------------------------------------- one training run
def overrides(out: Path, data: Path, model: Path, engine: str, nnodes: int) -> list[str]:
    reward = write_varied_reward(data / "dense_reward.py")
    return run_overrides(
        out,
        data,
        {
            "custom_reward_function.path": reward,
            "data.train_batch_size": 4,
            "data.max_prompt_length": 32,
            "data.max_response_length": 3,
            "actor_rollout_ref.model.path": model,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 4,  # one update per step: same rows in it either way
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
            "actor_rollout_ref.actor.use_kl_loss": "true",
            "actor_rollout_ref.actor.kl_loss_coef": 0.05,
            "actor_rollout_ref.rollout.name": engine,
            "actor_rollout_ref.rollout.n": 4,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
            "trainer.nnodes": nnodes,
            "trainer.n_gpus_per_node": 1,
            "trainer.total_training_steps": STEPS,
            "trainer.save_freq": STEPS,
            "trainer.test_freq": -1,
            "trainer.logger": "[console]",
        },
    )


def train_and_capture(over: list[str]) -> dict:
    """Run the trainer; right after `fit` (workers still up) take every rank's own view of the
    final weights, and of its rollout engine's weights where the worker has that call."""
    from verl_npu.config import load_recipe
    from verl_npu.trainer.entry import run_training
    from verl_npu.trainer.ppo import PPOTrainer
    from verl_npu.workers.actor import ActorRolloutRefWorker

    captured: dict = {}
    fit = PPOTrainer.fit

    def fit_then_capture(self, *args, **kwargs):
        final = fit(self, *args, **kwargs)
        captured["snapshots"] = self.workers.broadcast("parameter_snapshot")
        if hasattr(ActorRolloutRefWorker, "rollout_weights_digest"):
            captured["rollout_digests"] = self.workers.broadcast("rollout_weights_digest")
        return final

    PPOTrainer.fit = fit_then_capture
    try:
        captured["exit_code"] = run_training(load_recipe("tiny_geo3k", over))
    finally:
        PPOTrainer.fit = fit
    return captured


def drive(spec_file: str) -> int:
    """The driver process: train with the overrides in SPEC.json, torch.save what was captured."""
    import torch

    spec = json.loads(Path(spec_file).read_text())
    torch.save(train_and_capture(spec["overrides"]), spec["result"])
    return 0


def run_driver(spec: dict, env: dict, log: Path) -> subprocess.CompletedProcess:
    spec_file = Path(spec["result"]).with_suffix(".json")
    spec_file.write_text(json.dumps(spec))
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, __file__, str(spec_file)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=DRIVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver we started (its Ray workers go with the cluster)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode)


# ---------------------------------------------------------------------------- the test
@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="loopback multi-node Ray cluster: Linux only")
@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_two_ray_nodes_train_like_one_worker(tmp_path, tiny_lm_path, engine):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    if engine == "vllm":
        pytest.importorskip("vllm")
    config = AutoConfig.from_pretrained(tiny_lm_path)  # tiny://qwen2: verl_npu.models.tiny.build_tiny_qwen2
    head_size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    assert head_size >= 32  # vLLM's smallest head size
    data = text_data(tmp_path / "data")
    one, two = tmp_path / "one", tmp_path / "two"

    reference = train_and_capture(overrides(one, data, tiny_lm_path, engine, nnodes=1))
    assert reference["exit_code"] == 0

    driver_log = tmp_path / "driver.log"
    with two_node_cluster() as cluster:
        env = dict(os.environ, **cluster.env, RAY_ADDRESS=cluster.address)
        over2 = overrides(two, data, tiny_lm_path, engine, nnodes=2)
        preflight = subprocess.run(
            [
                sys.executable,
                "-m",
                "verl_npu.cluster",
                "preflight",
                "--address",
                cluster.address,
                "--launched-nodes",
                "2",
                "tiny_geo3k",
                *over2,
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert preflight.returncode == 0, preflight.stdout + preflight.stderr
        assert "preflight passed: 2 node(s) x 1 CPU" in preflight.stdout + preflight.stderr
        done = run_driver({"overrides": over2, "result": str(tmp_path / "two.pt")}, env, driver_log)
        assert done.returncode == 0, driver_log.read_text()[-6000:]
        node_ids = cluster.node_ids
    result = torch.load(tmp_path / "two.pt", weights_only=False)
    assert result["exit_code"] == 0

    # placement: rank r ran on a node of this cluster, and the two ranks on different nodes
    run_log = (two / "logs" / "run.log").read_text()
    assert "device: cpu; workers: 2" in run_log and "'data_parallel': 2" in run_log
    placed = dict(re.findall(r"worker rank (\d+): pid \d+ on 127\.0\.0\.1 \(Ray node ([0-9a-f]+)\)", run_log))
    assert sorted(placed) == ["0", "1"], run_log[-3000:]
    assert placed["0"] != placed["1"]
    assert set(placed.values()) == set(node_ids)
    ckpt = two / "checkpoints" / f"global_step_{STEPS}" / "actor"
    assert sorted(p.name for p in ckpt.glob("model_world_size_*")) == [
        "model_world_size_2_rank_0.pt",
        "model_world_size_2_rank_1.pt",
    ]

    # training: the same per-step metrics as one worker
    m1, m2 = step_metrics(one), step_metrics(two)
    assert sorted(m1) == sorted(m2) == list(range(1, STEPS + 1))
    for step in m1:
        for key in COMPARED:
            assert m2[step][key] == pytest.approx(m1[step][key], rel=1e-4, abs=1e-5), (step, key)
    assert m1[STEPS]["actor/grad_norm"] > 0

    # weights: every rank's own view, each against the one worker's (tolerance as in test_distributed_cpu.py)
    (w1,) = reference["snapshots"]
    views = result["snapshots"]
    assert len(views) == 2
    for rank, view in enumerate(views):
        assert set(view) == set(w1), (rank, sorted(set(view) ^ set(w1)))
        for name in w1:
            torch.testing.assert_close(view[name], w1[name], atol=1e-4, rtol=1e-4, msg=f"rank {rank}: {name}")
        mean_diff = sum((view[n] - w1[n]).abs().sum().item() for n in w1) / sum(w1[n].numel() for n in w1)
        assert mean_diff < 1e-6, (rank, mean_diff)
    assert all(torch.equal(views[1][n], views[0][n]) for n in w1)  # the ranks agree bit for bit
    initial = load_file(str(Path(tiny_lm_path) / "model.safetensors"))
    assert any(not torch.equal(w1[n], initial[n]) for n in initial)  # and they did train
    digests = result.get("rollout_digests")
    if digests is not None:  # engines with their own copy of the weights: every rank's engine got the same
        assert all(d == digests[0] for d in digests), digests


if __name__ == "__main__":
    sys.exit(drive(sys.argv[1]))
