"""`verl-npu import {trinity,roll} CONFIG.yaml [-o RECIPE.yaml]`: another system's config as a verl-npu recipe.

`import_config` reads the config (ROLL: its Hydra `defaults:` composed from the files beside it and
its `${...}` resolved; Trinity: `${oc.env:...}` resolved), settles every leaf key in a `Ledger`
(mapped / default written out / not mapped, with why), writes the recipe (each value commented with
its source) and runs verl-npu's own loader over it. Nothing is dropped silently: every input key has a
row in the table. The mapping and its sources: docs/import.md.

Layer: above config (it validates with the loader); config never imports it.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from verl_npu.errors import UserError
from verl_npu.importers import hydra
from verl_npu.importers.ledger import Ledger, flatten_input
from verl_npu.importers.output import ImportResult, recipe_yaml, table_text, validate, write_recipe

SYSTEMS = ("trinity", "roll")


def read_config(system: str, path: Path) -> dict:
    """The config as a plain tree, composed and resolved as its own system would."""
    if not path.is_file():
        raise UserError(f"{path}: no such file (give the {system} config YAML to import)")
    if system == "roll":
        tree, _ = hydra.compose(path)
    else:
        tree = hydra.read_yaml(path)
    return hydra.resolve(tree, path)


def import_config(system: str, path: str | Path) -> ImportResult:
    """Map `path` (a `system` config) onto a recipe; nothing is written (see `import_to`)."""
    from verl_npu.importers import roll, trinity

    if system not in SYSTEMS:
        raise UserError(f"unknown system {system!r}: verl-npu imports {', '.join(SYSTEMS)}")
    path = Path(path)
    raw = read_config(system, path)
    led = Ledger(system, flatten_input(raw))
    if system == "trinity":
        legacy = trinity.legacy_keys(raw)
        if legacy:
            raise UserError(
                f"{path}: Trinity-RFT's older config schema (it has {', '.join(legacy)}): verl-npu imports the "
                "current schema only (project/name/checkpoint_root_dir, algorithm, model, buffer.explorer_input."
                "tasksets, explorer.rollout_model, trainer.trainer_config, synchronizer). Rewrite it for Trinity-RFT "
                ">= 0.2 (its examples/ folder has the current form of every example), then import again"
            )
        refusal = trinity.map_trinity(led, raw)
    else:
        refusal = roll.map_roll(led)
    return ImportResult.from_ledger(led, path, refusal)


def import_to(system: str, path: str | Path, out: str | Path | None = None) -> tuple[ImportResult, Path | None]:
    """Import, write the recipe (default `<config stem>.verl_npu.yaml` beside the config) and any file it
    names (a grid_env interaction config), then validate it with verl-npu's loader."""
    result = import_config(system, path)
    if result.refused:
        return result, None
    out = Path(out) if out else Path(path).with_name(Path(path).stem + ".verl_npu.yaml")
    for suffix, tree in result.extra_files.items():
        target = out.with_name(f"{out.stem}.{suffix}")
        target.write_text(tree if isinstance(tree, str) else yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
        for key, value in list(result.recipe.items()):
            if value == f"<{suffix}>":
                result.recipe[key] = str(target)
    write_recipe(result, out)
    stages = None
    if "sft.yaml" in result.extra_files:  # an SFT stage, then this RL recipe (importers.trinity_stages)
        stages = out.with_name(f"{out.stem}.stages.yaml")
        tree = {
            "af_output_dir": str(result.recipe.get("af_output_dir", "outputs/imported")),
            "stages": [{"name": "sft", "recipe": f"{out.stem}.sft.yaml"}, {"name": "rl", "recipe": out.name}],
        }
        stages.write_text(
            f"# Imported by `verl-npu import {system} {Path(path).name}`: the SFT stage, then RL from "
            "its checkpoint (docs/sft.md); run with `verl-npu run` on this file\n"
            + yaml.safe_dump(tree, sort_keys=False),
            encoding="utf-8",
        )
        result.extra_files["stages.yaml"] = tree
    validate(result, out, stages)
    return result, out


__all__ = ["SYSTEMS", "ImportResult", "import_config", "import_to", "recipe_yaml", "table_text"]
