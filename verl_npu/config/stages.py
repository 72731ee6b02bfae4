"""A recipe naming two stages, SFT then RL (Trinity's `stages:` idea), read and checked as a whole.

    af_output_dir: outputs/tool_demo
    stages:
      - {name: sft, recipe: tiny_sft, overrides: [trainer.total_training_steps=40]}
      - {name: rl, recipe: tiny_tool_gsm8k, overrides: [trainer.total_training_steps=20]}

Each stage is a recipe (a shipped name, or a path relative to this file's folder, else to the current folder) with
`key=value` overrides; it writes under `<af_output_dir>/<name>`. The first stage is an SFT recipe that saves
`hf_model`; the second an RL recipe whose `actor_rollout_ref.model.path` is set to the SFT stage's last checkpoint
folder (`global_step_N`, read through its huggingface/ export) unless the stage sets it. Command-line overrides
name their stage: `sft.optim.lr=1e-4`, `rl.trainer.total_training_steps=5`; `af_output_dir=DIR` moves both.
`load_stages` validates both stages (every problem of both, named by stage) before anything runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from verl_npu.config.tree import read_yaml_file
from verl_npu.errors import ConfigErrors, Problem, UserError

#: the model path the RL stage is validated with before the SFT stage has written its checkpoint
PENDING = "<the SFT stage's last checkpoint>"


def is_stages_tree(raw) -> bool:
    """True when a recipe's YAML (a dict) names stages."""
    return isinstance(raw, dict) and "stages" in raw


@dataclass
class Stage:
    name: str
    kind: str  # "sft" or "rl"
    recipe: Path
    overrides: list[str] = field(default_factory=list)


@dataclass
class StagesRecipe:
    source: Path
    out_dir: Path
    stages: list[Stage]

    def stage_overrides(self, stage: Stage, model_path: str | None = None) -> list[str]:
        """`stage`'s overrides as its loader takes them: its own output folder, and for the RL stage the model."""
        extra = [f"af_output_dir={self.out_dir / stage.name}"]
        if (
            stage.kind == "rl"
            and model_path is not None
            and not any(o.split("=", 1)[0].strip().endswith("actor_rollout_ref.model.path") for o in stage.overrides)
        ):
            extra.append(f"actor_rollout_ref.model.path={model_path}")
        return [*stage.overrides, *extra]


def _recipe_path(text: str, base: Path) -> Path:
    from verl_npu.config.recipes import find_recipe

    local = base / os.path.expanduser(text)
    return local if local.is_file() else find_recipe(text)


def read_stages(name_or_path: str | Path, overrides: Iterable[str] = ()) -> StagesRecipe:
    """A stages recipe's structure with `overrides` applied (`stage.key=value` to its stage, `af_output_dir=DIR`),
    each stage's recipe found and of the right kind, but not validated (`load_stages` does that)."""
    from verl_npu.config.recipes import find_recipe
    from verl_npu.config.sft import is_sft_recipe

    source = find_recipe(name_or_path)
    raw = read_yaml_file(source)
    problems: list[Problem] = []
    for key in raw:
        if key not in ("af_output_dir", "stages"):
            problems.append(
                Problem(
                    str(key),
                    "unknown key of a stages recipe",
                    "a stages recipe has af_output_dir "
                    "and stages (each stage's settings go in its recipe or its overrides)",
                )
            )
    entries = raw.get("stages")
    if not isinstance(entries, list) or len(entries) != 2:
        raise ConfigErrors(
            problems
            + [
                Problem(
                    "stages",
                    "must list two stages: SFT, then RL",
                    "stages: [{name: sft, recipe: ...}, {name: rl, recipe: ...}]",
                )
            ],
            source=str(source),
        )
    if not raw.get("af_output_dir"):
        problems.append(Problem("af_output_dir", "is required", "set the folder both stages write under"))
    stages: list[Stage] = []
    for i, entry in enumerate(entries):
        where = f"stages[{i}]"
        if not isinstance(entry, dict) or set(entry) - {"name", "recipe", "overrides"} or "recipe" not in entry:
            problems.append(Problem(where, "must be {name, recipe[, overrides]}", "see docs/sft.md"))
            continue
        name = str(entry.get("name") or ("sft", "rl")[i])
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name) or any(s.name == name for s in stages):
            problems.append(Problem(f"{where}.name", f"{name!r} is not a new identifier", "name the stages sft and rl"))
            continue
        try:
            path = _recipe_path(str(entry["recipe"]), source.parent)
        except UserError as exc:
            problems.append(Problem(f"{where}.recipe", str(exc)))
            continue
        kind = "sft" if is_sft_recipe(path) else "rl"
        if kind != ("sft", "rl")[i]:
            problems.append(
                Problem(
                    f"{where}.recipe",
                    f"{path} is an {kind.upper()} recipe; the stages are SFT, then RL",
                    "put the SFT recipe first and the RL recipe second",
                )
            )
            continue
        stage_overrides = [str(o) for o in entry.get("overrides") or []]
        stages.append(Stage(name, kind, path, stage_overrides))
    if problems:
        raise ConfigErrors(problems, source=str(source))
    out_dir = raw["af_output_dir"]
    for text in overrides:
        if text.startswith("af_output_dir="):  # the one top-level key: the folder both stages write under
            out_dir = text.split("=", 1)[1]
            continue
        head, _, rest = text.partition(".")
        target = [s for s in stages if s.name == head.lstrip("+~")]
        if not target or not rest:
            raise UserError(
                f"override '{text}': a stages recipe's overrides start with a stage name "
                f"({', '.join(s.name for s in stages)}), e.g. {stages[0].name}.optim.lr=1e-4 "
                "(or are af_output_dir=DIR)"
            )
        target[0].overrides.append(text[: len(head) - len(head.lstrip("+~"))] + rest)
    return StagesRecipe(source, Path(os.path.expanduser(str(out_dir))), stages)


def load_stages(name_or_path: str | Path, overrides: Iterable[str] = ()) -> StagesRecipe:
    """Read a stages recipe and validate each stage with its own loader; ConfigErrors lists every problem."""
    from verl_npu.config.loader import load_recipe
    from verl_npu.config.sft import load_sft_recipe

    recipe = read_stages(name_or_path, overrides)
    problems: list[Problem] = []
    sft, rl = recipe.stages
    try:
        rc = load_sft_recipe(sft.recipe, recipe.stage_overrides(sft))
        if "hf_model" not in rc.typed.checkpoint.save_contents:
            problems.append(
                Problem(
                    f"{sft.name}: checkpoint.save_contents",
                    "the RL stage starts from the SFT stage's "
                    "huggingface/ export, which holds weights only with hf_model",
                    "add hf_model to the SFT stage's checkpoint.save_contents",
                )
            )
    except ConfigErrors as exc:
        problems += [Problem(f"{sft.name}: {p.key}", p.message, p.fix) for p in exc.problems]
    try:
        load_recipe(rl.recipe, recipe.stage_overrides(rl, PENDING))
    except ConfigErrors as exc:
        problems += [Problem(f"{rl.name}: {p.key}", p.message, p.fix) for p in exc.problems]
    if problems:
        raise ConfigErrors(problems, source=str(recipe.source))
    return recipe
