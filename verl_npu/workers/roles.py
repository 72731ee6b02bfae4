"""Worker roles: which workers a run builds.

A role is a worker class: a forward function (and, when it trains, a loss) over its own
`TrainingEngine` (`verl_npu.workers.engine`: model, FSDP2 shards, optimizer, the update loop).
Every role a config needs is built on every rank (colocated on the same devices, as verl's
hybrid engine does); the controller reaches a role's method through `WorkerGroup.dispatch(..., role=name)`.
Adding a role is one file with its worker class, declared with `@ROLES.register(...)` (`verl_npu.registry`:
its name, when a config needs it, its methods and metrics).
"""

from __future__ import annotations

from verl_npu.config.typed import section
from verl_npu.registry import ROLES, roles_needed


def roles_for(cfg) -> list[str]:
    """Names of the roles `cfg` (the backend config: typed, or a dict / OmegaConf tree, other keys at
    their defaults) needs, in declaration order (the actor first)."""
    return [spec.name for spec in roles_needed(section("backend_config", cfg))]


def checkpointed_roles(names) -> list[str]:
    """The roles among `names` that save and restore a `global_step_N/<role>` folder."""
    return [n for n in names if ROLES.spec(n).checkpointed]


def build_workers(cfg, total_training_steps: int, device, rank: int = 0, world_size: int = 1) -> dict:
    """One worker per needed role, on this rank: {role name: worker}. `cfg` is the typed backend config,
    `device` the run's `DeviceInfo` (resolved once, by the driver)."""
    device.use_kernels()
    return {
        name: ROLES.load(name)(cfg, total_training_steps, device, rank=rank, world_size=world_size)
        for name in roles_for(cfg)
    }
