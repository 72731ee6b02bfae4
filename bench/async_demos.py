"""Benchmark: the CPU demos one-step-off (`trainer.v1.trainer_mode=separate_async`, k=1) against their sync runs.

For each demo (`tiny_gsm8k`, the text demo, and `tiny_geo3k`, the picture demo) and each seed of
bench/demo_learning.py (data.seed=S and the model's initial weights tiny://<model>?seed=S; seed 0 is the README's
command), two runs of `bash launch/run_recipe.sh RECIPE`, from fresh output folders, one after the other:

- sync: the recipe as shipped, `OMP_NUM_THREADS=2` (both cores for the one process, which generates then trains);
- one-step-off: the same plus `trainer.v1.trainer_mode=separate_async`, one rollout process,
  `parameter_sync_step` = data.train_batch_size / ppo_mini_batch_size, `max_off_policy_threshold=1`,
  `rollout_correction.rollout_is=token`; `OMP_NUM_THREADS=1`, and with `--pin` (the default) the trainer's threads
  pinned to core 0 and the rollout process's to core 1 once it has started (its pid is in the run's log): the
  rollout on one core, training on the other, 2 cores in all.

It records per run: the mean training reward (critic/score/mean) over the first and last 10 steps, the final greedy
validation accuracy, wall time, the time at which a run's 10-step moving mean reward first reaches the sync run's
last-10 mean (start-up + the steps' `timing_s/step` up to there), and for one-step-off the mean `trainer/idle_ratio`
and `rollouter/idle_ratio`. Learning "as well": the one-step-off last-10 mean is within 0.05 of sync's (or above) and
its final validation accuracy within 0.05 of sync's. Speed (issue 37): one-step-off reaches the sync run's final
reward in at most 0.75 x the sync run's wall time.

    python bench/async_demos.py [--recipes tiny_gsm8k,tiny_geo3k] [--seeds 5] [--no-pin] [--out bench/results/async_demos.md]
    python bench/async_demos.py --recipes tiny_gsm8k --seeds 1     # one seed of the text demo (~5-10 min)
    python bench/async_demos.py --report-only                     # rebuild the report from finished runs
    python bench/async_demos.py --recipes tiny_gsm8k --seeds 1 --out /tmp/smoke.md trainer.total_training_steps=20
    python bench/async_demos.py --model [--gen 0.6 --tail 0.5 --switch 0.05 --sync 0.01 --devices 16]

`--model` prints the speed-up model of docs/async.md ("A speed-up model for 16 NPUs") instead of running anything.
Needs a quiet 2-core machine for the timings: the load average before and after each run is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import demo_learning  # noqa: E402  (bench/ is on sys.path above)

REPO = demo_learning.REPO
RECIPES = ("tiny_gsm8k", "tiny_geo3k")
MODES = ("sync", "one-step-off")
RESULT = "async_result.json"
SPEED_GOAL = 0.75
LEARN_MARGIN = 0.05
PIDS_MARK = "rollout process(es) (pids ["


# ------------------------------------------------------------------------------------------------ the model
def async_step(gen: float, tail: float, switch: float, sync_cost: float, rollout: int, devices: int) -> float:
    """One-step-off step time, as a fraction of the sync step on `devices` devices (docs/async.md): the slower of
    the rollout side (the tail, the bulk scaled to `rollout` devices, the weight load) and the trainer side (the
    training phases scaled to the other devices, the push); `sync_cost` is split evenly between the two sides."""
    train = 1.0 - gen - switch
    rollout_side = tail * gen + devices / rollout * (1 - tail) * gen + sync_cost / 2
    trainer_side = devices / (devices - rollout) * train + sync_cost / 2
    return max(rollout_side, trainer_side)


def model_table(rows: list[tuple[float, float, float]], sync_cost: float, devices: int) -> list[str]:
    half = devices // 2
    lines = [
        "| assumed: G / T | G_t / G (tail) | C / T | best r | T_async / T at r = "
        f"{half} | S at r = {half} | S at best r |",
        "|---|---|---|---|---|---|---|",
    ]
    for gen, tail, switch in rows:
        times = {r: async_step(gen, tail, switch, sync_cost, r, devices) for r in range(1, devices)}
        best = min(times, key=lambda r: times[r])
        lines.append(
            f"| {gen:.2f} | {tail:.1f} | {switch:.2f} | {best} | {times[half]:.3f} | {1 / times[half]:.2f} | "
            f"{1 / times[best]:.2f} |"
        )
    return lines


# ------------------------------------------------------------------------------------------------ the runs
def one_step_off_overrides(recipe: str, bypass: bool = False, clip_ratio_high: float | None = None) -> list[str]:
    """The one-step-off settings of `recipe`; `bypass`: verl's bypass mode, the rollout's log-probs are pi_old, so
    the trainer runs no old-log-prob pass (the importance weights then come from the loss's own ratio);
    `clip_ratio_high`: the PPO ratio's upper clip (DAPO's clip-higher, 0.28; None: the recipe's 0.2). One step off,
    the ratio of a step's single update starts at pi_{s-1} / pi_{s-2}, not at 1 as in sync, so the clip acts
    (docs/async.md, "Benchmark")."""
    from verl_npu.config import load_recipe

    cfg = load_recipe(recipe, []).typed
    sync_step = cfg.data.train_batch_size // cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    return [
        "trainer.v1.trainer_mode=separate_async",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        f"trainer.v1.separate_async.parameter_sync_step={sync_step}",
        "trainer.v1.sampler.max_off_policy_threshold=1",
        "algorithm.rollout_correction.rollout_is=token",
        *(["algorithm.rollout_correction.bypass_mode=true"] if bypass else []),
        *([f"actor_rollout_ref.actor.clip_ratio_high={clip_ratio_high}"] if clip_ratio_high is not None else []),
    ]


def pin(pid: int, core: int) -> None:
    """Every thread of process `pid` on `core` (sched_setaffinity acts on one thread)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), {core})
        except (ProcessLookupError, PermissionError):
            pass


