"""launch/run_recipe.sh as a user runs it, on several nodes, without starting a real Ray cluster.

The launcher, the recipe validation and `verl_npu.cluster` are real. Ray is replaced by a fake
`ray` command on PATH (records its arguments; `ray status` answers as many times as the file
`status_left` says) and a fake `ray` Python module on PYTHONPATH whose `ray.nodes()` returns
`nodes.json`, both under one state directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_helpers import TWO_NODE_RECIPE

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "launch" / "run_recipe.sh"

FAKE_RAY_CLI = """\
#!/usr/bin/env bash
d="${FAKE_RAY_DIR:?}"
echo "$*" >>"$d/calls.log"
case "$1" in
  status)
    left=$(cat "$d/status_left" 2>/dev/null || echo 0)
    if (( left > 0 )); then echo $((left - 1)) >"$d/status_left"; exit 0; fi
    echo "ConnectionError: could not find any running Ray instance" >&2
    exit 1 ;;
  start)
    echo "ASCEND_HOME_PATH=${ASCEND_HOME_PATH:-} ATB_HOME_PATH=${ATB_HOME_PATH:-}" >>"$d/start_env.log"
    if [[ -f "$d/status_after_start" ]]; then cp "$d/status_after_start" "$d/status_left"; fi
    exit 0 ;;
esac
exit 0
"""

FAKE_RAY_MODULE = """\
import json, os

_connected = []


def _log(text):
    with open(os.path.join(os.environ["FAKE_RAY_DIR"], "calls.log"), "a") as fh:
        fh.write(text + "\\n")


def init(address=None, **kwargs):
    _log(f"py init {address}")
    _connected.append(address)


def nodes():
    path = os.path.join(os.environ["FAKE_RAY_DIR"], "nodes.json")
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return json.load(fh)


def is_initialized():
    return bool(_connected)


def shutdown():
    _connected.clear()
