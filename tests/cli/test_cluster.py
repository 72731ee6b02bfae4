"""verl_npu.cluster: recipe-versus-cluster comparison, waiting for nodes, `ray start` arguments.

Nodes are `ray.nodes()`-style dicts; no Ray cluster is started.
"""

from __future__ import annotations

import json

import pytest
from run_helpers import TWO_NODE_RECIPE

from verl_npu.cluster import (
    ClusterNeed,
    alive_nodes,
    check_cluster,
    main,
    missing_nodes_message,
    ray_start_args,
    wait_for_nodes,
)
from verl_npu.errors import UserError


def node(address: str, rank: int | None = None, alive: bool = True, **resources: float) -> dict:
    res = {"CPU": 16.0, "memory": 1e11, f"node:{address}": 1.0}
    res.update({k: float(v) for k, v in resources.items()})
    if rank is not None:
        res[f"verl_npu_node_rank_{rank}"] = 1.0
    return {"NodeID": f"id-{address}", "Alive": alive, "NodeManagerAddress": address, "Resources": res}


NPU_2x8 = ClusterNeed(nnodes=2, per_node=8, resource="NPU")

CASES = [
    ("matching NPU nodes", NPU_2x8, [node("10.0.0.1", 0, NPU=8), node("10.0.0.2", 1, NPU=8)], []),
    ("more devices than asked", NPU_2x8, [node("10.0.0.1", 0, NPU=16), node("10.0.0.2", 1, NPU=8)], []),
    (
        "too few nodes",
        NPU_2x8,
        [node("10.0.0.1", 0, NPU=8)],
        ["the recipe asks for 2 node(s) (trainer.nnodes=2); the cluster has 1"],
    ),
    (
        "a node with fewer NPUs",
        NPU_2x8,
        [node("10.0.0.1", 0, NPU=8), node("10.0.0.2", 1, NPU=4)],
        ["the recipe asks for 8 NPUs per node (trainer.n_gpus_per_node=8); node 1 (10.0.0.2) has 4"],
    ),
    (
        "a dead node does not count",
        NPU_2x8,
        [node("10.0.0.1", 0, NPU=8), node("10.0.0.2", 1, alive=False, NPU=8)],
        ["the recipe asks for 2 node(s) (trainer.nnodes=2); the cluster has 1"],
    ),
    (
        "GPU node in an NPU run",
        NPU_2x8,
        [node("10.0.0.1", 0, NPU=8), node("10.0.0.2", 1, GPU=8)],
        [
            "the recipe asks for 8 NPUs per node (trainer.n_gpus_per_node=8); node 1 (10.0.0.2) has 0 "
            "(it registered 8 GPU instead: the run uses NPUs; check trainer.device and how Ray was started "
            "on that node)"
        ],
    ),
    (
        "NPU node without the NPU resource",
        ClusterNeed(1, 8, "NPU"),
        [node("10.0.0.1", 0)],
        [
            "the recipe asks for 8 NPUs per node (trainer.n_gpus_per_node=8); node 0 (10.0.0.1) has 0 "
            '(Ray sees no "NPU" resource there: start it with ray start --resources \'{"NPU": N}\', '
            "as launch/run_recipe.sh does)"
        ],
    ),
    (
        "GPU nodes, one short, no rank known",
        ClusterNeed(2, 4, "GPU"),
        [node("10.0.0.5", GPU=4), node("10.0.0.6", GPU=2)],
        ["the recipe asks for 4 GPUs per node (trainer.n_gpus_per_node=4); node at 10.0.0.6 has 2"],
    ),
    (
        "CPU-only nodes",
        ClusterNeed(2, 4, "CPU"),
        [node("10.0.0.1", 0, CPU=8), node("10.0.0.2", 1, CPU=2)],
        [
            "the recipe asks for 4 CPUs per node (trainer.n_gpus_per_node=4), one CPU per worker; "
            "node 1 (10.0.0.2) has 2"
        ],
    ),
    (
        "NNODES differs from trainer.nnodes",
        ClusterNeed(1, 8, "NPU", launched_nodes=2),
        [node("10.0.0.1", 0, NPU=8), node("10.0.0.2", 1, NPU=8)],
        [
            "the recipe asks for 1 node(s) (trainer.nnodes=1) but the launcher was started for NNODES=2; "
            "set trainer.nnodes=2 or launch on 1 node(s)"
        ],
    ),
    (
        "several problems at once",
        ClusterNeed(3, 8, "NPU", launched_nodes=3),
        [node("10.0.0.1", 0, NPU=8), node("10.0.0.2", 1, NPU=1)],
        [
            "the recipe asks for 3 node(s) (trainer.nnodes=3); the cluster has 2",
            "the recipe asks for 8 NPUs per node (trainer.n_gpus_per_node=8); node 1 (10.0.0.2) has 1",
        ],
    ),
]


