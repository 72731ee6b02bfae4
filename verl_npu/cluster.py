"""Multi-node preflight: what a recipe asks for versus what a Ray cluster has.

`launch/run_recipe.sh` runs this module on every node (see docs/multinode.md):

    python -m verl_npu.cluster ray-start-args --node-rank R NAME|PATH [key=value ...]
        prints the device arguments for `ray start` on this node, one per line
    python -m verl_npu.cluster wait-for-nodes --address HOST:PORT --nnodes N --timeout S NAME|PATH [k=v ...]
        waits until N nodes are alive in the cluster (error after S seconds naming what is missing)
    python -m verl_npu.cluster preflight --address HOST:PORT [--launched-nodes N] NAME|PATH [k=v ...]
        compares trainer.nnodes / trainer.n_gpus_per_node with the nodes and their devices

The comparison (`check_cluster`) and the waiting (`wait_for_nodes`) work on `ray.nodes()`-style
dicts (`{"Alive": bool, "NodeManagerAddress": ip, "Resources": {"CPU": 16.0, "NPU": 8.0, ...}}`),
so they are tested without a cluster. Each node started by the launcher also carries a custom
resource `verl_npu_node_rank_<R>` (amount 1, never requested by any task), which is how the head
knows which node ranks have joined.

Only the stdlib and the device layer (stdlib only until it detects a device; it names the Ray
resources and builds the `ray start` arguments) are imported at module level; the recipe loader is
imported when a command needs it, and `ray` only when a cluster is contacted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from verl_npu.device import NODE_RANK_RESOURCE_PREFIX, RAY_RESOURCES, ray_start_args
from verl_npu.errors import UserError, run_command

# the Ray resources of devices (the device layer's table; CPU workers ask for one CPU each)
_DEVICE_RESOURCES = tuple(r for r in RAY_RESOURCES.values() if r is not None)


# ----------------------------------------------------------------------------------------------
# What the recipe asks for


@dataclass(frozen=True)
class ClusterNeed:
    """What a run needs: `nnodes` nodes (trainer.nnodes), each with `per_node` units of `resource`
    (trainer.n_gpus_per_node; "NPU" | "GPU", or "CPU" where each worker takes one CPU).
    `launched_nodes` is NNODES from the launcher when known (None: not compared)."""

    nnodes: int
    per_node: int
    resource: str
    launched_nodes: int | None = None

    def __post_init__(self) -> None:
        if self.resource not in (*_DEVICE_RESOURCES, "CPU"):
            raise ValueError(f"resource must be NPU, GPU or CPU, not {self.resource!r}")

    @property
    def total(self) -> int:
        """Workers in the run: nnodes * per_node."""
        return self.nnodes * self.per_node

    def units(self, count: int | float) -> str:
        """`count` with the resource as a plural noun: "8 NPUs", "1 GPU", "2 CPUs"."""
        count = int(count)
        return f"{count} {self.resource}{'' if count == 1 else 's'}"

    @classmethod
    def from_recipe(cls, rc: Any, kind: str, launched_nodes: int | None = None) -> ClusterNeed:
        """From a `RecipeConfig` and the device kind the run uses ("npu" | "cuda" | "cpu")."""
        trainer = rc.typed.trainer
        return cls(int(trainer.nnodes), int(trainer.n_gpus_per_node), RAY_RESOURCES[kind] or "CPU", launched_nodes)


# ----------------------------------------------------------------------------------------------
# What the cluster has


@dataclass(frozen=True)
class NodeView:
    """One alive node: its launcher node rank (None when it was not started by the launcher), its
    address and its Ray resources."""

    rank: int | None
    address: str
    resources: Mapping[str, float]

    @property
    def label(self) -> str:
        """How messages name the node: "node 1 (10.0.0.2)", or "node at 10.0.0.2" without a rank."""
        if self.rank is None:
            return f"node at {self.address}"
        return f"node {self.rank} ({self.address})" if self.address else f"node {self.rank}"

    def amount(self, resource: str) -> int:
        """Whole units of `resource` this node registered (0 when absent)."""
        return int(float(self.resources.get(resource, 0) or 0))


def _node_rank(resources: Mapping[str, Any]) -> int | None:
    for name in resources:
        if name.startswith(NODE_RANK_RESOURCE_PREFIX):
            try:
                return int(name[len(NODE_RANK_RESOURCE_PREFIX) :])
            except ValueError:
                return None
    return None


def alive_nodes(nodes: Iterable[Mapping[str, Any]]) -> list[NodeView]:
    """The alive nodes of a `ray.nodes()` list (entries with `"Alive": False` are dropped; a missing
    "Alive" counts as alive), ordered by node rank, then nodes without a rank by address."""
    views = []
    for node in nodes:
        if not node.get("Alive", True):
            continue
        resources = dict(node.get("Resources") or {})
        address = str(node.get("NodeManagerAddress") or node.get("NodeManagerHostname") or "")
        views.append(NodeView(_node_rank(resources), address, resources))
    return sorted(views, key=lambda v: (v.rank is None, v.rank if v.rank is not None else 0, v.address))


# ----------------------------------------------------------------------------------------------
# The comparison


def check_cluster(need: ClusterNeed, nodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every way the alive `nodes` fall short of `need`, one message each; [] when the run fits.

    Checked, in this order:
    - `need.launched_nodes` (NNODES) differs from trainer.nnodes;
    - fewer alive nodes than trainer.nnodes;
    - fewer nodes with at least trainer.n_gpus_per_node units of the resource than trainer.nnodes:
      then each node short of it is named ("the recipe asks for 8 NPUs per node
      (trainer.n_gpus_per_node=8); node 1 (10.0.0.2) has 4"), and a node that registered the
      other accelerator resource instead (GPU for an NPU run, or the reverse) says so.
    """
    views = alive_nodes(nodes)
    problems: list[str] = []
    if need.launched_nodes is not None and need.launched_nodes != need.nnodes:
        problems.append(
            f"the recipe asks for {need.nnodes} node(s) (trainer.nnodes={need.nnodes}) but the launcher "
            f"was started for NNODES={need.launched_nodes}; set trainer.nnodes={need.launched_nodes} "
            f"or launch on {need.nnodes} node(s)"
        )
    if len(views) < need.nnodes:
        problems.append(
            f"the recipe asks for {need.nnodes} node(s) (trainer.nnodes={need.nnodes}); the cluster has {len(views)}"
        )
    enough = [v for v in views if v.amount(need.resource) >= need.per_node]
    if len(enough) < need.nnodes:
        what = f"{need.units(need.per_node)} per node (trainer.n_gpus_per_node={need.per_node})"
        if need.resource == "CPU":
            what += ", one CPU per worker"
        for view in views:
            have = view.amount(need.resource)
            if have >= need.per_node:
                continue
            text = f"the recipe asks for {what}; {view.label} has {have}"
            others = [r for r in _DEVICE_RESOURCES if r != need.resource and view.amount(r) > 0]
            if others and need.resource in _DEVICE_RESOURCES:
                text += (
                    f" (it registered {view.amount(others[0])} {others[0]} instead: the run uses "
                    f"{need.resource}s; check trainer.device and how Ray was started on that node)"
                )
            elif have == 0 and need.resource == "NPU":
                text += (
                    ' (Ray sees no "NPU" resource there: start it with '
                    "ray start --resources '{\"NPU\": N}', as launch/run_recipe.sh does)"
                )
            problems.append(text)
    return problems


