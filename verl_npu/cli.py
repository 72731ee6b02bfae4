"""`verl-npu`: list, copy, validate, show, explain and plan recipes, run one, check a machine, serve search.

    verl-npu list
    verl-npu cp NAME DEST
    verl-npu validate NAME|PATH [key=value ...] [--check-paths] [--strict]
    verl-npu show NAME|PATH [key=value ...]
    verl-npu explain KEY | SECTION | --all
    verl-npu plan NAME|PATH [key=value ...] [--device-memory 64GiB|910B|H100] [--json]
    verl-npu run NAME|PATH [key=value ...] [--demo-data] [--force] [--device-memory SIZE]
    verl-npu sft NAME|PATH [key=value ...] [--demo-data] [--validate-only]   (docs/sft.md)
    verl-npu doctor [--out DIR] [--device cpu|cuda|npu] [--rollout auto|hf|vllm] [--skip-train]
    verl-npu retrieval-server --corpus FILE.jsonl [--host H] [--port P] [--topk K] [--verbose]
    verl-npu import trinity|roll CONFIG.yaml [-o RECIPE.yaml]

A user's mistake (`UserError`) is printed without a traceback and exits 1. This module imports
no torch/transformers/ray at import time; only `run` loads them (through the trainer).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from verl_npu.errors import ConfigErrors, UserError, run_command

if TYPE_CHECKING:
    from verl_npu.config import RecipeConfig


def _say(text: str = "") -> None:
    print(text, flush=True)


# ------------------------------------------------------------------ list / cp
def cmd_list(args: argparse.Namespace) -> int:
    from verl_npu.config.recipes import list_recipes, recipes_dir

    recipes = list_recipes()
    if not recipes:
        _say(f"no recipes found in {recipes_dir()}")
        return 0
    import textwrap

    width = max(len(r.name) for r in recipes)
    for r in recipes:  # the whole first sentence, wrapped under itself
        _say(textwrap.fill(r.summary, 110, initial_indent=f"{r.name:<{width}}  ", subsequent_indent=" " * (width + 2)))
    return 0


def cmd_cp(args: argparse.Namespace) -> int:
    from verl_npu.config.recipes import copy_recipe

    target, fields = copy_recipe(args.name, args.dest)
    _say(f"copied to {target}")
    if fields:
        _say("edit these fields next (they hold EDIT_ME placeholders):")
        for key in fields:
            _say(f"  {key}")
    _say(f"then check it with: verl-npu validate {target}")
    return 0


# ------------------------------------------------------------------ validate / show
def _parquet_rows(files) -> int | None:
    """Total rows of the parquet files, or None when any is missing or unreadable."""
    items = files if isinstance(files, list) else [files]
    total = 0
    try:
        import pyarrow.parquet as pq

        for f in items:
            path = Path(os.path.expanduser(str(f)))
            if not path.is_file():
                return None
            total += pq.ParquetFile(path).metadata.num_rows
    except Exception:
        return None
    return total


def summary_lines(rc: RecipeConfig) -> list[str]:
    """The validate summary: sizes per step and per update, accumulation, steps, derived values."""
    b = rc.typed
    actor, n, world = b.actor_rollout_ref.actor, int(b.actor_rollout_ref.rollout.n), rc.world_size
    tbs, mini = int(b.data.train_batch_size), int(actor.ppo_mini_batch_size)
    per_device = mini * n // world
    lines = [
        f"devices: {world} (trainer.nnodes {b.trainer.nnodes} x n_gpus_per_node {b.trainer.n_gpus_per_node})",
        f"responses per step: {tbs * n} (train_batch_size {tbs} x rollout.n {n})",
        f"optimizer updates per step: {math.ceil(tbs / mini) * int(actor.ppo_epochs)} "
        f"(ceil({tbs} / ppo_mini_batch_size {mini}) x ppo_epochs {actor.ppo_epochs})",
        f"responses per update: {mini * n} ({per_device} per device)",
    ]
    from verl_npu.registry import ROLLOUT_ENGINES

    rollout = b.actor_rollout_ref.rollout
    engine = ROLLOUT_ENGINES.spec(str(rollout.name))
    group = engine.group_size(b)
    if engine.tensor_parallel:
        lines.append(
            f"rollout: {world // group} {rollout.name} engine(s) of tensor_model_parallel_size {group}, "
            f"{tbs // max(world // group, 1)} prompts each per step"
        )
    else:
        lines.append(f"rollout: {rollout.name} on the actor's module ({world // group} prompt shard(s))")
    if actor.use_dynamic_bsz:
        lines.append(
            f"gradient accumulation: dynamic (micro batches of <= {actor.ppo_max_token_len_per_gpu} tokens per device)"
        )
    else:
        micro = int(actor.ppo_micro_batch_size_per_gpu)
        lines.append(
            f"gradient-accumulation steps per update: {per_device // micro} "
            f"({per_device} / ppo_micro_batch_size_per_gpu {micro})"
        )
    rows = _parquet_rows(b.data.train_files)
    if rows is None:
        lines.append("steps per epoch: unknown until the training files exist (rows // train_batch_size)")
    else:
        steps = rows // tbs
        note = " at most (filter_overlong_prompts may drop rows)" if b.data.filter_overlong_prompts else ""
        lines.append(f"steps per epoch: {steps}{note} ({rows} rows // {tbs}); total_epochs {b.trainer.total_epochs}")
    if rc.derived:
        lines.append("derived:")
        for d in rc.derived:
            lines.append(f"  {d.key.removeprefix('backend_config.')} = {d.value}  ({d.reason})")
    return lines


def cmd_validate(args: argparse.Namespace) -> int:
    from verl_npu.config import load_recipe

    if _is_sft(args.recipe):
        return cmd_sft(args, validate_only=True)
    if _is_stages(args.recipe):
        return cmd_stages(args, validate_only=True)
    rc = load_recipe(args.recipe, args.overrides, check_paths=args.check_paths)
    if args.strict and rc.ignored:
        raise UserError(
            "--strict: keys added with + that neither verl nor verl-npu reads: "
            + ", ".join(k.removeprefix("backend_config.") for k in rc.ignored)
            + " (remove them, or validate without --strict to ignore them)"
        )
    _warn(rc)
    _say(f"{rc.source}: valid")
    for line in summary_lines(rc):
        _say(f"  {line}")
    if rc.noop:
        _say("  verl keys with no effect here:")
        for d in rc.noop:
            _say(f"    {d.key.removeprefix('backend_config.')}={d.value}  ({d.reason})")
    from verl_npu.config.paths import machine_problems

    problems, notes = machine_problems(rc)
    for p in problems:
        _say(
            f"  warning: this machine cannot run it as it is: {p.key.removeprefix('backend_config.')}: "
            f"{p.message}. Fix: {p.fix}"
        )
    for note in notes:
        _say(f"  note: {note}")
    _say(f"  {_plan_summary(rc)}")
    if not args.check_paths:
        _say("  (files were not checked; add --check-paths to check data and model paths)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from verl_npu.config import load_recipe

    rc = load_recipe(args.recipe, args.overrides)
    _warn(rc)
    sys.stdout.write(rc.to_yaml())
    return 0


def _warn(rc: RecipeConfig) -> None:
    for w in rc.warnings:
        print(f"warning: {w}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ explain
def cmd_explain(args: argparse.Namespace) -> int:
    from verl_npu.config import SCHEMA, describe_key, expand_key, find_key
    from verl_npu.config.reference import render_reference

    if args.all:
        sys.stdout.write(render_reference())
        return 0
    if not args.key:
        raise UserError("explain needs a KEY (e.g. data.max_prompt_length) or --all")
    key = find_key(args.key)
    if key is not None:
        _say(describe_key(key))
        return 0
    prefix = expand_key(args.key).rstrip(".") + "."
    under = [k for k in SCHEMA.values() if k.path.startswith(prefix)]
    if under:
        width = max(len(k.short) for k in under)
        for k in under:
            _say(f"{k.short:<{width}}  {k.doc}")
        return 0
    from verl_npu.config.compat import DEPRECATED_KIND, NOOP, REFUSED, SUPPORTED, status
    from verl_npu.config.loader import _suggest
    from verl_npu.config.schema_deprecated import DEPRECATED_MAPPED

    full = expand_key(args.key)
    st = status(full)
    if st.kind in (SUPPORTED, NOOP):  # a verl alias or a verl key that changes nothing here
        _say(f"{full}\n  verl key, {st.kind}: {st.text}")
        return 0
    if st.kind == DEPRECATED_KIND and full in DEPRECATED_MAPPED:
        _say(f"{full}\n  verl's deprecated key, {st.text}")
        return 0
    if st.kind == DEPRECATED_KIND:
        raise UserError(f"{args.key} is a deprecated verl key: {st.text}")
    if st.kind == REFUSED:
        _say(f"{full}\n  verl key, refused: {st.text}")
        return 0
    raise UserError(f"unknown key {args.key} (not a verl-npu or verl key); {_suggest(full)}")


# ------------------------------------------------------------------ plan
def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _plan_of(rc, device_memory: str | None = None):
    """(plan or None, why not) of a loaded RL recipe (`RecipeConfig`) or SFT recipe (`SFTRecipe`)."""
    from verl_npu.config.sft import SFTRecipe
    from verl_npu.memory.budget import plan_for, plan_for_sft

    return plan_for_sft(rc, device_memory) if isinstance(rc, SFTRecipe) else plan_for(rc, device_memory)


def _plan_summary(rc, device_memory: str | None = None) -> str:
    """validate's and run's one line about memory (never an error: a plan that cannot be made says why)."""
    from verl_npu.memory.budget import summary_line

    try:
        plan, why = _plan_of(rc, device_memory)
    except (KeyError, ValueError, TypeError, AttributeError, ArithmeticError, OSError, UserError) as exc:
        return f"memory plan: not made ({type(exc).__name__}: {exc})"  # a plan never breaks validate or run
    return summary_line(plan) if plan is not None else f"memory plan: {why}"


def _refuse_if_it_will_not_fit(rc, force: bool, device_memory: str | None = None) -> None:
    """`run` (RL or SFT): stop before any worker starts when the plan says the peak will not fit (unless --force).
    Only where the device's memory is known (the CPU, or --device-memory): for an accelerator whose card
    is assumed, a warning (a wrong refusal would stop a run that fits a larger card)."""
    try:
        plan, _ = _plan_of(rc, device_memory)
    except (KeyError, ValueError, TypeError, AttributeError, ArithmeticError, OSError, UserError):
        return
    if plan is None or plan.verdict != "will not fit":
        return
    peak = plan.peak
    why = (
        plan.problems[0]
        if plan.problems
        else (
            f"the {peak.name} needs {_size(peak.total)} of {_size(plan.device_bytes)} ({plan.device_name}); largest part: "
            + max(((p.name, p.bytes) for p in peak.parts), key=lambda x: x[1])[0]
        )
    )
    knobs = "".join(f"\n  {override}   (saves {_size(saved)})" for override, saved in plan.knobs[:6])
    if force or plan.device_assumed:
        reason = "--force" if force else "the card is assumed; run --device-memory SIZE to be stopped instead"
        _say(f"[verl-npu] warning: memory plan: will not fit ({why}); running anyway ({reason})")
        return
    raise UserError(
        f"memory plan: will not fit: {why}. `verl-npu plan {rc.source}` with the same overrides shows every phase; "
        f"knobs that lower the peak:{knobs or ' none found'}\n"
        "Fix: apply knobs until `verl-npu plan` says it fits (--device-memory if the device differs), "
        "or pass --force to run anyway"
    )


def _placeholders_for_plan(recipe: str, overrides: list[str]) -> list[str]:
    """Overrides that give each EDIT_ME field of the recipe file which the user did not set the example
    path its placeholder holds ("EDIT_ME: /path/to/Qwen2.5-VL-7B-Instruct" -> /path/to/Qwen2.5-VL-7B-Instruct):
    a plan needs only the model's shape, which a placeholder naming a known model gives."""
    from verl_npu.config.recipes import find_recipe, placeholders
    from verl_npu.config.tree import flatten, read_yaml_file

    try:
        path = find_recipe(recipe)
        fields = placeholders(path)
        if not _is_sft(recipe):  # a key inside a free-form dict of the RL schema is no override: not filled
            flat: dict = {}
            flatten(read_yaml_file(path), "", flat)
            fields = {k: v for k, v in fields.items() if k in flat}
    except UserError:
        return []  # load_recipe says what is wrong with it
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    fills = []
    for key, value in fields.items():
        if key in given or key.removeprefix("backend_config.") in given:
            continue
        example = value.split(":", 1)[1].strip() if ":" in value else ""
        fills.append(f"{key}={example or 'unset'}")
    return fills