"""

CLUSTER_VARS = (
    "NNODES",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_WAIT_TIMEOUT",
    "NODE_POLL_INTERVAL",
    "RAY_ADDRESS",
    "VERL_NPU_RAY",
    "ASCEND_HOME_PATH",
    "ATB_HOME_PATH",
    "NODE_IP_ADDRESS",
)


def cpu_node(address: str, rank: int, cpus: int = 2) -> dict:
    return {
        "NodeID": address,
        "Alive": True,
        "NodeManagerAddress": address,
        "Resources": {"CPU": float(cpus), f"verl_npu_node_rank_{rank}": 1.0},
    }


class Launch:
    """Runs the launcher in `tmp` with the fake Ray; `state` is the fake's directory."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.state = tmp / "ray_state"
        self.state.mkdir()
        fake_bin = tmp / "bin"
        fake_bin.mkdir()
        (fake_bin / "ray").write_text(FAKE_RAY_CLI)
        (fake_bin / "ray").chmod(0o755)
        (tmp / "fakepy" / "ray").mkdir(parents=True)
        (tmp / "fakepy" / "ray" / "__init__.py").write_text(FAKE_RAY_MODULE)
        (tmp / "runs").mkdir()
        self.recipe = tmp / "two_nodes.yaml"
        self.recipe.write_text(TWO_NODE_RECIPE)
        env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARS}
        env.update(
            {
                "PATH": f"{fake_bin}{os.pathsep}{env.get('PATH', '')}",
                "PYTHONPATH": str(tmp / "fakepy"),
                "FAKE_RAY_DIR": str(self.state),
                "VERL_NPU_PYTHON": sys.executable,
                "VERL_NPU_ASCEND_ROOT": str(tmp / "no_ascend"),
                "TMPDIR": str(tmp / "runs"),
                "OMP_NUM_THREADS": "1",
            }
        )
        self.env = env

    def __call__(self, *overrides: str, timeout: float = 20, **env: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            ["bash", str(LAUNCHER), str(self.recipe), *overrides],
            cwd=self.tmp,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        proc.output = proc.stdout + proc.stderr
        return proc

    @property
    def calls(self) -> list[str]:
        log = self.state / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def ray_cli_calls(self) -> list[str]:
        return [c for c in self.calls if not c.startswith("py ")]

    def set_nodes(self, nodes: list[dict]) -> None:
        (self.state / "nodes.json").write_text(json.dumps(nodes))

    def set_status_answers(self, count: int, after_start: int | None = None) -> None:
        (self.state / "status_left").write_text(str(count))
        if after_start is not None:
            (self.state / "status_after_start").write_text(str(after_start))


@pytest.fixture
def launch(tmp_path):
    return Launch(tmp_path)


def test_two_nodes_without_master_addr(launch):
    proc = launch(NNODES="2", NODE_RANK="1")
    assert proc.returncode != 0
    assert "NNODES=2 needs MASTER_ADDR: the address of node 0 (the Ray head)" in proc.stderr
    assert launch.calls == []


@pytest.mark.parametrize("rank", ["2", "-1", "one"])
def test_node_rank_out_of_range(launch, rank):
    proc = launch(NNODES="2", NODE_RANK=rank, MASTER_ADDR="10.9.8.7")
    assert proc.returncode != 0
    assert (
        f"NODE_RANK={rank} is out of range for NNODES=2: use 0 on the head node and 1..1 on the others" in proc.stderr
    )
    assert launch.calls == []


def test_bad_nnodes_and_port(launch):
    proc = launch(NNODES="two", MASTER_ADDR="h")
    assert proc.returncode != 0 and "NNODES=two must be a whole number >= 1" in proc.stderr
    proc = launch(NNODES="2", MASTER_ADDR="h", MASTER_PORT="70000")
    assert proc.returncode != 0 and "MASTER_PORT=70000 must be a whole number from 1 to 65535" in proc.stderr


def test_validation_failure_stops_before_ray(launch):
    proc = launch("trainer.nnodes=0", NNODES="2", NODE_RANK="0", MASTER_ADDR="10.9.8.7")
    assert proc.returncode == 1
    assert "trainer.nnodes" in proc.stderr
    assert "the recipe is not valid (see above); nothing was started on this node" in proc.stderr
    assert launch.calls == []  # no `ray start`, not even `ray status`


def test_head_waits_then_times_out_naming_missing_node(launch):
    launch.set_nodes([cpu_node("10.9.8.7", 0)])
    proc = launch(NNODES="2", NODE_RANK="0", MASTER_ADDR="10.9.8.7", MASTER_PORT="6390", NODE_WAIT_TIMEOUT="1")
    assert proc.returncode != 0, proc.output
    assert launch.ray_cli_calls() == [
        "status",
        'start --head --port 6390 --resources {"verl_npu_node_rank_0":1} --disable-usage-stats',
        "stop",  # it started the head, so it stops it
    ]
    assert "py init 10.9.8.7:6390" in launch.calls
    assert "only 1 of 2 node(s) joined the Ray cluster at 10.9.8.7:6390 (node rank(s) 1 have not joined)" in proc.stderr
    assert "1 CPU of the 2 CPUs expected are registered (1 CPU missing)" in proc.stderr
    assert "not every node joined (see above); nothing was trained" in proc.stderr
    assert list((launch.tmp / "runs").iterdir()) == []  # its run dir is removed


def test_head_preflight_passes_and_trains_with_ray_address(launch):
    launch.set_nodes([cpu_node("10.9.8.7", 0), cpu_node("10.9.8.8", 1)])
    proc = launch(NNODES="2", NODE_RANK="0", MASTER_ADDR="10.9.8.7", NODE_WAIT_TIMEOUT="5")
    out = proc.output
    assert "[cluster] preflight passed: 2 node(s) x 1 CPU" in out
    assert "training with RAY_ADDRESS=10.9.8.7:6379: " in out
    # training itself stops at the missing data/model files (nothing here can train): a user error
    assert proc.returncode == 1 and "a/train.parquet" in proc.stderr
    assert "training exited with status 1" in out
    assert launch.ray_cli_calls()[1].startswith("start --head --port 6379 ")
    assert launch.ray_cli_calls()[-1] == "stop"


def test_existing_cluster_is_used_and_not_stopped(launch):
    launch.set_status_answers(1)  # `ray status` answers: a cluster already runs on this node
    launch.set_nodes([cpu_node("10.9.8.7", 0)])
    proc = launch(NNODES="2", NODE_RANK="0", MASTER_ADDR="10.9.8.7", NODE_WAIT_TIMEOUT="1")
    assert proc.returncode != 0
    assert "a Ray cluster is already running on this node (ray status answers): using it" in proc.stdout
    assert launch.ray_cli_calls() == ["status"]  # no start, no stop
    assert "py init auto" in launch.calls


def test_ray_address_is_joined_and_preflight_names_short_node(launch):
    launch.set_nodes([cpu_node("10.0.0.1", 0, cpus=4), cpu_node("10.0.0.2", 1, cpus=1)])
    overrides = (
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
    )
    proc = launch(*overrides, NNODES="2", NODE_RANK="0", MASTER_ADDR="10.0.0.1", RAY_ADDRESS="10.0.0.1:7000")
    assert proc.returncode == 1
    assert "RAY_ADDRESS=10.0.0.1:7000 is set: using that Ray cluster" in proc.stdout
    assert (
        "the recipe asks for 2 CPUs per node (trainer.n_gpus_per_node=2), one CPU per worker; node 1 (10.0.0.2) has 1"
    ) in proc.stderr
    assert "nothing was trained" in proc.stderr
    assert launch.ray_cli_calls() == []
    assert "py init 10.0.0.1:7000" in launch.calls


def test_worker_joins_stays_up_until_head_goes_then_stops_its_ray(launch):
    ascend = launch.tmp / "Ascend"
    (ascend / "cann").mkdir(parents=True)
    (ascend / "cann" / "set_env.sh").write_text(f"export ASCEND_HOME_PATH={ascend}/cann/latest\n")
    (ascend / "nnal" / "atb").mkdir(parents=True)
    (ascend / "nnal" / "atb" / "set_env.sh").write_text("export ATB_HOME_PATH=/opt/atb\n")
    launch.set_status_answers(0, after_start=2)  # the head answers twice after joining, then is gone
    proc = launch(
        NNODES="2",
        NODE_RANK="1",
        MASTER_ADDR="10.9.8.7",
        MASTER_PORT="6390",
        NODE_POLL_INTERVAL="0.1",
        VERL_NPU_ASCEND_ROOT=str(ascend),
    )
    assert proc.returncode == 0, proc.output
    assert f"[run_recipe] sourced the CANN environment: {ascend}/cann/set_env.sh" in proc.stdout
    assert f"[run_recipe] sourced the ATB (nnal) environment: {ascend}/nnal/atb/set_env.sh" in proc.stdout
    assert (
        launch.state / "start_env.log"
    ).read_text().strip() == f"ASCEND_HOME_PATH={ascend}/cann/latest ATB_HOME_PATH=/opt/atb"
    status = "status --address 10.9.8.7:6390"
    assert launch.ray_cli_calls() == [
        "status",
        'start --address 10.9.8.7:6390 --resources {"verl_npu_node_rank_1":1}',
        status,
        status,
        status,
        status,  # ok, ok, miss, miss
        "stop",
    ]
    assert "the head at 10.9.8.7:6390 no longer answers; leaving" in proc.stdout


def test_worker_in_existing_cluster_starts_and_stops_nothing(launch):
    launch.set_status_answers(2)  # answers at detection and once more, then the cluster is gone
    proc = launch(NNODES="2", NODE_RANK="1", MASTER_ADDR="10.9.8.7", NODE_POLL_INTERVAL="0.1")
    assert proc.returncode == 0, proc.output
    assert launch.ray_cli_calls() == ["status", "status", "status", "status"]
    assert "staying up until the head at auto goes away" in proc.stdout


@pytest.mark.parametrize("nnodes", [None, "1"])
def test_single_node_behaviour_unchanged(launch, nnodes):
    env = {} if nnodes is None else {"NNODES": nnodes}
    proc = launch("trainer.nnodes=0", **env)
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[:4] == [
        f"[run_recipe] repo: {REPO}",
        f"[run_recipe] python: {sys.executable}",
        f"[run_recipe] relative paths (a demo's data/ and outputs/) start at the current folder: {launch.tmp}",
        f"[run_recipe] running: {sys.executable} -m verl_npu.cli run {launch.recipe} trainer.nnodes=0",
    ]
    assert launch.calls == []


def test_terminated_worker_stops_only_the_ray_it_started(launch):
    import signal
    import time

    launch.set_status_answers(0, after_start=1000)  # the head stays up
    proc = subprocess.Popen(
        ["bash", str(LAUNCHER), str(launch.recipe)],
        cwd=launch.tmp,
        env={**launch.env, "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.9.8.7", "NODE_POLL_INTERVAL": "0.2"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 15
        while not any(c.startswith("status --address") for c in launch.calls):
            assert proc.poll() is None and time.monotonic() < deadline, "the worker never reached its wait loop"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out
    assert "stopping the Ray worker this launcher started on this node" in out
    assert launch.ray_cli_calls()[1].startswith("start --address 10.9.8.7:6379")
    assert launch.ray_cli_calls()[-1] == "stop"
