"""Benchmark: do the CPU demos (`tiny_geo3k`, `tiny_gsm8k`, `tiny_grid_env`) learn on every seed and thread count, and how fast?

Each run is a demo, `bash launch/run_recipe.sh RECIPE` (`--recipe`, default the README's picture demo
tiny_geo3k; tiny_gsm8k is the text demo, tiny_geo3k_dapo the picture demo with DAPO, tiny_grid_env the
multi-turn environment demo), from a fresh
output folder, with the seed and thread count of one table row:

- seed S: `data.seed=S` (the synthetic pictures or questions, data order and sampling) and the model's
  random initial weights `actor_rollout_ref.model.path=tiny://<model>?seed=S`; seed 0 is exactly the
  recipe's own command (the recipes' data.seed is 0 and `tiny://<model>` means seed 0). Each seed
  writes its own data files (`--demo-data`), so seeds differ in their data too;
- T threads: `OMP_NUM_THREADS=T` for the run (torch's intra-op threads; 1 and 2 add up floats in
  different orders, so they follow different float paths).

It reads each run's metrics.jsonl and run.log and checks the demo's promise per run:

- the mean training reward (critic/score/mean) over the last 10 steps is >= 0.6,
- it is >= 3x the mean over the first 10 steps,
- it is above the best expected score of a policy that ignores the image (0.25) or the question (0.2),
- the final greedy validation accuracy is >= 0.6,
- the run (start-up included) takes under 10 minutes.

The load average is recorded before and after each run: the machine may be shared, and runs
started together (`--parallel`) share its cores. Usage:

    python bench/demo_learning.py [--recipe tiny_geo3k] [--seeds 5] [--threads 1,2] [--parallel 1] [key=value ...]
    python bench/demo_learning.py --recipe tiny_gsm8k --out bench/results/demo_gsm8k.md   # the text demo
    python bench/demo_learning.py --runs 0:1,1:1     # only these seed:threads runs, started together
    python bench/demo_learning.py --report-only      # rebuild the report from runs already made

It writes bench/results/demo_learning.md and copies seed 0's training_curves.png next to it. Run by
hand; results are recorded in the repo.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIME_LIMIT_S = 600
MIN_LAST = 0.6
MIN_RATIO = 3.0
RESULT_FILE = "bench_result.json"
MIN_VAL_ACCURACY = 0.6
RECIPE = "tiny_geo3k"  # --recipe
#: per demo recipe: its tiny model, the reward module whose BLIND_BEST_SCORE bounds a blind policy, what is ignored
DEMOS = {
    "tiny_geo3k": ("tiny://qwen25vl", "synthetic_geometry", "image"),
    "tiny_geo3k_dapo": ("tiny://qwen25vl", "synthetic_geometry", "image"),
    "tiny_gsm8k": ("tiny://qwen2", "synthetic_arithmetic", "question"),
    "tiny_grid_env": ("tiny://qwen2", "grid_env", "grid"),
}
#: per-step metrics shown per 10-step window after the reward, when a run logs them (the multi-turn demo:
#: its success rate, the reward's accuracy, and turns per trajectory)
EXTRA_CURVES = {
    "critic/score/accuracy/mean": "training success rate (critic/score/accuracy/mean)",
    "num_turns/mean": "turns per trajectory (num_turns/mean: model + environment turns + 1)",
}


def blind_best() -> float:
    import importlib

    sys.path.insert(0, str(REPO))
    return importlib.import_module(f"verl_npu.rewards.{DEMOS[RECIPE][1]}").BLIND_BEST_SCORE


def run_dir(root: Path, seed: int, threads: int) -> Path:
    return root / f"seed{seed}_t{threads}"


def command(seed: int, out_dir: Path, overrides: list[str]) -> list[str]:
    model = DEMOS[RECIPE][0] + (f"?seed={seed}" if seed else "")
    return [
        "bash",
        str(REPO / "launch" / "run_recipe.sh"),
        RECIPE,
        f"af_output_dir={out_dir}",
        f"data.seed={seed}",
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={out_dir}/data/train.parquet",
        f"data.val_files={out_dir}/data/test.parquet",
        "trainer.resume_mode=disable",
        *overrides,
        "--demo-data",
    ]


def val_generations(log_text: str) -> list[str]:
    """The generations of the last '[val/generations] step N:' block of a run.log."""
    blocks = re.split(r"\[val/generations\] step \d+:\n", log_text)
    if len(blocks) < 2:
        return []
    lines = []
    for line in blocks[-1].splitlines():  # the block ends where its lines stop
        if not line.startswith("[ground truth:"):
            break
        lines.append(line)
    return lines


def run_one(seed: int, threads: int, parallel: int, root: Path, overrides: list[str]) -> dict:
    out_dir = run_dir(root, seed, threads)
    shutil.rmtree(out_dir, ignore_errors=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    load_before = os.getloadavg()[0]
    start = time.time()
    proc = subprocess.run(command(seed, out_dir, overrides), cwd=REPO, capture_output=True, text=True, env=env)
    wall = time.time() - start
    load_after = os.getloadavg()[0]
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        raise SystemExit(f"seed {seed}, {threads} thread(s): the run failed (exit {proc.returncode})")
    result = {
        "seed": seed,
        "threads": threads,
        "parallel": parallel,
        "wall": wall,
        "load": [load_before, load_after],
        "overrides": overrides,
    }
    (out_dir / RESULT_FILE).write_text(json.dumps(result) + "\n")
    return read_run(out_dir)


def read_run(out_dir: Path) -> dict:
    """A run's bench_result.json plus what its metrics.jsonl and run.log say."""
    result = json.loads((out_dir / RESULT_FILE).read_text())
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if r.get("critic/score/mean") is not None]
    scores = [r["critic/score/mean"] for r in train]
    val = {}
    for r in rows:
        found = {k: v for k, v in r.items() if k.startswith("val-")}
        if found:
            val = found
    result.update(
        curves={k: [r[k] for r in train if k in r] for k in EXTRA_CURVES if any(k in r for r in train)},
        steps=len(train),
        scores=scores,
        first=sum(scores[:10]) / 10,
        last=sum(scores[-10:]) / 10,
        val=val,
        step_s=sum(r["timing_s/step"] for r in train) / len(train),
        clip=train[-1].get("response_length/clip_ratio"),
        out_dir=str(out_dir),
        generations=val_generations((out_dir / "logs" / "run.log").read_text()),
    )
    return result


