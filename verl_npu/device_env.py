"""What the processes of a run get in their environment for a device kind: the environment defaults set
before the device runtime starts (`env_defaults`, `apply_env_defaults`), `ray start`'s device arguments
(`ray_start_args`) and the Ray `runtime_env` of every worker (`ray_runtime_env`). `verl_npu.device` re-exports
them: callers ask the device layer."""

from __future__ import annotations

import json
import os
from collections.abc import MutableMapping
from typing import Any

from verl_npu.device_tables import (
    COMMON_ENV_DEFAULTS,
    CPU_ENV_DEFAULTS,
    CUDA_ENV_DEFAULTS,
    KINDS,
    NODE_RANK_RESOURCE_PREFIX,
    NPU_ENV_DEFAULTS,
    RAY_RESOURCES,
    EnvDefault,
)
from verl_npu.host import ThreadPolicy


def env_defaults(kind: str) -> tuple[EnvDefault, ...]:
    """The environment defaults for `kind` ("npu" | "cuda" | "cpu"): kind-specific ones, then common."""
    specific = {"npu": NPU_ENV_DEFAULTS, "cuda": CUDA_ENV_DEFAULTS, "cpu": CPU_ENV_DEFAULTS}
    if kind not in specific:
        raise ValueError(f"unknown device kind {kind!r}; expected one of {KINDS}")
    return specific[kind] + COMMON_ENV_DEFAULTS


def apply_env_defaults(kind: str, env: MutableMapping[str, str] | None = None) -> list[tuple[str, str, str]]:
    """Set each default of `env_defaults(kind)` in `env` (default `os.environ`) unless the variable is
    already present (a value the user set, even an empty one, wins). Returns `(var, value, reason)`
    for each default that was applied, in table order."""
    env = os.environ if env is None else env
    applied: list[tuple[str, str, str]] = []
    for default in env_defaults(kind):
        if default.var not in env:
            env[default.var] = default.value
            applied.append((default.var, default.value, default.reason))
    return applied


def ray_start_args(kind: str, device_count: int, node_rank: int) -> list[str]:
    """Device arguments for `ray start` on node `node_rank` with `device_count` devices of `kind`:
    npu `--resources {"NPU": n, "verl_npu_node_rank_R": 1}`; cuda `--num-gpus n` and the node-rank
    resource; cpu only the node-rank resource (Ray counts the CPUs itself)."""
    if kind not in RAY_RESOURCES:
        raise ValueError(f"unknown device kind {kind!r}")
    resource = RAY_RESOURCES[kind]  # Ray counts GPUs itself; an NPU is a custom resource
    resources = {resource: int(device_count)} if resource not in (None, "GPU") else {}
    resources[f"{NODE_RANK_RESOURCE_PREFIX}{int(node_rank)}"] = 1
    gpus = ["--num-gpus", str(int(device_count))] if resource == "GPU" else []
    return gpus + ["--resources", json.dumps(resources, separators=(",", ":"))]


def ray_runtime_env(
    kind: str, env: MutableMapping[str, str] | None = None, threads: ThreadPolicy | None = None
) -> dict[str, Any]:
    """The Ray `runtime_env` every worker should get: `{"env_vars": {var: value}}` for each variable of
    `env_defaults(kind)`, with the driver's value (from `env`, default `os.environ`) when it has one,
    else the default. This makes workers on every node agree with the driver. With `threads` (the
    run's CPU thread policy), its variables too (`ThreadPolicy.env`).

    The visible-devices variable is never included: Ray sets `ASCEND_RT_VISIBLE_DEVICES` /
    `CUDA_VISIBLE_DEVICES` per actor to the devices it was given (unless the user sets
    `RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1`; see `DeviceInfo.local_device_index`).
    """
    env = os.environ if env is None else env
    env_vars = {d.var: env.get(d.var, d.value) for d in env_defaults(kind)}
    if threads is not None:  # the CPU thread policy (Ray would set OMP_NUM_THREADS to num_cpus)
        env_vars.update(threads.env())
    return {"env_vars": env_vars}
