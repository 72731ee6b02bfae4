"""Data parallelism for the workers: FSDP2 sharding, collectives and state dicts.

With one worker everything here is the identity (no process group is needed, so the CPU demo
starts fast). With several workers (one per device, a torch.distributed group over hccl / nccl /
gloo) the modules are sharded with FSDP2 (`fully_shard`): every decoder / vision block is its
own unit and the root holds the embeddings and the head (tied weights stay in one unit).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from verl_npu.config.sections import BackendConfigSection

logger = logging.getLogger("verl_npu")


def free_port() -> int:
    """A TCP port free on every interface of this host now: a torch.distributed rendezvous port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def is_distributed(world_size: int) -> bool:
    return world_size > 1 and dist.is_available() and dist.is_initialized()


_ONE_RANK_FSDP = False  # set while a worker that runs alone shards over a one-rank group


def fsdp_enabled(world_size: int) -> bool:
    """Whether the roles are FSDP2-sharded: over 2+ workers always; a worker that runs alone only
    between `start_one_rank_group` and `stop_one_rank_group` (parameter offloading)."""
    return is_distributed(world_size) or (world_size == 1 and _ONE_RANK_FSDP)


def is_fsdp(module: torch.nn.Module) -> bool:
    """True when `module` is FSDP2-sharded (its state dicts hold DTensors)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def offloads_parameters(cfg: BackendConfigSection) -> bool:
    """True when any role's `fsdp_config.param_offload` is set (cfg: the typed backend config); then
    one worker runs FSDP2 over a group of itself too."""
    roles = (cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.ref, cfg.critic.model, cfg.reward_model.model)
    return any(role.fsdp_config.param_offload for role in roles)


def start_one_rank_group(backend: str) -> None:
    """From now on a worker that runs alone shards its roles with FSDP2 on a one-rank mesh, as verl
    does on one device: what parameter / optimizer offloading is built on. FSDP2 needs a process
    group; this process's own (in-memory store, no rendezvous) is created when none exists, and
    kept for the life of the process, as vLLM keeps the one it creates (its engine's clean-up at
    exit expects it), and a later run in the same process reuses it."""
    global _ONE_RANK_FSDP
    if not dist.is_initialized():
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    elif dist.get_world_size() != 1:
        raise RuntimeError(f"a process group of {dist.get_world_size()} ranks already exists in this process")
    _ONE_RANK_FSDP = True


def stop_one_rank_group() -> None:
    """Workers built from now on are not sharded (the process group stays, see `start_one_rank_group`)."""
    global _ONE_RANK_FSDP
    _ONE_RANK_FSDP = False


_VISION_TOWER_NAMES = {"visual", "vision_tower", "vision_model"}


def _block_classes(module: torch.nn.Module) -> set[str]:
    return set(getattr(module, "_no_split_modules", None) or [])


#: the name of the sharding dimension of the device mesh, as verl names it: verl's model merger
#: reads a checkpoint's DTensors only when their mesh is named ("fsdp",) (or ("ddp", "fsdp"))
FSDP_MESH_DIMS = ("fsdp",)


def fsdp_mesh(device_type: str, world_size: int):
    """The 1-D device mesh FSDP2 shards over: every rank of the default process group, its one
    dimension named "fsdp" (verl's name, kept in every DTensor of a checkpoint)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (world_size,), mesh_dim_names=FSDP_MESH_DIMS)


def shard_module(
    module: torch.nn.Module, fsdp_cfg, world_size: int, param_dtype: torch.dtype = torch.float32
) -> torch.nn.Module:
    """FSDP2-shard `module` over the default process group (identity for one worker outside a
    one-rank group, see `fsdp_enabled`), on the mesh of `fsdp_mesh` (dimension named "fsdp", as
    verl's tools expect).

    `fsdp_config.param_offload` keeps parameters on the CPU between uses;
    `reshard_after_forward` frees gathered parameters after each forward;
    `wrap_policy.min_num_params` makes blocks smaller than that stay in their parent unit;
    `forward_prefetch` makes each block's unit start gathering the next block's parameters during
    its own forward (FSDP2 explicit prefetch: more overlap, one more block gathered at a time).
    Parameters are gathered in `param_dtype` for compute; gradients are reduced in fp32.
    """
    if not fsdp_enabled(world_size):
        return module
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    device_type = next(iter(module.parameters())).device.type
    kwargs = {"reshard_after_forward": fsdp_cfg.reshard_after_forward, "mesh": fsdp_mesh(device_type, world_size)}
    if param_dtype != torch.float32:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    if fsdp_cfg.param_offload:
        # pinned host memory needs an accelerator runtime; a CPU-only run offloads to plain memory
        on_accelerator = any(p.device.type != "cpu" for p in module.parameters())
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=on_accelerator)
    min_params = fsdp_cfg.wrap_policy.min_num_params
    names = _block_classes(module)
    blocks = []
    for sub in module.modules():
        if sub is module or type(sub).__name__ not in names:
            continue
        if sum(p.numel() for p in sub.parameters()) >= min_params:
            blocks.append(fully_shard(sub, **kwargs))
    if fsdp_cfg.forward_prefetch:
        for block, nxt in zip(blocks, blocks[1:]):
            block.set_modules_to_forward_prefetch([nxt])
    # Vision towers get a unit of their own: `generate` may run them outside the root's forward
    # (precomputed image features), and a unit gathers its parameters only inside its own forward.
    for name, sub in module.named_modules():
        if name.rsplit(".", 1)[-1] in _VISION_TOWER_NAMES:
            fully_shard(sub, **kwargs)
    fully_shard(module, **kwargs)
    # FSDP2 picks its root at the first forward; `generate` may call the vision unit first, so
    # settle the root now (torch has no public call for this yet).
    module._get_fsdp_state()._lazy_init()
    return module