def run_one(
    recipe: str,
    seed: int,
    mode: str,
    root: Path,
    pin_cores: bool,
    overrides: list[str],
    bypass: bool = False,
    clip_ratio_high: float | None = None,
) -> dict:
    demo_learning.RECIPE = recipe
    out_dir = root / recipe / f"seed{seed}_{mode}"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    extra = [*overrides, *(one_step_off_overrides(recipe, bypass, clip_ratio_high) if mode != "sync" else [])]
    # the launcher's Python: the caller's choice, else the one running this script (a worktree has no .venv)
    env = dict(
        os.environ,
        OMP_NUM_THREADS="2" if mode == "sync" else "1",
        VERL_NPU_PYTHON=os.environ.get("VERL_NPU_PYTHON", sys.executable),
    )
    load_before = os.getloadavg()[0]
    log_path = out_dir / "bench_output.log"
    start = time.time()
    pinned = False
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            demo_learning.command(seed, out_dir, extra), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        while proc.poll() is None:
            time.sleep(0.2)
            if pin_cores and mode != "sync" and not pinned and PIDS_MARK in log_path.read_text():
                text = log_path.read_text()
                rollout_pid = int(text.split(PIDS_MARK, 1)[1].split("]", 1)[0])
                pin(proc.pid, 0)
                pin(rollout_pid, 1)
                pinned = True
    wall = time.time() - start
    if proc.returncode != 0:
        raise SystemExit(f"{recipe} seed {seed} {mode}: the run failed (exit {proc.returncode}); see {log_path}")
    result = {
        "recipe": recipe,
        "seed": seed,
        "mode": mode,
        "wall": wall,
        "pinned": pinned,
        "load": [load_before, os.getloadavg()[0]],
        "overrides": extra,
    }
    (out_dir / RESULT).write_text(json.dumps(result) + "\n")
    return read_run(out_dir)


def read_run(out_dir: Path) -> dict:
    result = json.loads((out_dir / RESULT).read_text())
    result.update(
        {
            k: v
            for k, v in demo_learning.read_run(_as_demo_run(out_dir, result)).items()
            if k in ("scores", "first", "last", "val", "step_s", "steps")
        }
    )
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if r.get("critic/score/mean") is not None]
    result["step_times"] = [r.get("timing_s/step", 0.0) for r in train]
    for key in ("trainer/idle_ratio", "rollouter/idle_ratio"):
        values = [r[key] for r in train if key in r]
        result[key] = sum(values) / len(values) if values else None
    return result


def _as_demo_run(out_dir: Path, result: dict) -> Path:
    """demo_learning.read_run reads its own result file: write one beside ours."""
    (out_dir / demo_learning.RESULT_FILE).write_text(json.dumps({**result, "threads": 0, "parallel": 1}) + "\n")
    return out_dir


