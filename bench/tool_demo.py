"""The tool demo (issue 38), run by hand: does a tiny model learn to call its tool, by SFT and then by RL?

    python bench/tool_demo.py --seeds 1 2 3 --out bench/results/tool_demo.md

For each seed S, from a fresh folder under `--work`:

1. the untrained model (`tiny://qwen2?seed=S`) is validated greedily on the tool demo's validation set
   (recipes/tiny_tool_gsm8k.yaml with `trainer.val_only=true`: multi-turn, the GSM8K answer-check tool);
2. recipes/tiny_tool_demo.yaml runs both stages from that model (SFT `trainer.seed=S`, RL `data.seed=S`): SFT on
   the synthetic tool-call transcripts, then GRPO with the tool; its RL stage validates the same way before training
   (the model after SFT) and after its last step (after RL).

Each validation's conversations are dumped (`trainer.validation_data_dir`) and read here:

- parse rate: the share of conversations whose model turns hold at least one tool call, every one of them
  a well-formed Hermes call of the tool (JSON the agent loop parses, the tool's name, an `answer` argument);
- reward: the mean rule reward (verl_npu.rewards.synthetic_arithmetic: 0.8 for a right answer after a tool
  call, 1.0 for a right bare answer, 0 for a wrong one);
- right: the share of conversations whose final answer is right (reward > 0).

The data files are the demos' own (made once, before the seeds run); seeds differ in the model's initial
weights, the SFT row order and the RL sampling. `--jobs 2` runs two seeds at a time (one torch thread each).
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
TOOL = "calc_gsm8k_reward"


def well_formed(record: dict) -> bool:
    """A tool call the agent loop parsed, naming the tool, with the tool's argument."""
    return (
        bool(record.get("known"))
        and not record.get("error")
        and record.get("name") == TOOL
        and isinstance(record.get("arguments"), dict)
        and "answer" in record["arguments"]
    )


def conversation_stats(rows: list[dict]) -> dict[str, float]:
    """parse_rate, reward, right and calls (tool calls per conversation) of dumped validation conversations."""
    if not rows:
        raise ValueError("no validation conversations")
    parsed, calls = 0, 0
    for row in rows:
        records = [r for turn in row.get("turns") or [] for r in turn.get("calls") or []]
        calls += len(records)
        parsed += bool(records) and all(well_formed(r) for r in records)
    return {
        "parse_rate": parsed / len(rows),
        "reward": sum(r["score"] for r in rows) / len(rows),
        "right": sum(r["score"] > 0 for r in rows) / len(rows),
        "calls": calls / len(rows),
    }


def read_dump(folder: Path, step: int) -> list[dict]:
    path = folder / f"{step}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]


