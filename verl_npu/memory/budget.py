"""The memory a plan is made against, and the plan of a recipe as the CLI asks for it.

`parse_device_memory` reads `--device-memory` (a size such as `64GiB`, or a device name of the tables in
`verl_npu.device_tables`); `device_memory(rc, spec)` picks the figure for a resolved recipe (the flag, else the
recipe's device); `model_numbers(path)` reads a model's shapes without loading it; `plan_for(rc, spec)` puts them
together into `verl_npu.memory.recipe.plan_recipe`, and `summary_line` is the plan in one line. Imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from verl_npu.memory import plan as mp
from verl_npu.memory.plan import ModelSize, Plan
from verl_npu.memory.recipe import gib_text, plan_recipe, plan_sft
from verl_npu.memory.settings import plans_accelerator

if TYPE_CHECKING:
    from verl_npu.config import RecipeConfig
    from verl_npu.config.sft import SFTRecipe


# ------------------------------------------------------------------------------------------------ inputs
def _tiny_shape(uri: str) -> tuple[str, dict[str, int]] | None:
    """A tiny:// path's model name and size options without its seed (`verl_npu.models.tiny.parse_tiny_uri`); None
    when it is no valid tiny path."""
    from verl_npu.errors import UserError
    from verl_npu.models.tiny import parse_tiny_uri

    try:
        name, _, sizes = parse_tiny_uri(uri)
    except UserError:
        return None
    return name, sizes


def model_numbers(path: Any) -> ModelSize | None:
    """The ModelSize of a model path: a local folder or a hub id in the local cache (config.json,
    nothing downloaded), a tiny:// model already built in the verl-npu cache, or else a path naming
    a model of the known-shapes table (verl_npu.config.known_models); None otherwise."""
    import json

    from verl_npu.config.known_models import known_config
    from verl_npu.config.modelinfo import model_config
    from verl_npu.models.tiny import default_cache_dir, is_tiny_uri

    if is_tiny_uri(path):
        shape = _tiny_shape(path)
        if shape is None:
            return None
        builds = []
        for marker in (default_cache_dir() / "tiny").glob(f"{shape[0]}-*/verl_npu_tiny.json"):
            try:
                # any seed's build of the same sizes will do: a seed changes the weights, never the shapes
                if _tiny_shape(str(json.loads(marker.read_text()).get("uri", ""))) == shape:
                    builds.append(marker.parent)
            except (OSError, ValueError):
                continue
        if not builds:
            return None
        path = str(max(builds, key=lambda p: p.stat().st_mtime))
    conf = model_config(path)
    if conf is None:
        known = known_config(path)
        conf = known[1] if known else None
    return mp.model_size(conf)


_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 1 << 10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 10**9,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 10**12,
    "tib": 1 << 40,
}


def parse_device_memory(text: str) -> tuple[int, str, bool | None]:
    """(bytes, name, an accelerator? (None: unknown)) of --device-memory: an amount ("64GiB", "80GB",
    "65536MiB"; a bare number is GiB) or a known accelerator ("910B", "H100", "A100-40": verl_npu.device_tables.DEVICE_MEMORY_GIB)."""
    import re

    from verl_npu.device_tables import DEVICE_MEMORY_GIB
    from verl_npu.errors import UserError

    known = {k.lower(): (k, v) for k, v in DEVICE_MEMORY_GIB.items()}
    key = text.strip().lower().removeprefix("ascend")
    if key in known:
        name, gib = known[key]
        return gib << 30, f"{name} ({gib} GiB)", True
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", key)
    if not m or m.group(2) not in _UNITS:
        raise UserError(
            f"--device-memory {text!r} is not an amount or a known device; write e.g. 64GiB, 80GB, "
            f"or one of {', '.join(DEVICE_MEMORY_GIB)}"
        )
    scale = _UNITS[m.group(2)] if m.group(2) else 1 << 30
    value = int(float(m.group(1)) * scale)
    return value, f"{value / mp.GIB:.1f} GiB (--device-memory)", None


def device_memory(rc: RecipeConfig | SFTRecipe, spec: str | None = None) -> tuple[int, str, bool]:
    """(bytes, name, an accelerator?) of the device the plan is for: --device-memory when given; on CPU this machine's
    memory shared by the node's workers; on an accelerator the kind's usual card (device layer table)."""
    from verl_npu.device import configured_device, host_memory_bytes
    from verl_npu.device_tables import DEFAULT_ACCELERATOR, DEVICE_MEMORY_GIB

    trainer = rc.typed.trainer  # an RL or an SFT recipe: both have trainer.device and trainer.n_gpus_per_node
    if spec:
        size, name, card = parse_device_memory(spec)
        return size, name, plans_accelerator(trainer.device) if card is None else card
    requested = trainer.device
    device = configured_device(requested)
    kind = device.kind if device is not None else "cpu"
    if kind == "cpu" and requested in (None, "", "auto"):
        name = DEFAULT_ACCELERATOR["npu"]  # no accelerator here: plan for the one the recipe is written for
        return (
            DEVICE_MEMORY_GIB[name] << 30,
            (
                f"{name} ({DEVICE_MEMORY_GIB[name]} GiB, assumed: trainer.device is "
                "auto and this machine has no accelerator; --device-memory to change)"
            ),
            True,
        )
    if kind == "cpu":
        workers = max(1, min(int(trainer.n_gpus_per_node), rc.world_size))
        total = host_memory_bytes()
        return total // workers, f"CPU: this machine's {total / mp.GIB:.1f} GiB / {workers} worker(s)", False
    name = DEFAULT_ACCELERATOR[kind]
    return (
        DEVICE_MEMORY_GIB[name] << 30,
        f"{name} ({DEVICE_MEMORY_GIB[name]} GiB, assumed for {kind}; --device-memory to change)",
        True,
    )


def plan_for(rc: RecipeConfig, spec: str | None = None) -> tuple[Plan | None, str]:
    """The plan of a resolved recipe on its device, or (None, why not) when the model's numbers are unknown."""
    b = rc.backend
    actor = model_numbers(b.actor_rollout_ref.model.path)
    if actor is None:
        return None, (
            f"model numbers unknown: actor_rollout_ref.model.path={b.actor_rollout_ref.model.path} has no "
            "readable config.json here (a local folder, a hub id in the local cache, or a built tiny model)"
        )
    critic_path = b.critic.model.get("path")
    models = {
        "actor": actor,
        "critic": model_numbers(critic_path) if critic_path else None,
        "reward": model_numbers(b.reward_model.model.path) if b.reward_model.enable else None,
        "teacher": (
            model_numbers(b.distillation.teacher_models.teacher_model.model_path) if b.distillation.enabled else None
        ),
    }
    size, name, accelerator = device_memory(rc, spec)
    plan = plan_recipe(rc, size, name, models, accelerator)
    plan.device_assumed = not spec and accelerator
    plan.notes += _known_shape_notes(b)
    return plan, ""


