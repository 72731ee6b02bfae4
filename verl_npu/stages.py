"""Run a stages recipe (`verl_npu.config.stages`): the SFT stage, then the RL stage from its last checkpoint,
resuming in the right stage.

`<af_output_dir>/stages.json` records each finished stage (for SFT, the checkpoint folder the RL stage starts
from), written atomically once the stage has returned 0. Run again, the command skips a finished SFT stage and
goes on with RL, which resumes from its own latest checkpoint (`trainer.resume_mode=auto`); an SFT stage that
was interrupted resumes from its own latest checkpoint the same way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from verl_npu.errors import UserError

STATE_FILE = "stages.json"


def _state(out_dir: Path) -> dict:
    path = out_dir / STATE_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        raise UserError(f"{path} is damaged: delete it to run every stage again (their checkpoints resume)") from None


def _write_state(out_dir: Path, state: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{STATE_FILE}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(state, indent=2), encoding="utf-8")
    os.replace(tmp, out_dir / STATE_FILE)


def prepare_rl_demo_data(recipe, say: Callable[[str], None]) -> None:
    """Make a demo RL stage's synthetic data before the SFT stage runs, as `verl-npu run` makes it for that recipe
    alone: the rule (verl_npu.demo) looks at the recipe's tiny:// model, but the stage itself starts from the SFT
    checkpoint. Nothing is made when the stage's own model is not a tiny:// model or its files exist."""
    from verl_npu.config import load_recipe
    from verl_npu.demo import prepare_assets

    rl = recipe.stages[1]
    for line in prepare_assets(load_recipe(rl.recipe, recipe.stage_overrides(rl))) or []:
        say(f"[verl-npu] stage {rl.name}: prepared {line}")


def run_stages(
    recipe,
    run_sft: Callable[[str, list[str]], int],
    run_rl: Callable[[str, list[str]], int],
    say: Callable[[str], None],
) -> int:
    """Run `recipe`'s stages (a `StagesRecipe`); `run_sft(recipe, overrides)` / `run_rl(recipe, overrides)` run one
    stage as `verl-npu sft` / `run` would and return its exit code. Returns the first non-zero code, else 0."""
    from verl_npu.config.sft import load_sft_recipe
    from verl_npu.trainer.checkpoint import CheckpointManager

    sft, rl = recipe.stages
    state = _state(recipe.out_dir)
    prepare_rl_demo_data(recipe, say)
    done = state.get(sft.name)
    if done and Path(done["checkpoint"]).is_dir():
        say(f"[verl-npu] stage {sft.name}: finished before ({done['checkpoint']}); going on with {rl.name}")
    else:
        say(f"[verl-npu] stage {sft.name}: SFT with {sft.recipe}")
        code = run_sft(str(sft.recipe), recipe.stage_overrides(sft))
        if code:
            return code
        rc = load_sft_recipe(sft.recipe, recipe.stage_overrides(sft))
        latest = CheckpointManager(rc.typed.trainer.default_local_dir).latest()
        if latest is None:
            raise UserError(f"stage {sft.name} finished without a checkpoint in {rc.typed.trainer.default_local_dir}")
        done = {"checkpoint": str(latest.resolve())}
        _write_state(recipe.out_dir, {**state, sft.name: done})
    say(f"[verl-npu] stage {rl.name}: RL with {rl.recipe} from {done['checkpoint']}")
    code = run_rl(str(rl.recipe), recipe.stage_overrides(rl, done["checkpoint"]))
    if code == 0:
        _write_state(recipe.out_dir, {**_state(recipe.out_dir), rl.name: {"finished": True}})
    return code