def time_to_reach(run: dict, target: float) -> float | None:
    """Seconds from the run's start until its 10-step moving mean reward first reaches `target`: the start-up
    (wall time minus the steps' time) plus the steps' `timing_s/step` up to that step; None if it never does."""
    scores, times = run["scores"], run["step_times"]
    startup = run["wall"] - sum(times)
    for i in range(len(scores)):
        window = scores[max(0, i - 9) : i + 1]
        if i >= 9 and sum(window) / len(window) >= target:
            return startup + sum(times[: i + 1])
    return None


def accuracy(run: dict) -> float | None:
    acc = [v for k, v in run["val"].items() if "/accuracy/" in k]
    return min(acc) if acc else None


def report(results: list[dict], argv: list[str]) -> tuple[list[str], bool]:
    pairs: dict[tuple[str, int], dict[str, dict]] = {}
    for r in results:
        pairs.setdefault((r["recipe"], r["seed"]), {})[r["mode"]] = r
    lines = [
        "# CPU demos: one-step-off (separate_async, k=1) against sync",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `python bench/async_demos.py"
        f"{' ' + ' '.join(argv) if argv else ''}` on {os.cpu_count()} CPU cores ({platform.machine()}), Python "
        f"{platform.python_version()}. sync: `OMP_NUM_THREADS=2`, one process. one-step-off: `OMP_NUM_THREADS=1`, "
        "the trainer and one rollout process (pinned: trainer on core 0, rollout on core 1, when `pinned` says so). "
        "`reaches sync final`: seconds until the run's 10-step moving mean reward first reaches the sync run's "
        "last-10 mean (start-up included); the goal is one-step-off at most "
        f"{SPEED_GOAL} x the sync run's wall time. The load average (1 minute, before / after) shows other work on "
        "the machine: timings taken on a busy machine are not the benchmark's answer.",
        "",
        "| demo | seed | mode | first-10 reward | last-10 reward | final validation accuracy | wall time | "
        "mean step | reaches sync final | / sync wall | trainer idle | rollout idle | pinned | load before / after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    checks: dict[str, bool] = {}
    for (recipe, seed), modes in sorted(pairs.items()):
        sync = modes.get("sync")
        for mode in MODES:
            r = modes.get(mode)
            if r is None:
                continue
            reach = time_to_reach(r, sync["last"]) if sync else None
            share = f"{reach / sync['wall']:.2f}" if reach is not None and sync else "n/a"
            idle = [
                f"{r[k]:.2f}" if r.get(k) is not None else "" for k in ("trainer/idle_ratio", "rollouter/idle_ratio")
            ]
            acc = accuracy(r)
            lines.append(
                f"| {recipe} | {seed} | {mode} | {r['first']:.3f} | {r['last']:.3f} | "
                f"{acc if acc is None else f'{acc:.3f}'} | {r['wall']:.0f} s | {r['step_s']:.3f} s | "
                f"{'never' if reach is None else f'{reach:.0f} s'} | {share} | {idle[0]} | {idle[1]} | "
                f"{r['pinned']} | {r['load'][0]:.1f} / {r['load'][1]:.1f} |"
            )
        off = modes.get("one-step-off")
        if sync and off:
            name = f"{recipe} seed {seed}"
            checks[f"{name}: last-10 within {LEARN_MARGIN} of sync"] = off["last"] >= sync["last"] - LEARN_MARGIN
            sync_acc, off_acc = accuracy(sync), accuracy(off)
            checks[f"{name}: validation accuracy within {LEARN_MARGIN} of sync"] = (
                sync_acc is not None and off_acc is not None and off_acc >= sync_acc - LEARN_MARGIN
            )
            reach = time_to_reach(off, sync["last"])
            checks[f"{name}: reaches sync's final reward in <= {SPEED_GOAL} x sync wall"] = (
                reach is not None and reach <= SPEED_GOAL * sync["wall"]
            )
    failed = [n for n, ok in checks.items() if not ok]
    lines += [
        "",
        f"Checks: {len(checks) - len(failed)} of {len(checks)} pass"
        + ("." if not failed else "; FAILED: " + "; ".join(failed)),
        "",
        *over_seeds(pairs),
    ]
    return lines, not failed


PLATEAU = 0.9  # a last-10 mean reward below this: the run settled before learning every kind of question


def over_seeds(pairs: dict[tuple[str, int], dict[str, dict]]) -> list[str]:
    """Learning over the seeds, per demo: how many runs of each mode settle below PLATEAU, and the mean last-10
    reward of each mode. A single seed's outcome is chaotic (a run that is deterministic on its seed flips between
    learning and a plateau under any change of the update: bench/results/async_demos_seeds.md), so "learns as well as
    sync over the seeds" is read here as: no more plateaus than sync, and a mean within LEARN_MARGIN of sync's."""
    lines = [
        "| demo | seeds (pairs) | sync: below 0.9 | one-step-off: below 0.9 | sync: mean last-10 | "
        "one-step-off: mean last-10 | as well over the seeds |",
        "|---|---|---|---|---|---|---|",
    ]
    for recipe in sorted({r for r, _ in pairs}):
        both = [m for (r, _), m in sorted(pairs.items()) if r == recipe and "sync" in m and "one-step-off" in m]
        if not both:
            continue
        sync = [m["sync"]["last"] for m in both]
        off = [m["one-step-off"]["last"] for m in both]
        low_sync, low_off = sum(x < PLATEAU for x in sync), sum(x < PLATEAU for x in off)
        mean_sync, mean_off = sum(sync) / len(sync), sum(off) / len(off)
        ok = low_off <= low_sync and mean_off >= mean_sync - LEARN_MARGIN
        lines.append(
            f"| {recipe} | {len(both)} | {low_sync} | {low_off} | {mean_sync:.3f} | {mean_off:.3f} | "
            f"{'yes' if ok else 'no'} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated demos (default both)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5, bench/demo_learning.py's)")
    parser.add_argument("--first-seed", type=int, default=0, help="start at this seed (finish a run cut short)")
    parser.add_argument("--no-pin", action="store_true", help="leave the processes where the OS puts them")
    parser.add_argument(
        "--bypass", action="store_true", help="one-step-off in verl's bypass mode (no old-log-prob pass on the trainer)"
    )
    parser.add_argument(
        "--clip-ratio-high",
        type=float,
        default=None,
        help="one-step-off: actor.clip_ratio_high (DAPO's clip-higher, 0.28); default: the recipe's (0.2)",
    )
    parser.add_argument("--out", default=str(BENCH / "results" / "async_demos.md"))
    parser.add_argument("--output-dir", default="/tmp/verl_npu_bench_async")
    parser.add_argument("--report-only", action="store_true", help="the report from finished runs, running nothing")
    parser.add_argument("--model", action="store_true", help="print the 16-device speed-up model (docs/async.md)")
    parser.add_argument("--gen", type=float, nargs="*", default=[0.5, 0.6, 0.7, 0.8], help="--model: G / T values")
    parser.add_argument("--tail", type=float, nargs="*", default=[0.3, 0.5, 0.5, 0.6], help="--model: G_t / G")
    parser.add_argument("--switch", type=float, default=0.05, help="--model: C / T")
    parser.add_argument("--sync", type=float, default=0.01, help="--model: (R + W) / T")
    parser.add_argument("--devices", type=int, default=16, help="--model: devices in all")
    parser.add_argument(
        "overrides",
        nargs="*",
        help="key=value overrides of both modes' runs (a shorter smoke run: "
        "trainer.total_training_steps=20 trainer.test_freq=10)",
    )
    args = parser.parse_args()
    if args.model:
        print(
            "\n".join(model_table([(g, t, args.switch) for g, t in zip(args.gen, args.tail)], args.sync, args.devices))
        )
        return 0
    root = Path(args.output_dir)
    recipes = [r for r in args.recipes.split(",") if r]
    unknown = set(recipes) - set(RECIPES)
    if unknown:
        parser.error(f"--recipes: {sorted(unknown)} are not CPU demos ({', '.join(RECIPES)})")
    if args.report_only:
        results = [read_run(d) for d in sorted(root.glob("*/seed*_*")) if (d / RESULT).is_file()]
    else:
        results = []
        for recipe in recipes:
            for seed in range(args.first_seed, args.seeds):
                for mode in MODES:
                    r = run_one(
                        recipe, seed, mode, root, not args.no_pin, args.overrides, args.bypass, args.clip_ratio_high
                    )
                    print(f"{recipe} seed {seed} {mode}: last-10 {r['last']:.3f}, {r['wall']:.0f} s", flush=True)
                    results.append(r)
    if not results:
        raise SystemExit(f"no finished runs in {root}")
    lines, ok = report(results, sys.argv[1:])
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