def _plan_recipe(recipe: str, overrides: list[str], device_memory: str | None, quiet_stdout: bool = False):
    """(the loaded recipe, its plan) of an RL or SFT recipe, EDIT_ME fields the user left taken as their
    placeholders' examples; `quiet_stdout` (--json): what it says goes to stderr, stdout holds the JSON alone."""
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if quiet_stdout else _say
    from verl_npu.config import load_recipe
    from verl_npu.memory.budget import model_numbers

    filled = _placeholders_for_plan(recipe, overrides)
    if _is_sft(recipe):
        from verl_npu.config.sft import load_sft_recipe

        rc = load_sft_recipe(recipe, [*filled, *overrides])
        for warning in rc.warnings:
            say(f"[verl-npu] warning: {warning}")
        model_key, path = "model.path", rc.typed.model.path
    else:
        rc = load_recipe(recipe, [*filled, *overrides])
        _warn(rc)
        model_key, path = "actor_rollout_ref.model.path", rc.typed.actor_rollout_ref.model.path
    if filled:
        say(
            "[verl-npu] planning with the EDIT_ME fields still unfilled, each taken as its placeholder's example "
            "(the plan reads no data, writes nothing, and takes the model's shape from its name): "
            + ", ".join(f.split("=", 1)[0] for f in filled)
        )
    if isinstance(path, str) and path.startswith("tiny://") and model_numbers(path) is None:
        from verl_npu.models.tiny import materialize  # builds the tiny model once (seconds), as a run would

        materialize(path)
    plan, why = _plan_of(rc, device_memory)
    if plan is None:
        raise UserError(
            f"cannot plan {rc.source}: {why}; set {model_key} to a folder with a "
            "config.json (or pre-download the hub id into the Hugging Face cache)"
        )
    return rc, plan