def sequence_parallel_group(world_size: int, sp: int):
    """The Ulysses group of this rank: consecutive ranks [i*sp, (i+1)*sp) share one data shard.
    Returns (group or None, data-parallel rank, data-parallel size). Every rank creates every
    group (torch.distributed requires it)."""
    if sp <= 1 or not is_distributed(world_size):
        rank = dist.get_rank() if is_distributed(world_size) else 0
        return None, rank, world_size
    rank = dist.get_rank()
    mine = None
    for start in range(0, world_size, sp):
        group = dist.new_group(list(range(start, start + sp)))
        if start <= rank < start + sp:
            mine = group
    return mine, rank // sp, world_size // sp


def all_reduce_sum(value: float, world_size: int, device: torch.device | str = "cpu") -> float:
    """Sum of `value` over ranks (hccl / nccl need the tensor on the rank's device)."""
    if not is_distributed(world_size):
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def barrier(world_size: int) -> None:
    if is_distributed(world_size):
        dist.barrier()


def clip_grad_norm(module: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the global gradient norm (across shards) and return it as a plain tensor."""
    params = [p for p in module.parameters() if p.grad is not None]
    if not params:
        return torch.tensor(0.0)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)
    if hasattr(norm, "full_tensor"):  # DTensor under FSDP2
        norm = norm.full_tensor()
    return norm.detach().float().cpu()


class GuardedOptimizerStep:
    """One optimizer step after clipping, skipped when the gradient norm is not finite, with the
    count of skipped steps in this update and in a row (across updates: the trainer stops a run
    whose steps keep being skipped, `trainer.max_consecutive_skipped_updates`)."""

    def __init__(self, role: str):
        self.role, self.in_a_row, self.skipped = role, 0, 0

    def __call__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
        grad_norm = clip_grad_norm(module, max_norm)
        if torch.isfinite(grad_norm):
            optimizer.step()
            self.in_a_row = 0
        else:
            logger.warning("%s: non-finite grad norm %s: skipping this optimizer step", self.role, float(grad_norm))
            optimizer.zero_grad(set_to_none=True)
            self.in_a_row += 1
            self.skipped += 1
        return grad_norm

    def metrics(self) -> dict[str, float]:
        """`<role>/skipped_updates` since the last call (then reset) and `<role>/skipped_updates_in_a_row`."""
        out = {
            f"{self.role}/skipped_updates": float(self.skipped),
            f"{self.role}/skipped_updates_in_a_row": float(self.in_a_row),
        }
        self.skipped = 0
        return out


_ONE_RANK_MESHES: dict = {}


def one_rank_mesh(device_type: str, backend: str):
    """A mesh of one rank, dimension "fsdp", for a worker that runs alone (and is not sharded).

    verl shards even one device with FSDP2, so its checkpoints of one worker hold DTensors on such
    a mesh, and its loader expects them. A DeviceMesh can only be created inside a process group:
    a one-rank group (`backend`, in-memory store) exists just long enough to create it, so the rest
    of the process still sees no process group. Cached per device type."""
    if device_type not in _ONE_RANK_MESHES:
        if dist.is_initialized():
            _ONE_RANK_MESHES[device_type] = fsdp_mesh(device_type, 1)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            try:
                _ONE_RANK_MESHES[device_type] = fsdp_mesh(device_type, 1)
            finally:
                dist.destroy_process_group()
    return _ONE_RANK_MESHES[device_type]


def _as_shard(tensor: torch.Tensor, mesh) -> torch.Tensor:
    from torch.distributed.tensor import DTensor, Shard

    return DTensor.from_local(tensor.detach(), mesh, [Shard(0)], run_check=False)


def module_state_dict(module: torch.nn.Module, mesh=None) -> dict:
    """This rank's part of the weights, as verl's checkpoint manager saves it: `module.state_dict()`
    (FSDP2: DTensor shards on the "fsdp" mesh). A module that is not sharded (one worker) gives its
    parameters as DTensors of `mesh` (`one_rank_mesh`: what verl writes for one device) when
    `mesh` is given, else as plain tensors."""
    state = module.state_dict()
    if mesh is None or is_fsdp(module):
        return state
    params = {name for name, _ in module.named_parameters(remove_duplicate=False)}
    return {k: _as_shard(v, mesh) if k in params else v.detach() for k, v in state.items()}


def _plain_if_unsharded(value):
    """A DTensor read from a 1-rank checkpoint (verl shards even one worker with FSDP2) as the
    plain tensor it holds, for a module that is not sharded here; anything else unchanged."""
    if hasattr(value, "device_mesh") and hasattr(value, "to_local"):
        if value.device_mesh.size() != 1:
            raise ValueError(f"a tensor sharded over {value.device_mesh.size()} ranks cannot load into one worker")
        return value.to_local()
    if isinstance(value, dict):
        return {k: _plain_if_unsharded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_if_unsharded(v) for v in value]
    return value


def load_module_state_dict(module: torch.nn.Module, state: dict) -> None:
    """Load what `module_state_dict` saved (or verl's manager: the same format) into `module`."""
    if is_fsdp(module):
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(module, state)
    else:
        module.load_state_dict(_plain_if_unsharded(state))


def optimizer_state_dict(module: torch.nn.Module, optimizer: torch.optim.Optimizer, mesh=None) -> dict:
    """This rank's optimizer state as verl saves it: `optimizer.state_dict()` (parameters by
    index in `param_groups`; FSDP2: DTensor moments). For a module that is not sharded, `mesh`
    (as in `module_state_dict`) turns the moments shaped like their parameter into DTensors."""
    state = optimizer.state_dict()
    if mesh is None or is_fsdp(module):
        return state
    shapes = {index: p.shape for index, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    wrapped = {}
    for index, entry in state["state"].items():
        wrapped[index] = {
            k: _as_shard(v, mesh) if torch.is_tensor(v) and v.dim() and v.shape == shapes.get(index) else v
            for k, v in entry.items()
        }
    return {"state": wrapped, "param_groups": state["param_groups"]}


def load_optimizer_state_dict(module: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load `optimizer_state_dict`'s format (verl's), or the parameter-name keyed format that
    older verl-npu checkpoints hold (torch.distributed.checkpoint's `get_optimizer_state_dict`)."""
    by_name = any(isinstance(k, str) for k in state.get("state", {})) or any(
        isinstance(p, str) for group in state.get("param_groups", []) for p in group.get("params", [])
    )
    if by_name:
        if is_fsdp(module):
            from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

            set_optimizer_state_dict(module, optimizer, state)
            return
        names = {
            name: index
            for index, (name, p) in enumerate((n, p) for n, p in module.named_parameters() if p.requires_grad)
        }
        state = {
            "state": {names[k]: v for k, v in state["state"].items()},
            "param_groups": [dict(g, params=[names[p] for p in g["params"]]) for g in state["param_groups"]],
        }
    optimizer.load_state_dict(state if is_fsdp(module) else _plain_if_unsharded(state))


def _gathered(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a DTensor shard is all-gathered (a collective), a plain tensor is itself."""
    tensor = tensor.detach()
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def iter_full_tensors(
    module: torch.nn.Module,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    bucket_bytes: int = 512 << 20,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) for every entry of `module.state_dict()`, on EVERY rank.

    Collective: every rank must consume the whole iterator, in the same order. Tensors are
    gathered one bucket at a time (entries in state-dict order until their full size in `dtype`
    would pass `bucket_bytes`; an entry larger than a bucket is a bucket of its own), cast to
    `dtype` (floating tensors; None keeps them) and moved to `device` (None keeps them), so the
    extra memory held at once is about one bucket. Tied weights appear under each of their
    names (as in the state dict)."""
    entries = list(module.state_dict().items())

    def nbytes(tensor: torch.Tensor) -> int:
        size = dtype.itemsize if (dtype is not None and tensor.is_floating_point()) else tensor.element_size()
        return tensor.numel() * size  # numel of a DTensor is its global size

    start = 0
    while start < len(entries):
        stop, total = start, 0
        while stop < len(entries) and (stop == start or total + nbytes(entries[stop][1]) <= bucket_bytes):
            total += nbytes(entries[stop][1])
            stop += 1
        bucket = []
        for name, tensor in entries[start:stop]:
            full = _gathered(tensor)
            if dtype is not None and full.is_floating_point():
                full = full.to(dtype)
            if device is not None:
                full = full.to(device)
            bucket.append((name, full))
        yield from bucket
        del bucket
        start = stop


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on the CPU, gathered from every shard, on EVERY rank
    (collective: all ranks call it)."""
    return {name: t.cpu() for name, t in iter_full_tensors(module, device="cpu")}


def full_state_dict_on_rank0(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on the CPU of rank 0 only (other ranks get an empty dict): for
    writing one Hugging Face export without a full copy on every rank. Collective."""
    if is_fsdp(module):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}
