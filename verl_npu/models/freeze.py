"""Freezing parts of a policy model (`actor_rollout_ref.actor.freeze_vision_tower`)."""

from __future__ import annotations

import torch

from verl_npu.errors import UserError

#: attribute names under which multimodal models in transformers keep their vision encoder.
VISION_TOWER_NAMES = ("visual", "vision_tower", "vision_model")


def vision_towers(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(qualified name, submodule) of every vision encoder in `module` (outermost ones only)."""
    found: list[tuple[str, torch.nn.Module]] = []
    for name, sub in module.named_modules():
        if name.rsplit(".", 1)[-1] in VISION_TOWER_NAMES and not any(name.startswith(f + ".") for f, _ in found):
            found.append((name, sub))
    return found


def freeze_vision_tower(module: torch.nn.Module) -> int:
    """Set requires_grad=False on every parameter of the vision encoder(s) and return how many
    parameters that froze. Frozen parameters get no gradient and, since the optimizer is built
    from the parameters that require grad, no optimizer state. A model without a vision encoder
    is a UserError naming the key."""
    towers = vision_towers(module)
    if not towers:
        raise UserError(
            "actor_rollout_ref.actor.freeze_vision_tower=true, but the model "
            f"({type(module).__name__}) has no vision tower (no submodule named "
            f"{' / '.join(VISION_TOWER_NAMES)}); set it to false for a text-only model"
        )
    count = 0
    for _, tower in towers:
        for param in tower.parameters():
            param.requires_grad_(False)
            count += param.numel()
    return count