# ----------------------------------------------------------------------------------------------
# Waiting for nodes


def missing_nodes_message(
    need: ClusterNeed, nodes: Iterable[Mapping[str, Any]], expected_nodes: int, waited_s: float, address: str
) -> str:
    """The timeout error of `wait_for_nodes`: how many nodes and devices are missing and, when the
    nodes carry launcher node ranks, which ranks have not joined. A node's devices count up to
    trainer.n_gpus_per_node (a CPU node's many cores do not make up for a missing node)."""
    views = alive_nodes(nodes)
    have_devices = sum(min(v.amount(need.resource), need.per_node) for v in views)
    want_devices = expected_nodes * need.per_node
    ranks = {v.rank for v in views if v.rank is not None}
    text = f"after {waited_s:.0f} s only {len(views)} of {expected_nodes} node(s) joined the Ray cluster at {address}"
    if ranks or not views:
        missing = [str(r) for r in range(expected_nodes) if r not in ranks]
        if missing:
            text += f" (node rank(s) {', '.join(missing)} have not joined)"
    text += f"; {need.units(have_devices)} of the {need.units(want_devices)} expected are registered"
    if want_devices > have_devices:
        text += f" ({need.units(want_devices - have_devices)} missing)"
    return (
        text + ". Fix: run `bash launch/run_recipe.sh` on every node with the same NNODES and "
        f"MASTER_ADDR/MASTER_PORT ({address}), check that the port is reachable from the other "
        "nodes (firewall, HCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME on multi-NIC hosts), or raise "
        "NODE_WAIT_TIMEOUT if nodes start slowly"
    )


def wait_for_nodes(
    fetch_nodes: Callable[[], list[dict]],
    need: ClusterNeed,
    expected_nodes: int,
    timeout_s: float,
    address: str,
    interval_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] | None = None,
) -> list[dict]:
    """Poll `fetch_nodes()` until at least `expected_nodes` nodes are alive; return that node list.

    Raises `UserError` (`missing_nodes_message`) when `timeout_s` passes first. `say` gets a line
    whenever the count of alive nodes changes.
    """
    start = clock()
    last_count = -1
    while True:
        nodes = fetch_nodes()
        count = len(alive_nodes(nodes))
        if count != last_count and say is not None:
            say(f"{count} of {expected_nodes} node(s) in the cluster")
        last_count = count
        if count >= expected_nodes:
            return nodes
        waited = clock() - start
        if waited >= timeout_s:
            raise UserError(missing_nodes_message(need, nodes, expected_nodes, waited, address))
        sleep(min(interval_s, max(0.0, timeout_s - waited)))


