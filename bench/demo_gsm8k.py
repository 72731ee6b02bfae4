"""Benchmark: does the CPU text demo (`tiny_gsm8k`) visibly learn, over several seeds, and how long does it take?

For each seed, runs `bash launch/run_recipe.sh tiny_gsm8k af_output_dir=DIR/seedS data.seed=S
trainer.resume_mode=disable` (the README's command; data.seed changes the data order and the
rollout's sampling; the tiny model's initial weights are the same), reads metrics.jsonl and
checks the demo's promise:

- the mean training reward (critic/score/mean) over the last 10 steps is >= 2x the mean over
  the first 10 steps,
- it is above the best expected score of a policy that ignores the question,
- the run (start-up included) takes under 10 minutes.

The machine's load average is recorded before and after each run (other work on a shared machine
slows the steps down). Usage:

    python bench/demo_gsm8k.py [--seeds 1 2 3] [--out bench/demo_gsm8k.md] [key=value overrides ...]

It writes a Markdown report and copies the first seed's training_curves.png next to it. Run by
hand; results are recorded in the repo.
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

REPO = Path(__file__).resolve().parents[1]
TIME_LIMIT_S = 600
MIN_RATIO = 2.0


def blind_best() -> float:
    sys.path.insert(0, str(REPO))
    from verl_npu.rewards.synthetic_arithmetic import BLIND_BEST_SCORE

    return BLIND_BEST_SCORE


def run_seed(seed: int, out_dir: Path, overrides: list[str]) -> dict:
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = ["bash", str(REPO / "launch" / "run_recipe.sh"), "tiny_gsm8k", f"af_output_dir={out_dir}",
           f"data.seed={seed}", "trainer.resume_mode=disable", *overrides]
    load_before = os.getloadavg()
    start = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.time() - start
    load_after = os.getloadavg()
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        raise SystemExit(f"seed {seed}: the run failed (exit {proc.returncode})")
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if r.get("critic/score/mean") is not None]
    scores = [r["critic/score/mean"] for r in train]
    accuracy = [r.get("critic/score/accuracy/mean", float("nan")) for r in train]
    val = {}
    for r in rows:  # the last validation row
        found = {k: v for k, v in r.items() if k.startswith("val-")}
        if found:
            val = found
    return {
        "seed": seed, "steps": len(train), "scores": scores, "accuracy": accuracy,
        "first": sum(scores[:10]) / 10, "last": sum(scores[-10:]) / 10,
        "last_acc": sum(accuracy[-10:]) / 10, "val": val, "wall": wall,
        "step_s": sum(r["timing_s/step"] for r in train) / len(train),
        "load": (load_before[0], load_after[0]), "out_dir": out_dir,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", default=str(REPO / "bench" / "demo_gsm8k.md"))
    parser.add_argument("--output-dir", default="/tmp/verl_npu_bench_gsm8k")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    bound = blind_best()
    results = []
    for seed in args.seeds:
        r = run_seed(seed, Path(args.output_dir) / f"seed{seed}", args.overrides)
        print(f"seed {seed}: first-10 {r['first']:.3f} -> last-10 {r['last']:.3f}, {r['wall']:.0f} s", flush=True)
        results.append(r)
    checks = {}
    for r in results:
        s = r["seed"]
        checks[f"seed {s}: last-10 mean >= {MIN_RATIO:g}x first-10 mean"] = r["last"] >= MIN_RATIO * r["first"]
        checks[f"seed {s}: last-10 mean > question-blind best {bound:.3f}"] = r["last"] > bound
        checks[f"seed {s}: wall time < {TIME_LIMIT_S} s"] = r["wall"] < TIME_LIMIT_S
    command = "python bench/demo_gsm8k.py" + (f" --seeds {' '.join(map(str, args.seeds))}"
                                               if args.seeds != [1, 2, 3] else "")
    command += "".join(f" {o}" for o in args.overrides)
    lines = [
        "# CPU text demo learning benchmark (`tiny_gsm8k`)",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `{command}` on {os.cpu_count()} CPU "
        f"cores ({platform.processor() or platform.machine()}), Python {platform.python_version()}. Each seed is "
        "`bash launch/run_recipe.sh tiny_gsm8k data.seed=1` (then 2, 3) from a fresh output folder (data.seed: data order "
        "and sampling; the model's initial weights are the same).",
        "",
        "| seed | steps | mean reward, first 10 steps | mean reward, last 10 steps | ratio | accuracy, last 10 steps "
        "| final validation (greedy) | wall time, start-up included | mean step time | load average before / after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        val = ", ".join(f"{k.split('/')[-2]} = {v:.3f}" for k, v in r["val"].items() if "format" not in k) or "n/a"
        ratio = r["last"] / r["first"] if r["first"] > 0 else float("inf")
        lines.append(f"| {r['seed']} | {r['steps']} | {r['first']:.3f} | {r['last']:.3f} | {ratio:.1f}x | "
                     f"{r['last_acc']:.3f} | {val} | {r['wall']:.0f} s | {r['step_s']:.2f} s | "
                     f"{r['load'][0]:.1f} / {r['load'][1]:.1f} |")
    lines += [
        "",
        f"Question-blind best expected reward: {bound:.3f} (answers are balanced; see "
        "`verl_npu/rewards/synthetic_arithmetic.py`).",
        "",
        "| check | result |",
        "|---|---|",
        *[f"| {name} | {'pass' if ok else 'FAIL'} |" for name, ok in checks.items()],
        "",
        "Mean training reward per 10-step window:",
        "",
        "```",
        "steps       " + "  ".join(f"seed {r['seed']}" for r in results),
    ]
    longest = max(len(r["scores"]) for r in results)
    for i in range(0, longest, 10):
        cells = []
        for r in results:
            window = r["scores"][i:i + 10]
            cells.append(f"{sum(window) / len(window):6.3f}" if window else "      ")
        lines.append(f"{i + 1:4d}-{i + 10:4d}   " + "  ".join(cells))
    lines += ["```", "", f"![training curves, seed {results[0]['seed']}](demo_gsm8k_training_curves.png)", ""]
    Path(args.out).write_text("\n".join(lines))
    shutil.copy(results[0]["out_dir"] / "training_curves.png", Path(args.out).parent / "demo_gsm8k_training_curves.png")
    print("\n".join(lines))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
