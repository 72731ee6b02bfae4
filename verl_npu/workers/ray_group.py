"""`RayWorkerGroup`: one Ray actor per device, forming one torch.distributed group.

- Each actor asks Ray for one device of the detected kind ("NPU" resource, a GPU, or on a
  CPU machine one CPU) inside a placement group, so the group is scheduled all at once.
- Rank 0's node address and a free port on it are the rendezvous for torch.distributed
  (hccl / nccl / gloo, from the device layer).
- A Ray cluster that is already running (RAY_ADDRESS, or `ray start` on this node via
  `address="auto"` when RAY_ADDRESS is set) is joined, never replaced, and never shut down by us.
- A worker that dies stops the run at once with an error naming its rank and the last complete
  checkpoint: results are awaited one by one, so one dead actor cannot leave the others hanging
  unnoticed.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

from verl_npu.batch import Batch
from verl_npu.errors import UserError
from verl_npu.workers.group import WorkerGroup

if TYPE_CHECKING:
    from verl_npu.config import RecipeConfig
    from verl_npu.config.sections import BackendConfigSection

log = logging.getLogger("verl_npu")

WORKER_START_TIMEOUT_S = 600


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


RAY_CONNECT_PROBE_S = 10.0


def check_ray_address_reachable(address: str, timeout_s: float = RAY_CONNECT_PROBE_S) -> None:
    """Raise a UserError unless a TCP connection to `address` (`host:port` or `ray://host:port`)
    opens within `timeout_s`. `ray.init(address=...)` on an unreachable address keeps retrying for
    minutes before it fails, so the address is probed first. `auto` and `local` are left to Ray;
    any other form without a host and a numeric port is a UserError saying what Ray accepts."""
    if address.strip() in ("auto", "local"):
        return
    host_port = address.split("://", 1)[-1].rsplit("/", 1)[0]
    host, sep, port = host_port.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(
            f"the Ray address {address!r} (RAY_ADDRESS, or preflight --address) is not one Ray understands. "
            "Fix: set it to the head node's host:port (e.g. 10.0.0.1:6379, what `ray start --head` prints), "
            "ray://host:10001, or auto; or unset RAY_ADDRESS to run on this machine"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UserError(
            f"cannot connect to the Ray cluster at {address} ({exc.strerror or type(exc).__name__} "
            f"within {timeout_s:.0f}s). Fix: start the head node first (`ray start --head`), check "
            f"RAY_ADDRESS / MASTER_ADDR / MASTER_PORT, or unset RAY_ADDRESS to run on this machine"
        ) from None


def _bundle_nodes(pg) -> list[str]:
    """The Ray node id of each bundle of a ready placement group, in bundle order."""
    from ray.util.placement_group import placement_group_table

    table = placement_group_table(pg).get("bundles_to_node_id") or {}
    return [str(table.get(i, "")) for i in range(len(table))] if table else []


def ranks_by_node(bundle_nodes: list[str], world_size: int) -> list[int]:
    """Bundle index for each rank so that consecutive ranks share a node: nodes in the order of
    their first bundle, bundles in order within a node. A "PACK" placement group may interleave
    nodes, while rollout TP groups and Ulysses groups of consecutive ranks must stay inside one
    node (fast intra-node links; vLLM's TP group is node-local). Nodes unknown: bundle order."""
    if len(bundle_nodes) != world_size:
        return list(range(world_size))
    order: dict[str, list[int]] = {}
    for index, node in enumerate(bundle_nodes):
        order.setdefault(node, []).append(index)
    return [index for indices in order.values() for index in indices]


def _portable(exc: Exception) -> Exception:
    """`exc` if Ray can carry it back to the controller, else a RuntimeError with its text (an
    engine's validation error may not pickle, and Ray would then only say "isn't serializable")."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class _WorkerHost:
    """Runs inside a Ray actor: sets up torch.distributed, then hosts one worker per role the
    config needs (`verl_npu.workers.roles`), all on this actor's device. `cfg` is the typed backend
    config (it pickles as it is); `device` the driver's `DeviceInfo` (the run resolves it once)."""

    def __init__(
        self, cfg: BackendConfigSection, total_training_steps: int, device, rank: int, world_size: int, threads=None
    ):
        self._args = (cfg, total_training_steps, device, rank, world_size)
        if threads is not None:  # the run's CPU thread policy (its variables came with the runtime_env)
            from verl_npu.device import set_torch_threads

            set_torch_threads(threads.intra_op, threads.inter_op)
        self.workers: dict[str, Any] = {}

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a free port on it: asked of rank 0's actor, where the
        torch.distributed store will listen (an actor of the run, not a short-lived task: such a
        task's worker process exits while Ray's threads in it still run, and aborts)."""
        from verl_npu.workers.parallel import free_port

        return _node_ip(), free_port()

    def start(self, addr: str, port: int) -> None:
        """Join the torch.distributed group at `addr:port`, then build the role workers."""
        cfg, total_training_steps, device, rank, world_size = self._args
        os.environ.update(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": "0",  # Ray makes exactly one device visible to each actor
                "MASTER_ADDR": addr,
                "MASTER_PORT": str(port),
            }
        )
        import torch.distributed as dist

        from verl_npu.workers.roles import build_workers

        device.set_device(0)
        dist.init_process_group(backend=device.dist_backend, rank=rank, world_size=world_size)
        self.workers = build_workers(cfg, total_training_steps, device, rank=rank, world_size=world_size)

    def call(self, role: str, method: str, *args, **kwargs) -> Any:
        try:
            return getattr(self.workers[role], method)(*args, **kwargs)
        except Exception as exc:
            portable = _portable(exc)
            if portable is exc:
                raise
            raise portable from None

    def ping(self) -> tuple[str, int]:
        return _node_ip(), os.getpid()

    def node_id(self) -> str:
        """The Ray node this worker runs on (logged next to its pid; tests check the placement)."""
        import ray

        return ray.get_runtime_context().get_node_id()


class RayWorkerGroup(WorkerGroup):
    def __init__(self, rc: RecipeConfig, total_training_steps: int, device):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from verl_npu.device import ray_runtime_env

        cfg = rc.typed
        self.world_size = rc.world_size
        # the run's CPU thread policy (None on an accelerator), as the driver chose it: its variables
        # reach the workers through Ray's runtime_env
        threads = device.thread_policy(self.world_size, cfg.trainer.cpu_threads)
        self.sp_size = cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size
        from verl_npu.registry import ROLLOUT_ENGINES

        self.rollout_group = ROLLOUT_ENGINES.spec(cfg.actor_rollout_ref.rollout.name).group_size(cfg)
        from verl_npu.workers.roles import roles_for

        self._roles = roles_for(cfg)
        self.last_checkpoint_dir = str(cfg.trainer.default_local_dir)
        self._started_ray = False
        if not sys.stderr.isatty():  # a pipe or a log file: Ray's coloured worker prefixes would be raw escapes
            os.environ.setdefault("RAY_COLOR_PREFIX", "0")
        if not ray.is_initialized():
            init_kwargs: dict[str, Any] = {
                "include_dashboard": False,
                "runtime_env": ray_runtime_env(device.kind, threads=threads),
            }
            if os.environ.get("RAY_ADDRESS"):
                check_ray_address_reachable(os.environ["RAY_ADDRESS"])
                init_kwargs["address"] = os.environ["RAY_ADDRESS"]
            else:
                self._started_ray = True
                if cfg.ray_init.num_cpus:
                    init_kwargs["num_cpus"] = cfg.ray_init.num_cpus
                # a local instance of our own: its default token authentication is right, and Ray's
                # warning that it is on ("set RAY_AUTH_MODE=disabled to opt out") is console noise
                logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
            try:
                ray.init(**init_kwargs)
            except ConnectionError as exc:
                # an unreachable RAY_ADDRESS: Ray gives up after its own connect timeout
                raise UserError(
                    f"cannot connect to the Ray cluster at RAY_ADDRESS={init_kwargs.get('address')} "
                    f"({str(exc).splitlines()[0] if str(exc) else 'connection failed'}). Fix: start the head "
                    f"node first (`ray start --head`), correct RAY_ADDRESS, or unset it to run on this machine"
                ) from None
        self._timeline = cfg.ray_init.timeline_json_file
        options = device.ray_actor_options(num_devices=1, num_cpus=1)
        bundle = device.ray_bundle(num_devices=1, num_cpus=1)
        self._pg = placement_group([dict(bundle) for _ in range(self.world_size)], strategy="PACK")
        ready, _ = ray.wait([self._pg.ready()], timeout=WORKER_START_TIMEOUT_S)
        if not ready:
            raise UserError(
                f"Ray could not place {self.world_size} workers each needing {bundle} within "
                f"{WORKER_START_TIMEOUT_S}s; the cluster has {ray.cluster_resources()}. Lower "
                f"trainer.n_gpus_per_node / trainer.nnodes or add nodes"
            )
        bundles = ranks_by_node(_bundle_nodes(self._pg), self.world_size)
        host_cls = ray.remote(_WorkerHost)
        self.actors = [
            host_cls.options(
                **options,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=bundles[rank]
                ),
                name=None,
            ).remote(cfg, total_training_steps, device, rank, self.world_size, threads)
            for rank in range(self.world_size)
        ]
        # the rendezvous lives on rank 0's node (which need not be this one): rank 0 names a free port there
        addr, port = self._gather([self.actors[0].rendezvous_address.remote()])[0]
        self._gather([a.start.remote(addr, port) for a in self.actors])
        hosts = self._gather([a.ping.remote() for a in self.actors])
        nodes = self._gather([a.node_id.remote() for a in self.actors])
        for rank, ((ip, pid), node) in enumerate(zip(hosts, nodes)):
            log.info("worker rank %d: pid %d on %s (Ray node %s)", rank, pid, ip, node)

    # ---- calls --------------------------------------------------------------------------------
    def _gather(self, refs: list) -> list[Any]:
        """Results in rank order; the first failure (a dead or failing worker) stops everything."""
        import ray

        index = {ref: rank for rank, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                rank = index[ref]
                try:
                    results[rank] = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    self.shutdown()
                    raise UserError(
                        f"worker rank {rank} died ({type(exc).__name__}: {str(exc).splitlines()[0]}). "
                        f"The run is stopped; the last complete checkpoint in {self.last_checkpoint_dir} is intact: "
                        f"rerun with trainer.resume_mode=auto to continue. If it was killed for memory, lower "
                        f"the micro batch sizes or turn on actor_rollout_ref.actor.fsdp_config.param_offload"
                    ) from None
                except ray.exceptions.RayTaskError as exc:
                    self.shutdown()
                    cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                    if isinstance(cause, UserError):
                        raise cause from None
                    raise RuntimeError(f"worker rank {rank} failed: {cause!r}") from cause
        return [results[r] for r in range(len(refs))]

    @property
    def roles(self) -> list[str]:
        return list(self._roles)

    def broadcast(self, method: str, *args, role: str = "actor", **kwargs) -> list[Any]:
        return self._gather([a.call.remote(role, method, *args, **kwargs) for a in self.actors])

    def scatter(self, method: str, chunks: list[Batch], *args, role: str = "actor", **kwargs) -> list[Any]:
        return self._gather([a.call.remote(role, method, c, *args, **kwargs) for a, c in zip(self.actors, chunks)])

    def shutdown(self) -> None:
        import ray

        if not ray.is_initialized():
            return
        if self._timeline:
            ray.timeline(filename=str(self._timeline))
            self._timeline = None
        for actor in getattr(self, "actors", []):
            ray.kill(actor)
        self.actors = []
        if getattr(self, "_pg", None) is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)
            self._pg = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False