# ----------------------------------------------------------------------------------------------
# CLI


def _say(text: str) -> None:
    print(f"[cluster] {text}", flush=True)


def _load(args: argparse.Namespace):
    """(RecipeConfig, DeviceInfo) for the recipe named on the command line."""
    from verl_npu.config import load_recipe
    from verl_npu.device import detect_device

    rc = load_recipe(args.recipe, args.overrides)
    return rc, detect_device(rc.backend.trainer.device)


class _RayNodes:
    """`ray.nodes()` of the cluster at `address`, through one driver connection (closed by `close`,
    which disconnects without stopping the cluster)."""

    def __init__(self, address: str):
        import logging

        import ray

        from verl_npu.workers.ray_group import check_ray_address_reachable

        self._ray = ray
        check_ray_address_reachable(address)
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except Exception as exc:  # ConnectionError, TimeoutError, auth errors: all mean "not reachable"
            raise UserError(
                f"cannot connect to the Ray cluster at {address} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}). Fix: check MASTER_ADDR / MASTER_PORT "
                f"(or RAY_ADDRESS) and that the head node is up"
            ) from None

    def __call__(self) -> list[dict]:
        return list(self._ray.nodes())

    def close(self) -> None:
        self._ray.shutdown()


def cmd_ray_start_args(args: argparse.Namespace) -> int:
    _, device = _load(args)
    count = device.count() if device.kind != "cpu" else 0
    if device.kind != "cpu" and count < 1:
        raise UserError(f"this node has no usable {device.kind} device ({device.describe()})")
    for arg in ray_start_args(device.kind, count, args.node_rank):
        print(arg)
    return 0


def cmd_wait_for_nodes(args: argparse.Namespace) -> int:
    rc, device = _load(args)
    need = ClusterNeed.from_recipe(rc, device.kind)
    fetch = _RayNodes(args.address)
    try:
        wait_for_nodes(fetch, need, args.nnodes, args.timeout, args.address, interval_s=args.interval, say=_say)
    finally:
        fetch.close()
    _say(f"all {args.nnodes} node(s) joined")
    return 0


def cmd_preflight(args: argparse.Namespace) -> int:
    rc, device = _load(args)
    need = ClusterNeed.from_recipe(rc, device.kind, launched_nodes=args.launched_nodes)
    if args.nodes_json:
        with open(args.nodes_json, encoding="utf-8") as fh:
            nodes = json.load(fh)
    else:
        fetch = _RayNodes(args.address)
        try:
            nodes = fetch()
        finally:
            fetch.close()
    problems = check_cluster(need, nodes)
    for view in alive_nodes(nodes):
        _say(f"{view.label}: {need.units(view.amount(need.resource))}")
    if problems:
        raise UserError(f"the cluster does not fit the recipe {rc.source}:\n" + "\n".join(f"  - {p}" for p in problems))
    _say(
        f"preflight passed: {need.nnodes} node(s) x {need.units(need.per_node)} "
        f"(trainer.nnodes x trainer.n_gpus_per_node)"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m verl_npu.cluster", description="Multi-node helpers for launch/run_recipe.sh."
    )
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    def recipe_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("recipe", help="shipped recipe name or path to a .yaml file")
        p.add_argument("overrides", nargs="*", help="key=value")

    p = sub.add_parser("ray-start-args", help="print this node's device arguments for `ray start`")
    p.add_argument("--node-rank", type=int, required=True)
    recipe_args(p)
    p.set_defaults(fn=cmd_ray_start_args)

    p = sub.add_parser("wait-for-nodes", help="wait until NNODES nodes are in the cluster")
    p.add_argument("--address", required=True, help="Ray cluster address (host:port or auto)")
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls (default 2)")
    recipe_args(p)
    p.set_defaults(fn=cmd_wait_for_nodes)

    p = sub.add_parser("preflight", help="compare the recipe with the cluster's nodes and devices")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--address", help="Ray cluster address (host:port or auto)")
    where.add_argument("--nodes-json", help="a saved JSON list of ray.nodes() instead of a live cluster")
    p.add_argument("--launched-nodes", type=int, default=None, help="NNODES the launcher was started with")
    recipe_args(p)
    p.set_defaults(fn=cmd_preflight)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m verl_npu.cluster`; returns the exit code (1 on a UserError)."""
    args = build_parser().parse_args(argv)
    return run_command(lambda: args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