@pytest.mark.parametrize("need,nodes,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_check_cluster(need, nodes, expected):
    assert check_cluster(need, nodes) == expected


def test_alive_nodes_order_and_labels():
    views = alive_nodes([node("10.0.0.9"), node("10.0.0.2", 1), node("10.0.0.1", 0), node("10.0.0.3", 2, alive=False)])
    assert [v.label for v in views] == ["node 0 (10.0.0.1)", "node 1 (10.0.0.2)", "node at 10.0.0.9"]
    assert views[0].amount("NPU") == 0 and views[0].amount("CPU") == 16


def test_missing_nodes_message_names_ranks_and_devices():
    text = missing_nodes_message(NPU_2x8, [node("10.0.0.1", 0, NPU=8)], 2, 30.2, "10.0.0.1:6379")
    assert text.startswith(
        "after 30 s only 1 of 2 node(s) joined the Ray cluster at 10.0.0.1:6379 "
        "(node rank(s) 1 have not joined); 8 NPUs of the 16 NPUs expected are registered "
        "(8 NPUs missing)."
    )
    assert "NODE_WAIT_TIMEOUT" in text and "MASTER_ADDR" in text
    # nobody there yet: every rank is missing
    empty = missing_nodes_message(ClusterNeed(3, 1, "CPU"), [], 3, 5, "h:1")
    assert "only 0 of 3 node(s)" in empty and "node rank(s) 0, 1, 2 have not joined" in empty
    # nodes without launcher ranks: no rank list is invented
    anon = missing_nodes_message(NPU_2x8, [node("10.0.0.1", NPU=8)], 2, 5, "h:1")
    assert "have not joined" not in anon and "1 of 2" in anon


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_wait_for_nodes_returns_when_all_joined():
    answers = [[node("a", 0, NPU=8)], [node("a", 0, NPU=8)], [node("a", 0, NPU=8), node("b", 1, NPU=8)]]
    clock, said = FakeClock(), []
    nodes = wait_for_nodes(
        lambda: answers.pop(0),
        NPU_2x8,
        2,
        timeout_s=60,
        address="a:6379",
        interval_s=2,
        clock=clock,
        sleep=clock.sleep,
        say=said.append,
    )
    assert len(nodes) == 2 and answers == []
    assert clock.sleeps == [2, 2]
    assert said == ["1 of 2 node(s) in the cluster", "2 of 2 node(s) in the cluster"]


def test_wait_for_nodes_times_out_with_missing_message():
    clock = FakeClock()
    with pytest.raises(UserError) as err:
        wait_for_nodes(
            lambda: [node("a", 0, NPU=8)],
            NPU_2x8,
            2,
            timeout_s=5,
            address="a:6379",
            interval_s=2,
            clock=clock,
            sleep=clock.sleep,
        )
    assert clock.now == 5  # the last sleep is cut to the deadline
    assert "after 5 s only 1 of 2 node(s)" in str(err.value)
    assert "node rank(s) 1 have not joined" in str(err.value)


def test_ray_start_args():
    assert ray_start_args("npu", 8, 0) == ["--resources", '{"NPU":8,"verl_npu_node_rank_0":1}']
    assert ray_start_args("cuda", 4, 3) == ["--num-gpus", "4", "--resources", '{"verl_npu_node_rank_3":1}']
    assert ray_start_args("cpu", 0, 1) == ["--resources", '{"verl_npu_node_rank_1":1}']
    with pytest.raises(ValueError):
        ray_start_args("tpu", 1, 0)


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "two_nodes.yaml"
    path.write_text(TWO_NODE_RECIPE)
    return path


def test_need_from_recipe(recipe):
    from verl_npu.config import load_recipe

    rc = load_recipe(str(recipe), ["trainer.n_gpus_per_node=2"])
    need = ClusterNeed.from_recipe(rc, "npu", launched_nodes=2)
    assert need == ClusterNeed(2, 2, "NPU", 2) and need.total == 4


def test_cli_preflight_from_saved_nodes(recipe, tmp_path, capsys):
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps([node("10.0.0.1", 0, CPU=4), node("10.0.0.2", 1, CPU=1)]))
    assert main(["preflight", "--nodes-json", str(nodes), "--launched-nodes", "2", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert "[cluster] node 1 (10.0.0.2): 1 CPU" in out and "preflight passed: 2 node(s) x 1 CPU" in out

    rc = main(
        [
            "preflight",
            "--nodes-json",
            str(nodes),
            "--launched-nodes",
            "2",
            str(recipe),
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1
    assert "error: the cluster does not fit the recipe" in err
    assert (
        "the recipe asks for 2 CPUs per node (trainer.n_gpus_per_node=2), one CPU per worker; node 1 (10.0.0.2) has 1"
    ) in err


def test_cli_ray_start_args_on_cpu(recipe, capsys):
    assert main(["ray-start-args", "--node-rank", "1", str(recipe)]) == 0
    assert capsys.readouterr().out.splitlines() == ["--resources", '{"verl_npu_node_rank_1":1}']


def test_cli_bad_recipe_is_a_user_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TWO_NODE_RECIPE.replace("nnodes: 2", "nnodes: 0"))
    assert main(["ray-start-args", "--node-rank", "0", str(bad)]) == 1
    assert "trainer.nnodes" in capsys.readouterr().err


# ---- an unreachable RAY_ADDRESS fails fast, by name -------------------------------------------
def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_ray_address_is_a_user_error_and_a_listening_one_passes():
    import socket

    from verl_npu.workers.ray_group import check_ray_address_reachable

    port = _closed_port()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(UserError) as err:
            check_ray_address_reachable(address, timeout_s=5)
        assert address in str(err.value) and "ray start --head" in str(err.value)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        check_ray_address_reachable(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=5)
    check_ray_address_reachable("auto")  # no port: left to Ray


@pytest.mark.parametrize("address", ["garbage", "host:", ":6379", "10.0.0.1:port", "10.0.0.1:70000", "ray://"])
def test_malformed_ray_address_is_a_user_error_naming_it(address):
    from verl_npu.workers.ray_group import check_ray_address_reachable

    with pytest.raises(UserError) as err:
        check_ray_address_reachable(address, timeout_s=1)
    assert repr(address) in str(err.value) and "host:port" in str(err.value)


@pytest.mark.parametrize("kind", ["unreachable", "malformed"])
def test_run_with_an_unreachable_ray_address_stops_without_traceback(tmp_path, kind):
    """`verl-npu run` on 2 workers (Ray) with RAY_ADDRESS naming no cluster, or no address at all: a
    one-line error, not Ray's minutes of retries or its ValueError traceback."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = dict(
        os.environ,
        PYTHONPATH=str(repo),
        OMP_NUM_THREADS="1",
        RAY_ADDRESS=f"127.0.0.1:{_closed_port()}" if kind == "unreachable" else "garbage",
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl_npu.cli",
            "run",
            "tiny_geo3k",
            f"af_output_dir={tmp_path}",
            "backend_config.trainer.total_training_steps=1",
            "backend_config.trainer.n_gpus_per_node=2",
            "backend_config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        env=env,
        timeout=180,
    )
    assert proc.returncode != 0
    assert "cannot connect to the Ray cluster at RAY_ADDRESS" not in proc.stdout
    expected = "cannot connect to the Ray cluster at 127.0.0.1:" if kind == "unreachable" else "'garbage'"
    assert expected in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