def cli(args: list[str], log: Path, threads: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    with log.open("w") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "verl_npu.cli", *args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    if proc.returncode:
        raise SystemExit(f"verl-npu {' '.join(args[:2])} failed (exit {proc.returncode}); see {log}")


def prepare_data() -> None:
    """The demos' own data files (as `verl-npu run` makes them), before seeds run side by side."""
    sys.path.insert(0, str(REPO))
    from verl_npu.config import load_recipe
    from verl_npu.config.sft import load_sft_recipe
    from verl_npu.demo import prepare_assets, prepare_sft_assets

    prepare_sft_assets(load_sft_recipe("tiny_sft"))
    prepare_assets(load_recipe("tiny_tool_gsm8k"))


def run_seed(seed: int, work: Path, threads: int, sft_steps: int, rl_steps: int) -> dict:
    """The three validations and the training numbers of one seed."""
    folder = work / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    model = f"tiny://qwen2?seed={seed}"
    start = time.time()
    cli(
        [
            "run",
            "tiny_tool_gsm8k",
            f"af_output_dir={folder / 'untrained'}",
            f"actor_rollout_ref.model.path={model}",
            "data.max_response_length=160",
            "trainer.val_only=true",
            "trainer.resume_mode=disable",
            f"trainer.validation_data_dir={folder / 'untrained' / 'validation_data'}",
        ],
        folder / "untrained.log",
        threads,
    )
    cli(
        [
            "run",
            "tiny_tool_demo",
            f"af_output_dir={folder}",
            f"sft.model.path={model}",
            f"sft.trainer.seed={seed}",
            f"sft.trainer.total_training_steps={sft_steps}",
            f"rl.data.seed={seed}",
            f"rl.trainer.total_training_steps={rl_steps}",
            f"rl.trainer.test_freq={rl_steps}",
            f"rl.trainer.save_freq={rl_steps}",
            f"rl.trainer.rollout_data_dir={folder / 'rl' / 'rollout_data'}",
            f"rl.trainer.validation_data_dir={folder / 'rl' / 'validation_data'}",
        ],
        folder / "stages.log",
        threads,
    )
    wall = time.time() - start
    sft_rows = metrics(folder / "sft")
    rl_rows = [r for r in metrics(folder / "rl") if "critic/score/mean" in r]
    scores = [r["critic/score/mean"] for r in rl_rows]
    k = max(1, min(5, len(scores)))
    return {
        "seed": seed,
        "untrained": conversation_stats(read_dump(folder / "untrained" / "validation_data", 0)),
        "sft": conversation_stats(read_dump(folder / "rl" / "validation_data", 0)),
        "rl": conversation_stats(read_dump(folder / "rl" / "validation_data", rl_steps)),
        "sft_loss": next(r["train/loss"] for r in reversed(sft_rows) if "train/loss" in r),
        "rl_score_first": sum(scores[:k]) / k,
        "rl_score_last": sum(scores[-k:]) / k,
        "rl_calls_last": rl_rows[-1].get("tool_call_counts/mean", 0.0),
        "wall_s": wall,
    }


def table(results: list[dict], sft_steps: int, rl_steps: int) -> str:
    head = (
        "| seed | untrained: parse / reward | after SFT: parse / right / reward | after RL: parse / right / reward "
        "| last SFT loss | RL train score, first 5 -> last 5 steps | wall (s) |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in results:
        u, s, a = r["untrained"], r["sft"], r["rl"]
        lines.append(
            f"| {r['seed']} | {u['parse_rate']:.2f} / {u['reward']:.2f} | "
            f"{s['parse_rate']:.2f} / {s['right']:.2f} / {s['reward']:.2f} | "
            f"{a['parse_rate']:.2f} / {a['right']:.2f} / {a['reward']:.2f} | {r['sft_loss']:.3f} | "
            f"{r['rl_score_first']:.2f} -> {r['rl_score_last']:.2f} | {r['wall_s']:.0f} |"
        )
    n = len(results)
    mean = {
        k: {m: sum(r[k][m] for r in results) / n for m in ("parse_rate", "right", "reward")}
        for k in ("untrained", "sft", "rl")
    }
    lines.append(
        f"| mean | {mean['untrained']['parse_rate']:.2f} / {mean['untrained']['reward']:.2f} | "
        f"{mean['sft']['parse_rate']:.2f} / {mean['sft']['right']:.2f} / {mean['sft']['reward']:.2f} | "
        f"{mean['rl']['parse_rate']:.2f} / {mean['rl']['right']:.2f} / {mean['rl']['reward']:.2f} | | | |"
    )
    return (
        f"{sft_steps} SFT steps, {rl_steps} RL steps; greedy validation on the 64 validation problems.\n\n"
        + "\n".join(lines)
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--sft-steps", type=int, default=80, help="SFT steps (the recipe's own: 80)")
    parser.add_argument("--rl-steps", type=int, default=20, help="RL steps (the recipe's own: 20)")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run at a time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (OMP_NUM_THREADS)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/verl_npu_tool_demo"), help="run folders")
    parser.add_argument("--out", type=Path, default=None, help="write the table and the raw numbers here (.md, .json)")
    args = parser.parse_args()
    prepare_data()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(
            pool.map(lambda s: run_seed(s, args.work, args.threads, args.sft_steps, args.rl_steps), args.seeds)
        )
    text = table(results, args.sft_steps, args.rl_steps)
    print(text)
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
        print(f"raw numbers: {args.out.with_suffix('.json')} (the table goes in {args.out} by hand, with its notes)")


if __name__ == "__main__":
    main()