def plan_for_sft(rc: SFTRecipe, spec: str | None = None) -> tuple[Plan | None, str]:
    """`plan_for` of a loaded SFT recipe (`verl_npu.memory.recipe.plan_sft`): model.path's numbers on its device."""
    path = rc.typed.model.path
    model = model_numbers(path)
    if model is None:
        return None, (
            f"model numbers unknown: model.path={path} has no readable config.json here (a local folder, a hub id "
            "in the local cache, or a built tiny model)"
        )
    size, name, accelerator = device_memory(rc, spec)
    plan = plan_sft(rc, size, name, model, accelerator)
    plan.device_assumed = not spec and accelerator
    plan.notes += _known_shape_notes_of([("the", path)])
    return plan, ""


def _known_shape_notes(b) -> list[str]:
    """A note for every role whose numbers came from the known-shapes table, not a config.json."""
    return _known_shape_notes_of([("actor", b.actor_rollout_ref.model.path), ("critic", b.critic.model.get("path"))])


def _known_shape_notes_of(paths: list[tuple[str, Any]]) -> list[str]:
    """`_known_shape_notes` for (role, model path) pairs."""
    from verl_npu.config.known_models import known_config
    from verl_npu.config.modelinfo import model_config

    notes = []
    for role, path in paths:
        if isinstance(path, str) and not path.startswith("tiny://") and model_config(path) is None:
            known = known_config(path)
            if known:
                notes.append(
                    f"{role} model: no config.json readable at {path}; planned with the known shapes of "
                    f"{known[0]} (verl_npu/config/known_models.py)"
                )
    return notes


def summary_line(plan: Plan) -> str:
    """One line: the peak phase, its total against the device, the verdict."""
    peak = plan.peak
    head = f"memory plan: {gib_text(peak.total)} of {gib_text(plan.device_bytes)} per device at the {peak.name}"
    if plan.verdict == "will not fit":
        worst = max(peak.parts, key=lambda p: p.bytes)
        why = plan.problems[0] if plan.problems else f"largest part: {worst.name} {gib_text(worst.bytes)}"
        return f"{head}: will not fit ({why}); see verl-npu plan"
    return f"{head}: {plan.verdict}"
