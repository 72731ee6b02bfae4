"""Worker roles: which workers a run builds, by name.

A role is a worker class: a forward function (and, when it trains, a loss) over its own
`TrainingEngine` (`verl_npu.workers.engine`: model, FSDP2 shards, optimizer, the update loop).
Every role a config needs is built on every rank (colocated on the same devices, as verl's
hybrid engine does); the controller reaches a role's method through `WorkerGroup.dispatch(..., role=name)`.
Adding a role is one `register_role` call: a name, the worker class (as "module:Class", imported
only when built) and the predicate that says whether a config needs it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from verl_npu.config.typed import section
from verl_npu.estimators import needs_critic


@dataclass(frozen=True)
class RoleSpec:
    name: str
    worker: str                       # "package.module:ClassName"
    needed: Callable[[object], bool]  # typed backend config -> whether the run builds this role
    doc: str
    checkpointed: bool = True         # False: a frozen role, no folder in global_step_N/

    def worker_class(self):
        module, _, cls = self.worker.partition(":")
        return getattr(importlib.import_module(module), cls)


ROLES: dict[str, RoleSpec] = {}


def register_role(name: str, worker: str, needed: Callable[[object], bool], doc: str,
                  checkpointed: bool = True) -> None:
    if name in ROLES:
        raise ValueError(f"worker role {name!r} is registered twice")
    ROLES[name] = RoleSpec(name, worker, needed, doc, checkpointed)


register_role("actor", "verl_npu.workers.actor:ActorRolloutRefWorker", lambda cfg: True,
              "policy, rollout engine and reference policy (always built)")
register_role("critic", "verl_npu.workers.critic:CriticWorker", needs_critic,
              "value model (a value head on a transformers model) for gae")
register_role("reward_model", "verl_npu.workers.reward_model:RewardModelWorker",
              lambda cfg: cfg.reward_model.enable,
              "frozen sequence-classification reward model (reward_model.enable)", checkpointed=False)
register_role("teacher", "verl_npu.workers.distillation:TeacherWorker", lambda cfg: cfg.distillation.enabled,
              "frozen teacher that scores the student's samples (distillation.enabled)", checkpointed=False)


def roles_for(cfg) -> list[str]:
    """Names of the roles `cfg` (the backend config: typed, or a dict / OmegaConf tree, other keys at
    their defaults) needs, in registration order (the actor first)."""
    cfg = section("backend_config", cfg)
    return [name for name, spec in ROLES.items() if spec.needed(cfg)]


def checkpointed_roles(names) -> list[str]:
    """The roles among `names` that save and restore a `global_step_N/<role>` folder."""
    return [n for n in names if ROLES[n].checkpointed]


def build_workers(cfg, total_training_steps: int, device, rank: int = 0, world_size: int = 1) -> dict:
    """One worker per needed role, on this rank: {role name: worker}. `cfg` is the typed backend config,
    `device` the run's `DeviceInfo` (resolved once, by the driver)."""
    device.use_kernels()
    return {name: ROLES[name].worker_class()(cfg, total_training_steps, device, rank=rank, world_size=world_size)
            for name in roles_for(cfg)}
