"""Benchmark: does the CPU demo visibly learn, and how long does it take?

Runs `bash launch/run_recipe.sh tiny_geo3k` (the README's demo, from a clean output folder),
reads metrics.jsonl, and checks the demo's promise:

- the mean training reward (critic/score/mean) over the last 10 steps is >= 0.6,
- it is >= 3x the mean over the first 10 steps,
- it is above 0.325, the best expected score of a policy that ignores the image,
- the whole run (start-up included) takes under 10 minutes.

Usage:  python bench/demo_learning.py [--out bench/demo_learning.md] [key=value overrides ...]
It writes a Markdown report (numbers, a coarse reward curve, timing) and copies the run's
training_curves.png next to it. Run by hand; results are recorded in the repo.
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
BLIND_BEST = 0.325
TIME_LIMIT_S = 600


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "bench" / "demo_learning.md"))
    parser.add_argument("--output-dir", default="/tmp/verl_npu_bench_demo")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out_dir = Path(args.output_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    cmd = ["bash", str(REPO / "launch" / "run_recipe.sh"), "tiny_geo3k", f"af_output_dir={out_dir}", *args.overrides]
    start = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.time() - start
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        return proc.returncode
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if r.get("critic/score/mean") is not None]
    scores = [r["critic/score/mean"] for r in train]
    first, last = sum(scores[:10]) / 10, sum(scores[-10:]) / 10
    step_times = [r["timing_s/step"] for r in train]
    checks = {
        "last-10 mean >= 0.6": last >= 0.6,
        "last-10 mean >= 3x first-10 mean": last >= 3 * first,
        f"last-10 mean > image-blind best {BLIND_BEST}": last > BLIND_BEST,
        f"wall time < {TIME_LIMIT_S} s": wall < TIME_LIMIT_S,
    }
    val = {k: v for k, v in rows[-1].items() if k.startswith("val-")}
    lines = [
        "# CPU demo learning benchmark (`tiny_geo3k`)",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `python bench/demo_learning.py"
        f"{' ' + ' '.join(args.overrides) if args.overrides else ''}` on {os.cpu_count()} CPU cores "
        f"({platform.processor() or platform.machine()}), Python {platform.python_version()}.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| steps | {len(train)} |",
        f"| mean reward, first 10 steps | {first:.3f} |",
        f"| mean reward, last 10 steps | {last:.3f} |",
        f"| image-blind best expected reward | {BLIND_BEST} |",
        f"| final validation (greedy) | {', '.join(f'{k} = {v:.3f}' for k, v in val.items()) or 'n/a'} |",
        f"| wall time, start-up included | {wall:.0f} s |",
        f"| mean step time | {sum(step_times) / len(step_times):.2f} s |",
        "",
        "| check | result |",
        "|---|---|",
        *[f"| {name} | {'pass' if ok else 'FAIL'} |" for name, ok in checks.items()],
        "",
        "Mean training reward per 10-step window:",
        "",
        "```",
    ]
    for i in range(0, len(scores), 10):
        window = scores[i : i + 10]
        mean = sum(window) / len(window)
        lines.append(f"steps {i + 1:4d}-{i + len(window):4d}  {mean:5.3f}  {'#' * int(round(mean * 50))}")
    lines += ["```", "", "![training curves](demo_training_curves.png)", ""]
    Path(args.out).write_text("\n".join(lines))
    shutil.copy(out_dir / "training_curves.png", Path(args.out).parent / "demo_training_curves.png")
    print("\n".join(lines))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