def _print_plan(source, plan) -> None:
    _say(f"{source}: memory plan per device on {plan.device_name}")
    for phase in plan.phases:
        mark = "  <- peak" if phase is plan.peak else ""
        _say(f"  {phase.name:<16} {_size(phase.total):>12}{mark}{'  (' + phase.note + ')' if phase.note else ''}")
        for part in phase.parts:
            _say(f"      {part.name:<30} {_size(part.bytes):>12}  {part.formula}")
    host = sum(p.bytes for p in plan.host)
    _say(f"  host, per node: {_size(host)}")
    for part in plan.host:
        _say(f"      {part.name:<30} {_size(part.bytes):>12}  {part.formula}")
    for note in plan.notes:
        _say(f"  note: {note}")
    peak = plan.peak
    share = f" ({100 * peak.total / plan.device_bytes:.0f}%)" if plan.device_bytes else ""
    _say(f"peak: {peak.name}, {_size(peak.total)} of {_size(plan.device_bytes)}{share}: {plan.verdict}")
    for problem in plan.problems:
        _say(f"  will not fit: {problem}")
    if plan.verdict == "will not fit" and not plan.problems:
        worst = max(peak.parts, key=lambda p: p.bytes)
        _say(f"  over by {_size(peak.total - plan.device_bytes)}; largest part: {worst.name} ({_size(worst.bytes)})")
    if plan.knobs and plan.verdict != "fits":
        _say("knobs that lower the peak (each alone; memory saved at the peak):")
        for override, saved in plan.knobs:
            _say(f"  {override:<72} -{_size(saved)}")


