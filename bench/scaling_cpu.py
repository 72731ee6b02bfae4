"""Benchmark: step time and throughput with 1 and 2 CPU workers, same global batch.

Runs the `tiny_geo3k` recipe for a few steps with trainer.n_gpus_per_node=1 (one in-process
worker) and =2 (two Ray workers, FSDP2 over gloo), on the same data and seeds, and reports the
median step time, tokens per second per worker (`perf/throughput`) and the phase timings.

Usage:  python bench/scaling_cpu.py [--steps 8] [--out bench/results/scaling_cpu.md] [key=value ...]
Run by hand; results are recorded in the repo. On a 2-core machine two workers share the cores,
so this measures the overhead of the distributed path more than a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = ["gen", "old_log_prob", "update_actor", "step"]


def run(workers: int, steps: int, data: Path, out: Path, extra: list[str]) -> dict:
    overrides = [
        f"af_output_dir={out}",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}",
        f"trainer.n_gpus_per_node={workers}",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.logger=[console]",
        "ray_init.num_cpus=2",
        # micro batches that fit the per-device share at both sizes (32 responses per device with 2)
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
        *extra,
    ]
    start = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "verl_npu.cli", "run", "tiny_geo3k", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise SystemExit(f"run with {workers} worker(s) failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    wall = time.time() - start
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = rows[1:]  # the first step pays one-off warm-up costs
    result = {"wall_s": wall, "throughput": statistics.median(r["perf/throughput"] for r in rows)}
    for phase in PHASES:
        result[phase] = statistics.median(r[f"timing_s/{phase}"] for r in rows)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "scaling_cpu.md"))
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    from verl_npu.data.geometry3k import prepare_synthetic

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prepare_synthetic(tmp / "data", 256, 16, seed=0, image_size=56)
        results = {w: run(w, args.steps, tmp / "data", tmp / f"out{w}", args.overrides) for w in (1, 2)}
    lines = [
        "# CPU scaling benchmark: 1 vs 2 workers (`tiny_geo3k`, same global batch)",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `python bench/scaling_cpu.py "
        f"--steps {args.steps}{' ' + ' '.join(args.overrides) if args.overrides else ''}` on {os.cpu_count()} "
        f"CPU cores ({platform.machine()}). Medians over steps 2..{args.steps}.",
        "",
        "| workers | step (s) | gen (s) | old_log_prob (s) | update_actor (s) | tokens/s per worker | wall incl. start-up (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for w, r in results.items():
        lines.append(
            f"| {w} | {r['step']:.2f} | {r['gen']:.2f} | {r['old_log_prob']:.2f} | {r['update_actor']:.2f} "
            f"| {r['throughput']:.0f} | {r['wall_s']:.0f} |"
        )
    lines += [
        "",
        "Two workers on two cores: each worker runs one intra-op thread against the single worker's two, "
        "and pays FSDP2 all-gathers / reduce-scatters over gloo plus Ray start-up.",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