def curves_name(out: Path) -> str:
    """The file seed 0's curves are copied to beside the report: demo_training_curves.png for the default
    report (README and docs/demo.md show it), <report name>_training_curves.png for any other."""
    return "demo_training_curves.png" if out.name == "demo_learning.md" else f"{out.stem}_training_curves.png"


def report(results: list[dict], argv: list[str], overrides: list[str], out: Path) -> tuple[list[str], bool]:
    bound, blind = blind_best(), DEMOS[RECIPE][2]
    checks = {}
    for r in results:
        name = f"seed {r['seed']}, {r['threads']} thread(s)"
        checks[f"{name}: last-10 mean >= {MIN_LAST}"] = r["last"] >= MIN_LAST
        checks[f"{name}: last-10 mean >= {MIN_RATIO:g}x first-10 mean"] = r["last"] >= MIN_RATIO * r["first"]
        checks[f"{name}: last-10 mean > {blind}-blind best {bound:g}"] = r["last"] > bound
        acc = [v for k, v in r["val"].items() if "/accuracy/" in k]
        checks[f"{name}: final validation accuracy >= {MIN_VAL_ACCURACY}"] = bool(acc) and min(acc) >= MIN_VAL_ACCURACY
        checks[f"{name}: wall time < {TIME_LIMIT_S} s"] = r["wall"] < TIME_LIMIT_S
    failed = [name for name, ok in checks.items() if not ok]
    lasts = [r["last"] for r in results]
    accs = [v for r in results for k, v in r["val"].items() if "/accuracy/" in k]
    lines = [
        f"# CPU demo learning benchmark (`{RECIPE}`{' ' + ' '.join(overrides) if overrides else ''})",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `python bench/demo_learning.py"
        f"{' ' + ' '.join(argv) if argv else ''}` on {os.cpu_count()} CPU cores "
        f"({platform.processor() or platform.machine()}), Python {platform.python_version()}. Row `seed S, T threads` "
        f"is `bash launch/run_recipe.sh {RECIPE}` with `data.seed=S`, the model's initial weights "
        f"`{DEMOS[RECIPE][0]}?seed=S` and its own synthetic data, under `OMP_NUM_THREADS=T` (seed 0 is the README's "
        "command). `runs at once`: how many runs shared the machine's cores; the load average (1 minute, before / "
        "after) shows other work on the machine, which slows the steps but does not change what is learned.",
        "",
        f"Over {len(results)} runs: last-10 mean reward {min(lasts):.2f}-{max(lasts):.2f}, final validation "
        f"accuracy {min(accs):.2f}-{max(accs):.2f}"
        if results and accs
        else "",
        "",
        "| seed | threads | runs at once | mean reward, first 10 steps | last 10 steps | ratio | final validation "
        "(greedy) | responses cut at the budget, last step | wall time | mean step time | load before / after |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        val = (
            ", ".join(
                f"{k.split('/')[-2]} = {v:.3f}"
                for k, v in sorted(r["val"].items())
                if not k.startswith("val-aux/num_turns/")
            )
            or "n/a"
        )  # turns: a curve below
        ratio = f"{r['last'] / r['first']:.1f}x" if r["first"] > 0 else "inf"
        clip = f"{r['clip']:.3f}" if r["clip"] is not None else "n/a"
        lines.append(
            f"| {r['seed']} | {r['threads']} | {r['parallel']} | {r['first']:.3f} | {r['last']:.3f} | "
            f"{ratio} | {val} | {clip} | {r['wall']:.0f} s | {r['step_s']:.2f} s | "
            f"{r['load'][0]:.1f} / {r['load'][1]:.1f} |"
        )
    lines += [
        "",
        f"{blind.capitalize()}-blind best expected reward: {bound:g} (the answers are balanced; see "
        f"`verl_npu/rewards/{DEMOS[RECIPE][1]}.py` and `docs/demo.md`).",
        "",
        f"Checks: {len(checks) - len(failed)} of {len(checks)} pass"
        + (": " if not failed else "; FAILED: ")
        + (
            f"every run reaches last-10 >= {MIN_LAST}, >= {MIN_RATIO:g}x its first 10 steps, above the {blind}-blind "
            f"best, final validation accuracy >= {MIN_VAL_ACCURACY}, under 10 minutes."
            if not failed
            else "; ".join(failed)
        ),
        "",
        "Mean training reward per 10-step window:",
        "",
        "```",
        "steps      " + " ".join(f"s{r['seed']}/t{r['threads']}".rjust(7) for r in results),
    ]
    longest = max((len(r["scores"]) for r in results), default=0)
    for i in range(0, longest, 10):
        cells = []
        for r in results:
            window = r["scores"][i : i + 10]
            cells.append(f"{sum(window) / len(window):7.3f}" if window else " " * 7)
        lines.append(f"{i + 1:4d}-{i + 10:4d}  " + " ".join(cells))
    lines += ["```", ""]
    for key, title in EXTRA_CURVES.items():
        if not all(key in r.get("curves", {}) for r in results) or not results:
            continue
        lines += [
            f"Mean {title} per 10-step window:",
            "",
            "```",
            "steps      " + " ".join(f"s{r['seed']}/t{r['threads']}".rjust(7) for r in results),
        ]
        for i in range(0, longest, 10):
            cells = []
            for r in results:
                window = r["curves"][key][i : i + 10]
                cells.append(f"{sum(window) / len(window):7.3f}" if window else " " * 7)
            lines.append(f"{i + 1:4d}-{i + 10:4d}  " + " ".join(cells))
        lines += ["```", ""]
    if results and results[0]["generations"]:
        lines += [
            f"Last validation generations of seed {results[0]['seed']}, {results[0]['threads']} thread(s) "
            "(from its run.log; special tokens such as the end of turn are not shown):",
            "",
            "```",
            *results[0]["generations"],
            "```",
            "",
        ]
    lines += [f"![training curves, seed 0]({curves_name(out)})", ""]
    return lines, not failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    parser.add_argument("--threads", default="1,2", help="comma-separated OMP_NUM_THREADS values (default 1,2)")
    parser.add_argument("--parallel", type=int, default=1, help="runs of 1 thread started at once (default 1)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "demo_learning.md"))
    parser.add_argument("--recipe", default="tiny_geo3k", choices=sorted(DEMOS), help="the demo (default tiny_geo3k)")
    parser.add_argument("--output-dir", default="/tmp/verl_npu_bench_demo")
    parser.add_argument("--runs", help="run only these SEED:THREADS pairs, all at once (e.g. 0:1,1:1)")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="make the report from the runs already in --output-dir, running nothing",
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    global RECIPE
    RECIPE = args.recipe
    root = Path(args.output_dir)
    threads = [int(t) for t in args.threads.split(",")]
    if args.report_only:
        results = [read_run(d) for d in sorted(root.glob("seed*_t*")) if (d / RESULT_FILE).is_file()]
    elif args.runs:
        pairs = [tuple(int(x) for x in pair.split(":")) for pair in args.runs.split(",")]
        with ThreadPoolExecutor(len(pairs)) as pool:
            results = list(pool.map(lambda p: run_one(p[0], p[1], len(pairs), root, args.overrides), pairs))
    else:
        results = []
        for t in threads:
            width = max(1, args.parallel) if t == 1 else 1
            jobs = [(s, t, width, root, args.overrides) for s in range(args.seeds)]
            with ThreadPoolExecutor(width) as pool:
                for r in pool.map(lambda job: run_one(*job), jobs):
                    print(
                        f"seed {r['seed']}, {r['threads']} thread(s): first-10 {r['first']:.3f} -> last-10 "
                        f"{r['last']:.3f}, {r['wall']:.0f} s",
                        flush=True,
                    )
                    results.append(r)
    results.sort(key=lambda r: (r["threads"], r["seed"]))
    if not results:
        raise SystemExit(f"no finished runs in {root}")
    lines, ok = report(results, sys.argv[1:], args.overrides, Path(args.out))
    Path(args.out).write_text("\n".join(lines))
    first = Path(results[0]["out_dir"]) / "training_curves.png"
    if first.is_file():
        shutil.copy(first, Path(args.out).parent / curves_name(Path(args.out)))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
