"""Profiler settings (`global_profiler.*`, `actor_rollout_ref.{actor,ref,rollout}.profiler.*`): the
tools verl-npu runs, verl's tools it refuses, and the cross-key rule that checks them at validate
(registered in `rules.RULES`). `verl_npu.trainer.profiling` runs the profiles; it reads the tool
names from here. Nothing here imports torch: the device kind is the one the config plans for
(`verl_npu.device.configured_device`).
"""

from __future__ import annotations

from collections.abc import Iterator

from verl_npu.config.rules import TRAINER, Ctx, _device, _rule
from verl_npu.config.tree import BC
from verl_npu.errors import Problem

#: tools that run here, and the device kinds each runs on.
TOOLS = {"torch": ("cpu", "cuda", "npu"), "npu": ("npu",), "torch_memory": ("cuda", "npu")}
#: what a tool records, where its name alone does not say
WHAT = {"torch_memory": " (memory snapshots of the device's caching allocator)"}
#: global_profiler.global_tool_config.<tool> options each tool reads (the others are refused by name)
TOOL_OPTIONS = {"torch_memory": ("trace_alloc_max_entries", "stack_depth")}
#: verl's other tools: refused by name, with the reason.
REFUSED_TOOLS = {
    "nsys": "Nsight Systems must wrap each Ray worker process at start-up, which verl-npu does not do; "
    "use global_profiler.tool=torch (CUDA kernels are in its trace)",
    "precision_debugger": "msprobe's precision debugger is not integrated; use global_profiler.tool=torch",
    "memray": "memray traces are not implemented; use global_profiler.tool=torch with contents=[memory]",
}
CONTENTS = ("cpu", "cuda", "npu", "memory", "shapes", "stack")
ROLES = ("actor", "ref", "rollout")


def config_problems(c, gp: str, roles: dict[str, str], device_key: str, world: int):
    """(key, message, fix) for profiler settings that cannot run here or would record nothing.
    `c(key)` reads a full key; `gp` / `roles[role]` are the full prefixes of global_profiler. and
    actor_rollout_ref.<role>.profiler."""
    enabled = [role for role, p in roles.items() if c(p + "enable")]
    tool_keys = [gp + "tool"] + [roles[r] + "tool" for r in enabled]
    kind = None
    for key in tool_keys:
        tool = c(key)
        if tool is None:
            continue
        if tool in REFUSED_TOOLS:
            why, _, fix = REFUSED_TOOLS[tool].partition("; ")
            yield key, f"verl-npu does not support the {tool} profiler: {why}", fix
        elif tool not in TOOLS:
            yield key, f"{tool!r} is not one of {', '.join(TOOLS)}", "use global_profiler.tool=torch"
        else:
            if kind is None:
                device = _device(c)  # what the run plans for, without importing torch
                kind = device.kind if device is not None else str(c(device_key))
            if kind not in TOOLS[tool]:
                yield (
                    key,
                    f"verl-npu does not support the {tool} profiler{WHAT.get(tool, '')} on {kind}: it runs on "
                    f"{' / '.join(TOOLS[tool])} devices, this run is on {kind}",
                    "use global_profiler.tool=torch (torch_npu.profiler on NPU runs; "
                    "<role>.profiler.tool_config.torch.contents=[memory] records allocations on any device)",
                )
    for name, options in (c(gp + "global_tool_config") or {}).items():
        unknown = sorted(set(options or {}) - set(TOOL_OPTIONS.get(name, ()))) if isinstance(options, dict) else []
        if name in TOOL_OPTIONS and unknown:
            yield (
                gp + "global_tool_config",
                f"{name} has {unknown}; verl-npu reads {', '.join(TOOL_OPTIONS[name])}",
                f"remove {', '.join(unknown)}",
            )
    tool = next((c(k) for k in reversed(tool_keys) if c(k) is not None), None)
    steps = c(gp + "steps") or []
    if tool is not None and not enabled:
        yield (
            gp + "tool",
            f"is {tool} but no role records: nothing would be profiled",
            "set actor_rollout_ref.actor.profiler.enable=true and .all_ranks=true (or .ranks=[0])",
        )
    if tool is not None and not steps:
        yield (
            gp + "steps",
            f"is empty while global_profiler.tool={tool}: nothing would be profiled",
            "name the steps, e.g. global_profiler.steps=[2]",
        )
    if enabled and tool is None:
        yield (
            gp + "tool",
            f"is null while {enabled[0]}.profiler.enable=true: nothing would be profiled",
            "set global_profiler.tool=torch (and global_profiler.steps)",
        )
    if any(int(s) < 1 for s in steps):
        yield gp + "steps", f"{steps}: training steps count from 1", "use steps >= 1"
    for role in enabled:
        p = roles[role]
        ranks = c(p + "ranks") or []
        if not c(p + "all_ranks") and not ranks:
            yield (
                p + "ranks",
                f"is empty and {role}.profiler.all_ranks is false: no rank would record",
                f"set actor_rollout_ref.{role}.profiler.all_ranks=true or ranks=[0]",
            )
        bad = [r for r in ranks if not 0 <= r < world]
        if bad:
            yield p + "ranks", f"{bad} outside the {world} ranks of this run", f"use ranks in 0..{world - 1}"
        for tool_name, options in (c(p + "tool_config") or {}).items():
            contents = options.get("contents") if isinstance(options, dict) else None
            unknown = [x for x in (contents or []) if x not in CONTENTS]
            if tool_name in TOOLS and unknown:
                yield (
                    p + "tool_config",
                    f"{tool_name}.contents has {unknown}, not among {', '.join(CONTENTS)}",
                    "use memory, shapes and/or stack",
                )


_GP = BC + "global_profiler."
_PROFILER_ROLES = {role: BC + f"actor_rollout_ref.{role}.profiler." for role in ("actor", "ref", "rollout")}


@_rule(
    "profiler",
    (
        _GP + "tool",
        _GP + "steps",
        _GP + "global_tool_config",
        TRAINER + "device",
        *(p + k for p in _PROFILER_ROLES.values() for k in ("enable", "all_ranks", "ranks", "tool", "tool_config")),
    ),
    "profiling needs a tool that runs here (torch; npu on NPU runs), global_profiler.steps, and a role's "
    "profiler.enable selecting ranks (all_ranks or ranks); verl's other tools are refused with the reason",
)
def _profiler(c: Ctx) -> Iterator[Problem]:
    for key, message, fix in config_problems(c, _GP, _PROFILER_ROLES, TRAINER + "device", c.world):
        yield Problem(key, message, fix)