def cmd_plan(args: argparse.Namespace) -> int:
    """The memory plan of an RL or SFT recipe; of a stages recipe, each stage's in turn (each its own run)."""
    import json

    if _is_stages(args.recipe):
        from verl_npu.config.stages import read_stages

        filled = _placeholders_for_plan(args.recipe, args.overrides)  # the shared output folder's placeholder
        stages = read_stages(args.recipe, [*filled, *args.overrides])
        sft, rl = stages.stages
        sft_rc, sft_plan = _plan_recipe(str(sft.recipe), stages.stage_overrides(sft), args.device_memory, args.json)
        # the RL stage trains the SFT stage's export: the SFT model's shapes
        rl_overrides = stages.stage_overrides(rl, model_path=str(sft_rc.typed.model.path))
        plans = [
            (sft, sft_rc, sft_plan),
            (rl, *_plan_recipe(str(rl.recipe), rl_overrides, args.device_memory, args.json)),
        ]
        if args.json:
            body = {"stages": [{"name": s.name, "recipe": str(rc.source), **p.as_dict()} for s, rc, p in plans]}
            sys.stdout.write(json.dumps(body, indent=2) + "\n")
            return 0
        for stage, rc, plan in plans:
            _say(f"stage {stage.name} ({stage.kind}), planned alone: its run holds the devices by itself")
            _print_plan(rc.source, plan)
        return 0
    rc, plan = _plan_recipe(args.recipe, args.overrides, args.device_memory, args.json)
    if args.json:
        sys.stdout.write(json.dumps(plan.as_dict(), indent=2) + "\n")
        return 0
    _print_plan(rc.source, plan)
    return 0


