"""On-policy distillation against RL alone on the CPU text demo over seeds (issue 38), run by hand.

    python bench/distill_demo.py --seeds 1 2 3 4 5 --out bench/results/distill_gsm8k.md

1. The teacher: `--teacher FOLDER` reuses a trained model; without it the text demo
   (recipes/tiny_gsm8k.yaml, `--teacher-steps` steps, default the recipe's 300) trains one under
   `--work`/teacher (or reuses the one a former call finished there) and its last checkpoint's
   huggingface/ export is the teacher.
2. For each seed S, two runs of recipes/tiny_distill_gsm8k.yaml from the same start: the student
   `tiny://qwen2?seed=S&<the recipe's student sizes>` (smaller than the teacher; `--student` names
   another), data.seed=S (data order and sampling), `--steps` steps: GRPO + forward_kl_topk
   distillation, and GRPO alone (distillation.enabled=false).
3. Every run has OMP_NUM_THREADS=1; `--parallel` runs (default 2) go at once, started in order (a
   seed's distill run, then its rl_only run, then the next seed's), a new one as soon as one ends.
   The report (`--out`): a row per run (critic/score/mean over the first and last 10 steps, the first
   step whose 10-step mean reaches 0.5, wall time, load average before / after), on how many seeds
   distillation ends above GRPO alone, the 10-step means along the runs, the teacher's and the student's
   sizes, the exact command; the curves go to <out stem>_curves.png. `--report-only` writes the report
   from the finished runs in `--work`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from verl_npu.models.tiny import TINY_SCHEME, parse_tiny_uri  # noqa: E402

RECIPE = "tiny_distill_gsm8k"
TEACHER_RECIPE = "tiny_gsm8k"
MODES = {"distill": [], "rl_only": ["distillation.enabled=false"]}
THRESHOLD = 0.5
RUN_FILE = "bench_run.json"


def recipe_student() -> str:
    """The student model path of recipes/tiny_distill_gsm8k.yaml."""
    text = (REPO / "recipes" / f"{RECIPE}.yaml").read_text()
    return yaml.safe_load(text)["backend_config"]["actor_rollout_ref"]["model"]["path"]


def student_uri(base: str, seed: int) -> str:
    """``base`` (a tiny:// path) with its weight seed set to ``seed`` and its sizes kept."""
    name, _, sizes = parse_tiny_uri(base)
    return f"{TINY_SCHEME}{name}?seed={seed}" + "".join(f"&{k}={v}" for k, v in sizes.items())


def verl_npu_run(recipe: str, out: Path, overrides: list[str], log: Path) -> tuple[float, list[float]]:
    """Run ``recipe`` into ``out`` with 1 torch thread; (wall seconds, 1-minute load before / after)."""
    cmd = [
        sys.executable,
        "-m",
        "verl_npu.cli",
        "run",
        recipe,
        f"af_output_dir={out}",
        "trainer.resume_mode=disable",
        *overrides,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    load_before, start = os.getloadavg()[0], time.time()
    with log.open("w") as handle:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    wall, load_after = time.time() - start, os.getloadavg()[0]
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} failed (exit {proc.returncode}); its output: {log}")
    return wall, [load_before, load_after]


def metric_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def train_rows(out: Path) -> list[dict]:
    return [r for r in metric_rows(out) if r.get("critic/score/mean") is not None]


def window_means(scores: list[float], width: int = 10) -> list[float]:
    """The mean of the last ``width`` scores (fewer at the start) at every step."""
    return [
        sum(scores[max(0, i - width + 1) : i + 1]) / len(scores[max(0, i - width + 1) : i + 1])
        for i in range(len(scores))
    ]


def train_teacher(work: Path, steps: int | None, report_only: bool = False) -> tuple[str, dict]:
    """Train the text demo into ``work``/teacher, or reuse the run an earlier call finished there;
    (its last export, what it scored and cost)."""
    out = work / "teacher"
    done = out / "checkpoints" / "latest_checkpointed_iteration.txt"
    recipe = yaml.safe_load((REPO / "recipes" / f"{TEACHER_RECIPE}.yaml").read_text())
    wanted = steps or recipe["backend_config"]["trainer"]["total_training_steps"]
    reused = done.is_file() and int(done.read_text().strip()) == wanted
    if reused or report_only:
        wall, load = None, None
    else:
        out.mkdir(parents=True, exist_ok=True)
        overrides = [] if steps is None else [f"trainer.total_training_steps={steps}", f"trainer.save_freq={steps}"]
        wall, load = verl_npu_run(TEACHER_RECIPE, out, overrides, work / "teacher.log")
    rows = train_rows(out)
    step = int(rows[-1]["training/global_step"])
    folder = out / "checkpoints" / f"global_step_{step}" / "actor" / "huggingface"
    if not folder.is_dir():
        raise SystemExit(
            f"the teacher's run saved no export at {folder}: give --teacher-steps a value the "
            "recipe's save_freq divides, or --teacher FOLDER"
        )
    scores = [r["critic/score/mean"] for r in rows]
    val = [r[k] for r in metric_rows(out) for k in r if k.startswith("val-aux/") and k.endswith("/accuracy/mean@1")]
    return str(folder), {
        "steps": step,
        "last10": sum(scores[-10:]) / 10,
        "val": val[-1] if val else None,
        "wall": wall,
        "load": load,
        "step_total": sum(r["timing_s/step"] for r in rows),
    }


def run_student(work: Path, teacher: str, student: str, steps: int, seed: int, mode: str) -> dict:
    out = work / f"seed{seed}" / mode
    out.mkdir(parents=True, exist_ok=True)
    overrides = [
        f"actor_rollout_ref.model.path={student_uri(student, seed)}",
        f"data.seed={seed}",
        f"distillation.teacher_models.teacher_model.model_path={teacher}",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        *MODES[mode],
    ]
    wall, load = verl_npu_run(RECIPE, out, overrides, work / f"seed{seed}_{mode}.log")
    (out / RUN_FILE).write_text(json.dumps({"wall": wall, "load": load}) + "\n")
    result = read_student(work, seed, mode)
    print(
        f"seed {seed} {mode}: first-10 {result['first10']:.3f} -> last-10 {result['last10']:.3f}, "
        f"0.5 at {result['reached'] or '-'}, {wall:.0f} s",
        flush=True,
    )
    return result


def read_student(work: Path, seed: int, mode: str) -> dict:
    """What a finished student run in ``work`` scored and cost. Its wall time and load come from the
    run.json this script writes after a run; without one (a run of an older version of this script), the
    wall time is the span of the run log's timestamps and the load is unknown."""
    out = work / f"seed{seed}" / mode
    rows = train_rows(out)
    scores = [r["critic/score/mean"] for r in rows]
    means = window_means(scores)
    if (out / RUN_FILE).is_file():
        measured = json.loads((out / RUN_FILE).read_text())
    else:
        stamps = re.findall(r"^(\d\d):(\d\d):(\d\d) INFO", (work / f"seed{seed}_{mode}.log").read_text(), re.M)
        secs = [int(h) * 3600 + int(m) * 60 + int(x) for h, m, x in stamps]
        measured = {"wall": (secs[-1] - secs[0]) % 86400, "load": None}
    return {
        "seed": seed,
        "mode": mode,
        "scores": scores,
        "first10": sum(scores[:10]) / 10,
        "last10": sum(scores[-10:]) / 10,
        "reached": next((i + 1 for i, m in enumerate(means) if i >= 9 and m >= THRESHOLD), None),
        "wall": measured["wall"],
        "load": measured["load"],
        "step_s": sum(r["timing_s/step"] for r in rows) / len(rows),
        "distill_loss": [rows[0].get("distillation/loss"), rows[-1].get("distillation/loss")],
    }


def parameter_count(model: str) -> int:
    from safetensors.torch import load_file

    from verl_npu.models.loading import resolve_model_path

    return sum(t.numel() for t in load_file(Path(resolve_model_path(model)) / "model.safetensors").values())


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted({r["seed"] for r in results})
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for r in results:
        color = colors[seeds.index(r["seed"]) % len(colors)]
        ax.plot(
            range(1, len(r["scores"]) + 1),
            window_means(r["scores"]),
            color=color,
            linestyle="-" if r["mode"] == "distill" else "--",
            label=f"seed {r['seed']} {r['mode']}",
        )
    ax.axhline(THRESHOLD, color="grey", linewidth=0.5)
    ax.set_xlabel("step")
    ax.set_ylabel("critic/score/mean, 10-step mean")
    ax.set_title("distillation (solid) vs GRPO alone (dashed), same start per seed")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(
    results: list[dict],
    teacher: str,
    teacher_info: dict | None,
    student: str,
    steps: int,
    parallel: int,
    wall: float | None,
    curves: Path,
) -> list[str]:
    by_seed: dict[int, dict[str, dict]] = {}
    for r in results:
        by_seed.setdefault(r["seed"], {})[r["mode"]] = r
    wins = [s for s, pair in by_seed.items() if pair["distill"]["last10"] > pair["rl_only"]["last10"]]
    n_teacher, n_student = parameter_count(teacher), parameter_count(student_uri(student, 1))
    command = shlex.join(["python", "bench/distill_demo.py", *(a for a in sys.argv[1:] if a != "--report-only")])
    lines = [
        "# On-policy distillation against GRPO alone over seeds: the CPU text demo (issue 38)",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with",
        "",
        "```bash",
        command,
        "```",
        "",
        f"on {os.cpu_count()} CPU cores shared with other work (the load average before / after each run is in the "
        f"table), Python {sys.version.split()[0]}; every run has 1 torch thread, {parallel} runs at once (started "
        f"in order: seed 1 distill, seed 1 rl_only, seed 2 distill, ...; a run starts when one ends); "
        + (
            f"{wall / 60:.1f} minutes in all."
            if wall is not None
            else "the report was made from the finished runs "
            "(--report-only): the wall time of each run is the span of its log's timestamps (the start-up "
            "before the first one not counted)."
        ),
        "",
        f"Teacher: {_teacher_line(teacher, teacher_info)}, {n_teacher / 1e6:.2f} M parameters. Student: "
        f"`{student_uri(student, 0).replace('seed=0', 'seed=S')}` ({n_student / 1e6:.2f} M parameters, "
        f"{n_student / n_teacher:.0%} of the teacher's; the same tokenizer), data.seed=S, {steps} steps of "
        f"recipes/{RECIPE}.yaml: `distill` is GRPO + forward_kl_topk distillation (top 16, use_task_rewards, "
        "coefficient 1), `rl_only` the same recipe with distillation.enabled=false, from the same weights, data "
        "order and sampling seeds.",
        "",
        f"**Distillation ends above GRPO alone (last-10 mean score) on {len(wins)} of {len(by_seed)} seeds**"
        + (
            f" (not on seed{'s' if len(by_seed) - len(wins) > 1 else ''} "
            f"{', '.join(str(s) for s in by_seed if s not in wins)})."
            if len(wins) < len(by_seed)
            else "."
        ),
        "",
        f"| seed | run | score, first 10 steps | score, last 10 steps | first step with a 10-step mean >= "
        f"{THRESHOLD} | distillation/loss, first / last step | mean step time (s) | wall time (s) | "
        "load before / after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for seed, pair in sorted(by_seed.items()):
        for mode in MODES:
            r = pair[mode]
            loss = "-" if r["distill_loss"][0] is None else f"{r['distill_loss'][0]:.2f} / {r['distill_loss'][1]:.2f}"
            lines.append(
                f"| {seed} | {mode} | {r['first10']:.3f} | {r['last10']:.3f} | {r['reached'] or 'not reached'}"
                f" | {loss} | {r['step_s']:.2f} | {r['wall']:.0f} | {_load(r['load'])} |"
            )
    for mode in MODES:
        runs = [pair[mode] for pair in by_seed.values()]
        reached = [r["reached"] for r in runs if r["reached"]]
        lines.append(
            f"| mean | {mode} | {sum(r['first10'] for r in runs) / len(runs):.3f} | "
            f"{sum(r['last10'] for r in runs) / len(runs):.3f} | reached on {len(reached)} of {len(runs)} | |"
            f" {sum(r['step_s'] for r in runs) / len(runs):.2f} | {sum(r['wall'] for r in runs) / len(runs):.0f}"
            " | |"
        )
    lines += ["", f"10-step mean score along the runs (d: distill, r: rl_only; curves: {curves.name}):", "", "```"]
    ordered = [by_seed[s][m] for s in sorted(by_seed) for m in MODES]
    lines.append("steps    " + "".join(f"{'s%d%s' % (r['seed'], r['mode'][0]):>7}" for r in ordered))
    for end in range(10, steps + 1, 10):
        lines.append(
            f"{end - 9:>3}-{end:<4} " + "".join(f"{window_means(r['scores'])[end - 1]:>7.3f}" for r in ordered)
        )
    lines += [
        "```",
        "",
        "Wall times are indicative only: the machine is shared and busy. A distillation step "
        "costs more than a GRPO step (the teacher's forward and the student's full logits for the top-k loss).",
        "",
    ]
    return lines


def _teacher_line(teacher: str, info: dict | None) -> str:
    if info is None:
        return f"`{teacher}` (given)"
    val = "" if info["val"] is None else f", greedy validation accuracy {info['val']:.2f}"
    how = (
        f"trained by this command in {info['wall']:.0f} s (load {info['load'][0]:.1f} / {info['load'][1]:.1f})"
        if info["wall"] is not None
        else f"reused: trained by an earlier call into the same --work, its steps took {info['step_total']:.0f} s"
    )
    return (
        f"the text demo (`bash launch/run_recipe.sh {TEACHER_RECIPE}`, {info['steps']} steps, {how}: last-10 mean "
        f"score {info['last10']:.3f}{val})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", help="a trained teacher's model folder; default: train the text demo first")
    parser.add_argument("--teacher-steps", type=int, help="steps of the teacher's training (default: the recipe's)")
    parser.add_argument(
        "--student",
        default=None,
        help="the student's tiny:// path; its seed is replaced per seed (default: the recipe's)",
    )
    parser.add_argument("--steps", type=int, default=150, help="training steps of each student run (default 150)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="student seeds")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once, 1 torch thread each (default 2)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/verl_npu_distill_demo"), help="run folders")
    parser.add_argument("--out", type=Path, default=None, help="Markdown report to write (default: print it)")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="write the report from the runs of --seeds already finished in --work, running nothing",
    )
    args = parser.parse_args()
    student = args.student or recipe_student()
    start = time.time()
    args.work.mkdir(parents=True, exist_ok=True)
    teacher_info = None
    teacher = args.teacher
    if teacher is None:
        teacher, teacher_info = train_teacher(args.work, args.teacher_steps, args.report_only)
        print(f"teacher: {teacher} (last-10 {teacher_info['last10']:.3f})", flush=True)
    teacher = str(Path(teacher).resolve())
    jobs = [(seed, mode) for seed in args.seeds for mode in MODES]
    if args.report_only:
        finished = [job for job in jobs if _finished(args.work / f"seed{job[0]}" / job[1], args.steps)]
        results = [
            read_student(args.work, *job)
            for job in finished
            if (job[0], "distill") in finished and (job[0], "rl_only") in finished
        ]
        wall = None
    else:
        with ThreadPoolExecutor(max(1, args.parallel)) as pool:
            results = list(pool.map(lambda job: run_student(args.work, teacher, student, args.steps, *job), jobs))
        wall = time.time() - start
    if not results:
        raise SystemExit(f"no finished pair of runs in {args.work}")
    out = args.out or args.work / "distill_gsm8k.md"
    curves = out.with_name(f"{out.stem}_curves.png")
    plot(results, curves)
    text = "\n".join(report(results, teacher, teacher_info, student, args.steps, args.parallel, wall, curves))
    out.write_text(text)
    print(text)


def _finished(out: Path, steps: int) -> bool:
    return (out / "metrics.jsonl").is_file() and len(train_rows(out)) >= steps


def _load(load: list[float] | None) -> str:
    return "-" if load is None else f"{load[0]:.1f} / {load[1]:.1f}"


if __name__ == "__main__":
    main()
