"""On-policy distillation against RL alone on the CPU text demo (issue 38), run by hand; writes a Markdown table.

    python bench/distill_demo.py --teacher outputs/tiny_gsm8k/checkpoints/global_step_300/actor/huggingface \
        --steps 100 --seeds 1 2 3 --out bench/results/distill_gsm8k.md

Two runs of recipes/tiny_distill_gsm8k.yaml from the same start (tiny://qwen2?seed=1, the same data order and
sampling seeds): GRPO + forward_kl_topk distillation from `--teacher` (the text demo's trained model), and
GRPO alone (distillation.enabled=false). For each: critic/score/mean over the first and last 10 steps, the
first step whose 10-step mean reaches 0.5, the last distillation/loss, wall time. The runs go one after the
other (each uses the whole machine), under `--work` (default /tmp/verl_npu_distill_demo).

`--seeds S ...` repeats the pair per seed: the student starts from `tiny://qwen2?seed=S` and the runs use
`data.seed=S` (the data order and sampling; the data files are the text demo's, already made); seed 1 is the
recipe's own start (its data.seed is 0). A mean row closes the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(name: str, work: Path, teacher: str, steps: int, extra: list[str], seed: int = 1) -> tuple[list[dict], float]:
    out = work / f"seed{seed}" / name
    cmd = [
        sys.executable,
        "-m",
        "verl_npu.cli",
        "run",
        "tiny_distill_gsm8k",
        f"af_output_dir={out}",
        f"actor_rollout_ref.model.path=tiny://qwen2?seed={seed}",
        f"data.seed={seed}",
        f"distillation.teacher_models.teacher_model.model_path={teacher}",
        f"trainer.total_training_steps={steps}",
        "trainer.resume_mode=disable",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        *extra,
    ]
    start = time.time()
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "training/global_step" in r], time.time() - start


def summary(rows: list[dict]) -> dict:
    scores = [r["critic/score/mean"] for r in rows]
    means = [sum(scores[max(0, i - 9) : i + 1]) / len(scores[max(0, i - 9) : i + 1]) for i in range(len(scores))]
    reached = next((i + 1 for i, m in enumerate(means) if i >= 9 and m >= 0.5), None)
    return {
        "first10": sum(scores[:10]) / 10,
        "last10": sum(scores[-10:]) / 10,
        "reached": reached,
        "distill_loss": rows[-1].get("distillation/loss"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", required=True, help="the teacher's model folder (the text demo's export)")
    parser.add_argument("--steps", type=int, default=100, help="training steps of each run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="student seeds (1: the recipe's own)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/verl_npu_distill_demo"), help="run folders")
    parser.add_argument("--out", type=Path, default=None, help="Markdown table to write (default: print it)")
    args = parser.parse_args()
    lines = [
        "| seed | run | score, first 10 steps | score, last 10 steps | first step with a 10-step mean >= 0.5 | "
        "last distillation/loss | wall time (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    last: dict[str, list[float]] = {}
    for seed in args.seeds:
        for name, extra in (("distill", []), ("rl_only", ["distillation.enabled=false"])):
            rows, wall = run(name, args.work, args.teacher, args.steps, extra, seed)
            s = summary(rows)
            last.setdefault(name, []).append(s["last10"])
            loss = "-" if s["distill_loss"] is None else f"{s['distill_loss']:.3f}"
            lines.append(
                f"| {seed} | {name} | {s['first10']:.3f} | {s['last10']:.3f} | "
                f"{s['reached'] or 'not reached'} | {loss} | {wall:.0f} |"
            )
    for name, values in last.items():
        lines.append(f"| mean | {name} | | {sum(values) / len(values):.3f} | | | |")
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