# ------------------------------------------------------------------ run
def cmd_run(args: argparse.Namespace) -> int:
    from verl_npu.config import check_paths, load_recipe
    from verl_npu.config.paths import machine_problems
    from verl_npu.demo import prepare_assets
    from verl_npu.device import configured_device, detect_device
    from verl_npu.trainer.entry import run_training

    if _is_sft(args.recipe):
        return cmd_sft(args)
    if _is_stages(args.recipe):
        return cmd_stages(args)
    rc = load_recipe(args.recipe, args.overrides)
    planned = configured_device(rc.backend.trainer.device)
    if planned is not None:  # before anything imports torch: its OpenMP runtime reads them once
        planned.before_torch()
    _warn(rc)
    _say(f"[verl-npu] {rc.source}: configuration valid")
    for line in summary_lines(rc):
        _say(f"  {line}")
    _say(
        f"[verl-npu] output folder: {os.path.abspath(os.path.expanduser(str(rc.cfg.af_output_dir)))} "
        f"(relative paths start at the current folder, {os.getcwd()})"
    )
    problems, _ = machine_problems(rc)  # a missing engine package or unreachable model: before anything is made
    if not problems:
        for line in prepare_assets(rc, demo_data=args.demo_data) or []:
            _say(f"[verl-npu] prepared {line}")
    known = len(rc.derived)
    # check_paths resolves hub ids, in rc.cfg; a model key machine_problems refused is not looked up again
    problems += check_paths(rc, skip={p.key for p in problems})
    if problems:
        raise ConfigErrors(problems, source=str(rc.source))
    for d in rc.derived[known:]:
        _say(f"[verl-npu] {d.key.removeprefix('backend_config.')} = {d.value}  ({d.reason})")
    _say("[verl-npu] data and model paths found")
    _say(f"[verl-npu] {_plan_summary(rc, getattr(args, 'device_memory', None))}")
    _refuse_if_it_will_not_fit(rc, getattr(args, "force", False), getattr(args, "device_memory", None))
    info = detect_device(rc.typed.trainer.device)
    _say(f"[verl-npu] device: {info.kind} (trainer.device={rc.typed.trainer.device})")
    _say("[verl-npu] starting training")
    from verl_npu.trainer.preempt import Preempted, handle_signals

    # SIGTERM (a scheduler preempting the job): finish the step, save, exit 143; Ctrl-C: stop now
    with handle_signals():
        try:
            result = run_training(rc, device=info)  # the run's one detection, handed to every worker
        except Preempted as stop:  # before training started (the trainer reports the later ones)
            print(f"error: {stop}", file=sys.stderr, flush=True)
            return stop.exit_code
    return result if isinstance(result, int) else 0


# ------------------------------------------------------------------ sft
def _is_sft(recipe: str) -> bool:
    from verl_npu.config.sft import is_sft_recipe

    return is_sft_recipe(recipe)


