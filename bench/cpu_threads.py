"""The CPU thread policy on a busy machine: the quick start's steps/s alone and beside a CPU-bound job.

For each set of cores (`taskset -c`), each policy and each condition, one short run of the quick start's
recipe (`tiny_geo3k`, its own synthetic data, no validation, no checkpoint) is timed; steps/s is
1 / the median `timing_s/step` of its steps after the first two (start-up excluded).

- policy "old": what verl-npu did before the thread policy (torch's default intra-op thread count in a
  process under that affinity, the OpenMP runtime's default wait: it spins a while before it sleeps).
  Emulated with `trainer.cpu_threads=<torch's default there>` and `OMP_WAIT_POLICY` / `KMP_BLOCKTIME`
  set to empty strings (present, so verl-npu keeps them; empty, so the OpenMP runtime uses its default).
- policy "new": verl-npu's policy (`verl_npu.device.ThreadPolicy`: threads from the allowed cores,
  passive wait), nothing set by the caller.
- condition "alone" / "busy": without / beside one busy-loop process per allowed core, pinned to it.

The machine's load (os.getloadavg) is recorded before each run: on a shared machine "alone" is only
alone as far as this script goes. Results: a JSON line per run in --jsonl, a markdown table on stdout.

    python bench/cpu_threads.py --cores 0 0,1 --steps 20 --jsonl bench/results/cpu_threads_results.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def torch_default_threads(cpus: str) -> int:
    """torch's intra-op thread count in a fresh process pinned to `cpus` with no thread variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run(
        ["taskset", "-c", cpus, sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return int(out.stdout.strip())


def start_busy(cpus: str) -> list[subprocess.Popen]:
    """One busy-loop process per core of `cpus`, pinned to it: the competing CPU-bound job."""
    return [
        subprocess.Popen(["taskset", "-c", cpu, sys.executable, "-c", "while True: pass"]) for cpu in cpus.split(",")
    ]


def run_once(cpus: str, policy: str, busy: bool, steps: int, workdir: Path) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "KMP_BLOCKTIME")
    }
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = Path(tempfile.mkdtemp(prefix=f"run_{policy}_", dir=workdir))
    overrides = [
        f"af_output_dir={out}",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.save_freq=-1",
        "trainer.logger=[console]",
        "trainer.resume_mode=disable",
    ]
    threads = None
    if policy == "old":
        threads = torch_default_threads(cpus)
        env.update(OMP_WAIT_POLICY="", KMP_BLOCKTIME="")
        overrides.append(f"trainer.cpu_threads={threads}")
    load = os.getloadavg()
    competitors = start_busy(cpus) if busy else []
    start = time.monotonic()
    try:
        proc = subprocess.run(
            ["taskset", "-c", cpus, sys.executable, "-m", "verl_npu.cli", "run", "tiny_geo3k", *overrides],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    finally:
        for p in competitors:
            p.kill()
            p.wait()
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    step_s = [r["timing_s/step"] for r in rows if r.get("step", 0) > 2 and "timing_s/step" in r]
    policy_line = next(
        (line.split("cpu threads: ", 1)[1] for line in proc.stderr.splitlines() if "INFO cpu threads: " in line), ""
    )
    return {
        "cores": cpus,
        "policy": policy,
        "condition": "busy" if busy else "alone",
        "steps": steps,
        "median_step_s": statistics.median(step_s),
        "steps_per_s": 1 / statistics.median(step_s),
        "wall_s": round(wall, 1),
        "loadavg_before": [round(x, 2) for x in load],
        "torch_default_threads": threads,
        "verl_npu_policy": policy_line,
    }


def table(results: list[dict]) -> str:
    lines = [
        "| cores | policy | alone: steps/s | beside a busy loop per core: steps/s | slowdown | load (1 min) "
        "alone / busy |",
        "|---|---|---|---|---|---|",
    ]
    keyed = {(r["cores"], r["policy"], r["condition"]): r for r in results}  # the last run of each wins
    for cores, policy in dict.fromkeys((r["cores"], r["policy"]) for r in results):
        alone, busy = keyed.get((cores, policy, "alone")), keyed.get((cores, policy, "busy"))
        if not alone or not busy:
            continue
        lines.append(
            f"| {len(cores.split(','))} ({cores}) | {policy} | {alone['steps_per_s']:.2f} | "
            f"{busy['steps_per_s']:.2f} | {alone['steps_per_s'] / busy['steps_per_s']:.1f}x | "
            f"{alone['loadavg_before'][0]} / {busy['loadavg_before'][0]} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", nargs="+", default=["0", "0,1"], help="taskset -c core lists (default 0 and 0,1)")
    parser.add_argument("--policies", nargs="+", default=["old", "new"], choices=("old", "new"))
    parser.add_argument("--conditions", nargs="+", default=["alone", "busy"], choices=("alone", "busy"))
    parser.add_argument("--steps", type=int, default=20, help="steps of each run (default 20)")
    parser.add_argument("--jsonl", type=Path, help="append one JSON line per run here")
    args = parser.parse_args()
    available = os.sched_getaffinity(0)
    results = []
    with tempfile.TemporaryDirectory(prefix="verl_npu_threads_") as scratch:
        workdir = Path(scratch)
        for cpus in args.cores:
            if not {int(c) for c in cpus.split(",")} <= available:
                print(f"skipping cores {cpus}: not all of them are available here", file=sys.stderr)
                continue
            for policy in args.policies:
                for busy in [c == "busy" for c in args.conditions]:
                    result = run_once(cpus, policy, busy, args.steps, workdir)
                    print(json.dumps(result), file=sys.stderr, flush=True)
                    results.append(result)
                    if args.jsonl:
                        with args.jsonl.open("a") as fh:
                            fh.write(json.dumps(result) + "\n")
    print(table(results))


def table_from(jsonl: Path) -> str:
    """The markdown table of every run recorded in `jsonl` (the last run of a configuration wins)."""
    return table([json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()])


if __name__ == "__main__":
    main()
