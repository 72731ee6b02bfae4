"""The tool demo (issue 38), run by hand over seeds: does RL make a tiny model use its tool better than SFT alone?

    python bench/tool_demo.py --seeds 1 2 3 4 5 --jobs 2 --out bench/results/tool_demo.md

For each seed S, in a fresh folder under `--work`, recipes/tiny_tool_demo.yaml runs both stages from
`tiny://qwen2?seed=S` (SFT `trainer.seed=S`, RL `data.seed=S`): SFT on the lookup task's transcripts
(recipes/tiny_lookup_sft.yaml), then multi-turn GRPO with the lookup tool (recipes/tiny_tool_lookup.yaml) from the
SFT checkpoint. The RL stage validates with sampling (temperature 1, 2 samples of each of the 64 validation
problems) before its first step (the model after SFT alone) and after its last step (after RL), and dumps every
training step's conversations (`trainer.rollout_data_dir`). Read from those dumps, per conversation:

- call: the model wrote a well-formed call of `lookup` (JSON the agent loop parsed, naming the tool) and the tool
  answered it (with the problem's code: it takes no argument);
- call success: a call, and the final `#### n` is the code the tool returned (the reward is 1);
- reward: the rule reward (verl_npu.rewards.tool_lookup: 1 for the right code, whether called or guessed).

The table has the sampled validation after SFT and after RL; the curves, every RL training step's rates (step 1's
conversations are sampled from the SFT model, before any update). Wall and CPU time are those of the seed's
`verl-npu run` process (one torch thread): on a busy machine the wall time says little, the CPU time is what a
quiet core would need. The data files are the recipes' own (made once, before the seeds run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOL = "lookup"
RATES = ("calls", "success", "reward")


def answered_call(record: dict) -> bool:
    """A call the agent loop parsed, naming the lookup tool, that the tool answered (no error)."""
    return bool(record.get("known")) and not record.get("error") and record.get("name") == TOOL


def conversation_stats(rows: list[dict]) -> dict[str, float]:
    """calls, success and reward (module docstring) of dumped conversations, as shares of them."""
    if not rows:
        raise ValueError("no conversations")
    calls = success = 0
    for row in rows:
        called = any(answered_call(r) for turn in row.get("turns") or [] for r in turn.get("calls") or [])
        calls += called
        success += called and row["score"] > 0
    n = len(rows)
    return {"calls": calls / n, "success": success / n, "reward": sum(r["score"] for r in rows) / n}


def read_dump(folder: Path, step: int) -> list[dict]:
    path = folder / f"{step}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_timed(args: list[str], log: Path, threads: int) -> tuple[float, float]:
    """Run `verl-npu ARGS`; (wall seconds, CPU seconds of the process and its children)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    start = time.time()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "verl_npu.cli", *args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env
        )
        _, status, usage = os.wait4(proc.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code:
        raise SystemExit(f"verl-npu {' '.join(args[:2])} failed (exit {code}); see {log}")
    return time.time() - start, usage.ru_utime + usage.ru_stime


def prepare_data() -> None:
    """The recipes' own data files (as `verl-npu run` makes them), before seeds run side by side."""
    sys.path.insert(0, str(REPO))
    from verl_npu.config import load_recipe
    from verl_npu.config.sft import load_sft_recipe
    from verl_npu.demo import prepare_assets, prepare_sft_assets

    prepare_sft_assets(load_sft_recipe("tiny_lookup_sft"))
    prepare_assets(load_recipe("tiny_tool_lookup"))


def run_seed(seed: int, work: Path, threads: int, overrides: list[str]) -> dict:
    """Validation after SFT and after RL, every RL step's rates, and the time of one seed."""
    folder = work / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    wall, cpu = run_timed(
        [
            "run",
            "tiny_tool_demo",
            f"af_output_dir={folder}",
            f"sft.model.path=tiny://qwen2?seed={seed}",
            f"sft.trainer.seed={seed}",
            f"rl.data.seed={seed}",
            f"rl.trainer.rollout_data_dir={folder / 'rl' / 'rollout_data'}",
            f"rl.trainer.validation_data_dir={folder / 'rl' / 'validation_data'}",
            *overrides,
        ],
        folder / "stages.log",
        threads,
    )
    val = folder / "rl" / "validation_data"
    steps = sorted(int(p.stem) for p in val.glob("*.jsonl"))
    rollouts = folder / "rl" / "rollout_data"
    curve = [conversation_stats(read_dump(rollouts, s)) for s in sorted(int(p.stem) for p in rollouts.glob("*.jsonl"))]
    return {
        "seed": seed,
        "sft": conversation_stats(read_dump(val, steps[0])),
        "rl": conversation_stats(read_dump(val, steps[-1])),
        "rl_steps": steps[-1],
        "curve": curve,
        "wall_s": wall,
        "cpu_s": cpu,
    }


def _rates(s: dict) -> str:
    return " / ".join(f"{s[k]:.2f}" for k in RATES)


def table(results: list[dict]) -> str:
    lines = [
        "| seed | after SFT: calls / call success / reward | after RL: calls / call success / reward | "
        "RL above SFT (success and reward) | wall (s) | CPU (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        above = r["rl"]["success"] > r["sft"]["success"] and r["rl"]["reward"] > r["sft"]["reward"]
        lines.append(
            f"| {r['seed']} | {_rates(r['sft'])} | {_rates(r['rl'])} | {'yes' if above else 'NO'} | "
            f"{r['wall_s']:.0f} | {r['cpu_s']:.0f} |"
        )
    n = len(results)
    mean = {k: {m: sum(r[k][m] for r in results) / n for m in RATES} for k in ("sft", "rl")}
    lines.append(f"| mean | {_rates(mean['sft'])} | {_rates(mean['rl'])} | | | |")
    return "\n".join(lines) + "\n"


def curves(results: list[dict]) -> str:
    """Every RL step's calls and reward, per seed ('calls / reward'), and the mean over seeds."""
    steps = min(len(r["curve"]) for r in results)
    head = "| step | " + " | ".join(f"seed {r['seed']}" for r in results) + " | mean |"
    lines = [head, "|---" * (len(results) + 2) + "|"]
    sft = {m: sum(r["sft"][m] for r in results) / len(results) for m in ("calls", "reward")}
    lines.append(
        "| after SFT (validation) | "
        + " | ".join(f"{r['sft']['calls']:.2f} / {r['sft']['reward']:.2f}" for r in results)
        + f" | {sft['calls']:.2f} / {sft['reward']:.2f} |"
    )
    for i in range(steps):
        cells = [f"{r['curve'][i]['calls']:.2f} / {r['curve'][i]['reward']:.2f}" for r in results]
        mean = {m: sum(r["curve"][i][m] for r in results) / len(results) for m in ("calls", "reward")}
        lines.append(f"| {i + 1} | " + " | ".join(cells) + f" | {mean['calls']:.2f} / {mean['reward']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path) -> None:
    """The per-step call rate and reward of every seed, the after-SFT validation level dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, metric, title in zip(axes, ("calls", "reward"), ("tool-call rate", "reward")):
        for r in results:
            (line,) = ax.plot(
                range(1, len(r["curve"]) + 1), [c[metric] for c in r["curve"]], lw=1, label=f"seed {r['seed']}"
            )
            ax.axhline(r["sft"][metric], color=line.get_color(), ls="--", lw=0.8)
        ax.set_title(f"{title} per RL step (dashed: after SFT alone)")
        ax.set_xlabel("GRPO step")
        ax.set_ylim(0, 1.02)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--jobs", type=int, default=1, help="seeds run at a time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (OMP_NUM_THREADS)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/verl_npu_tool_demo"), help="run folders")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the tables here (.md; the raw numbers to .json, the curves to .png)",
    )
    parser.add_argument("overrides", nargs="*", help="more overrides of tiny_tool_demo (sft.X=..., rl.X=...)")
    args = parser.parse_args()
    prepare_data()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda s: run_seed(s, args.work, args.threads, args.overrides), args.seeds))
    text = (
        f"Sampled validation (temperature 1, 64 problems x 2) after SFT and after {results[0]['rl_steps']} "
        f"RL steps:\n\n{table(results)}\nPer RL step, calls / reward of the step's training conversations:\n\n"
        f"{curves(results)}"
    )
    print(text)
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
        plot(results, args.out.with_suffix(".png"))
        args.out.with_name(args.out.stem + "_table.md").write_text(text)
        print(
            f"written: {args.out.with_suffix('.json')}, {args.out.with_suffix('.png')} and "
            f"{args.out.with_name(args.out.stem + '_table.md')} (the notes in {args.out} are written by hand)"
        )


if __name__ == "__main__":
    main()