def cmd_sft(args: argparse.Namespace, validate_only: bool = False) -> int:
    """Validate an SFT recipe (verl 0.9.1's SFT keys), make a demo recipe's data, then train (docs/sft.md)."""
    from verl_npu.config.sft import load_sft_recipe

    rc = load_sft_recipe(args.recipe, args.overrides)
    for warning in rc.warnings:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    _say(f"[verl-npu] {rc.source}: SFT configuration valid ({rc.world_size} worker(s))")
    for key, value, reason in rc.derived:
        _say(f"  {key} = {value}  ({reason})")
    device_memory = getattr(args, "device_memory", None)
    if validate_only or getattr(args, "validate_only", False):
        _say(f"  {_plan_summary(rc, device_memory)}")
        return 0
    from verl_npu.demo import prepare_sft_assets
    from verl_npu.sft.loop import run_sft

    for line in prepare_sft_assets(rc, demo_data=getattr(args, "demo_data", False)):
        _say(f"[verl-npu] prepared {line}")
    rc = load_sft_recipe(args.recipe, args.overrides, check_paths=True)
    _say(f"[verl-npu] {_plan_summary(rc, device_memory)}")
    _refuse_if_it_will_not_fit(rc, getattr(args, "force", False), device_memory)
    _say("[verl-npu] starting SFT")
    return run_sft(rc)


def _is_stages(recipe: str) -> bool:
    from verl_npu.config.recipes import find_recipe
    from verl_npu.config.stages import is_stages_tree
    from verl_npu.config.tree import read_yaml_file

    return is_stages_tree(read_yaml_file(find_recipe(recipe)))


def cmd_stages(args: argparse.Namespace, validate_only: bool = False) -> int:
    """A recipe naming an SFT stage then an RL stage (docs/sft.md): both validated, then run in turn."""
    from verl_npu.config.stages import load_stages
    from verl_npu.stages import run_stages

    recipe = load_stages(args.recipe, args.overrides)
    _say(
        f"[verl-npu] {recipe.source}: stages valid: "
        + ", then ".join(f"{s.name} ({s.kind}: {s.recipe})" for s in recipe.stages)
    )
    if validate_only:
        return 0

    def stage(fn):
        return lambda recipe_path, overrides: fn(
            argparse.Namespace(**{**vars(args), "recipe": recipe_path, "overrides": overrides})
        )

    return run_stages(recipe, stage(cmd_sft), stage(cmd_run), _say)


# ------------------------------------------------------------------ doctor
def cmd_doctor(args: argparse.Namespace) -> int:
    from verl_npu.doctor import run_doctor

    return run_doctor(args.out, device=args.device, rollout=args.rollout, skip_train=args.skip_train, echo=_say)


# ------------------------------------------------------------------ retrieval-server
def cmd_retrieval_server(args: argparse.Namespace) -> int:
    from verl_npu.tools.retrieval_server import serve

    return serve(args)


# ------------------------------------------------------------------ import
def cmd_import(args: argparse.Namespace) -> int:
    from verl_npu.importers.cli import run_import

    return run_import(args.system, args.config, args.output, _say)


# ------------------------------------------------------------------ main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl-npu", description="RL post-training recipes for NPU, CUDA and CPU.")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = sub.add_parser("list", help="list shipped recipes")
    p.set_defaults(fn=cmd_list)
    p = sub.add_parser("cp", help="copy a recipe for editing (never overwrites)")
    p.add_argument("name")
    p.add_argument("dest")
    p.set_defaults(fn=cmd_cp)
    for verb, fn, text in (
        ("validate", cmd_validate, "check a recipe and summarize it"),
        ("show", cmd_show, "print the resolved recipe with derived values marked"),
        ("run", cmd_run, "validate, check paths, then train"),
    ):
        p = sub.add_parser(verb, help=text)
        p.add_argument("recipe", help="shipped recipe name or path to a .yaml file")
        p.add_argument("overrides", nargs="*", help="key=value (full or verl short form)")
        if verb == "validate":
            p.add_argument("--check-paths", action="store_true", help="also check data/model paths exist")
            p.add_argument(
                "--strict",
                action="store_true",
                help="refuse keys added with + that nothing reads (otherwise ignored with a warning)",
            )
        if verb == "run":
            p.add_argument(
                "--demo-data",
                action="store_true",
                help="with a tiny:// model, write synthetic demo data to the missing data files "
                "(never replaces a file); without it only the demo recipes' own data paths get it",
            )
            p.add_argument(
                "--force",
                action="store_true",
                help="run even when the memory plan says it will not fit (verl-npu plan)",
            )
            p.add_argument(
                "--device-memory",
                help="the memory of one device, for the memory plan (64GiB, 910B, "
                "H100, ...): with it, a plan that will not fit stops the run on an accelerator too",
            )
        p.set_defaults(fn=fn)
    p = sub.add_parser("sft", help="supervised fine-tuning with verl 0.9.1's SFT keys (docs/sft.md)")
    p.add_argument("recipe", help="shipped SFT recipe name or path to a .yaml file")
    p.add_argument("overrides", nargs="*", help="key=value (data.*, model.*, engine.*, optim.*, trainer.*, ...)")
    p.add_argument(
        "--demo-data",
        action="store_true",
        help="with a tiny:// model, write synthetic tool-call "
        "transcripts to the missing data files (never replaces a file)",
    )
    p.add_argument("--validate-only", action="store_true", help="check the recipe and stop")
    p.set_defaults(fn=cmd_sft)
    p = sub.add_parser("plan", help="per-device memory of each phase, the peak, and the knobs that lower it")
    p.add_argument("recipe", help="shipped recipe name or path to a .yaml file")
    p.add_argument("overrides", nargs="*", help="key=value (full or verl short form)")
    p.add_argument(
        "--device-memory",
        help="plan for this device: an amount (64GiB, 80GB) or a card "
        "(910B, A100-40, A100-80, H100, H200); default: the recipe's device",
    )
    p.add_argument("--json", action="store_true", help="the plan as JSON (docs/memory.md)")
    p.set_defaults(fn=cmd_plan)
    p = sub.add_parser("explain", help="meaning, type, default and rules of a key")
    p.add_argument("key", nargs="?")
    p.add_argument("--all", action="store_true", help="print the whole reference (markdown)")
    p.set_defaults(fn=cmd_explain)
    p = sub.add_parser("doctor", help="check this machine before a real run (device, versions, all-reduce, 2 steps)")
    p.add_argument(
        "--out", default="doctor_report", help="folder for doctor.json and doctor.txt (default ./doctor_report)"
    )
    p.add_argument("--device", choices=("cpu", "cuda", "npu"), help="device to check (default: the one detected)")
    p.add_argument(
        "--rollout",
        choices=("auto", "hf", "vllm"),
        default="auto",
        help="rollout of the training check (auto: vllm when it works on this device, else hf)",
    )
    p.add_argument("--skip-train", action="store_true", help="skip the 2-step training check")
    p.set_defaults(fn=cmd_doctor)
    from verl_npu.tools.retrieval_server import add_arguments

    p = sub.add_parser(
        "retrieval-server",
        help="serve BM25 search over a jsonl corpus for the search tool "
        "(Search-R1's retrieval protocol; docs/agents.md)",
    )
    add_arguments(p)
    p.set_defaults(fn=cmd_retrieval_server)
    p = sub.add_parser("import", help="write a verl-npu recipe from a Trinity-RFT or ROLL config (docs/import.md)")
    p.add_argument("system", choices=("trinity", "roll"))
    p.add_argument("config", help="the config YAML to import")
    p.add_argument("-o", "--output", help="recipe to write (default: <config>.verl_npu.yaml beside it)")
    p.set_defaults(fn=cmd_import)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `verl-npu` console script; returns the exit code."""
    parser = build_parser()
    # flags may come before, between or after the key=value overrides (`run R --demo-data k=v`):
    # argparse ends a positional list at the first flag, so the overrides after it come back here
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    # `verl-npu show x | head` ends quietly, like any Unix tool. Not for `run`: with the default action
    # a write to any closed socket (a probe that connects to the run's torch.distributed store port
    # and hangs up) kills the training silently (exit -13) instead of raising BrokenPipeError
    # (nor `sft`, which trains the same way). The previous action is put back afterwards: a caller that
    # runs main() in its own process (a test, a notebook) keeps its own.
    if not hasattr(signal, "SIGPIPE") or args.verb in ("run", "sft"):
        return run_command(lambda: args.fn(args))
    previous = signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        return run_command(lambda: args.fn(args))
    finally:
        signal.signal(signal.SIGPIPE, previous)


if __name__ == "__main__":
    sys.exit(main())
