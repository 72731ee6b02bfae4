"""Benchmark: a verl-npu GRPO step against TRL's GRPOTrainer on the same task, back to back.

Both trainers get the same inputs: one tiny random-init model folder (`tiny://qwen25vl` for the
picture task, `tiny://qwen2` for the text task), one parquet (synthetic polygons relabelled as
`hiyouga/geometry3k`, so both score with verl's geometry3k rule; or `data_prep/gsm8k.py
--synthetic N` word problems, scored by verl's rule for their data source), the same prompts per
step in the same order (no shuffling on either side: 8 prompts x 4 samples), up to 32 new tokens,
fp32, no KL term, the same learning rate (constant, no weight decay), one optimizer step per
batch (one mini-batch, one epoch), the transformers model decoding with a KV cache on both sides
(TRL: `generate`; verl-npu: its `hf` rollout's decode loop), one CPU process each, the same
number of torch threads. Each trainer runs in its own child process (so peak RSS is its own).
verl-npu runs with its default layout, padding-free (`use_remove_padding=true`, as verl's own example
scripts set it: each distinct prompt packed once, `docs/performance.md`); `--padded` runs it padded.

Reported per side: the median step seconds over steps 3..N (all steps with --smoke), completion
tokens per second (completion tokens / step seconds over the same steps), peak RSS, the phases of
the median step (verl-npu: its `timing_s/*` metrics; TRL: timers around its own methods, see
`trl_side`), and the ratio verl-npu / TRL (goal: <= 0.67).

Usage:  python bench/vs_trl.py [--task vl|text] [--steps 10] [--smoke] [--threads 1]
                               [--padded] [--json FILE]
TRL is a benchmark-only dependency (`pip install -e .[bench]`); without it --smoke runs the
verl-npu side only. Results are recorded by hand in bench/results/vs_trl.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPTS, SAMPLES, NEW_TOKENS, LR, SEED = 8, 4, 32, 1e-5, 1
MODELS = {"vl": "tiny://qwen25vl", "text": "tiny://qwen2"}
RECIPES = {"vl": "tiny_geo3k", "text": "tiny_gsm8k"}


# ---------------------------------------------------------------------------- shared inputs
def prepare_inputs(task: str, steps: int, work: Path) -> tuple[Path, Path]:
    """The model folder and the data folder (train.parquet, test.parquet) both trainers read."""
    from verl_npu.models.tiny import materialize

    model = Path(materialize(MODELS[task], cache_dir=work / "models"))
    data = work / "data"
    rows = PROMPTS * steps
    if task == "vl":
        import pyarrow as pa
        import pyarrow.parquet as pq

        from verl_npu.data.geometry3k import prepare_synthetic

        prepare_synthetic(data, n_train=rows, n_test=2, seed=0, image_size=56)
        for split in ("train", "test"):  # verl's geometry3k rule on both sides
            table = pq.read_table(data / f"{split}.parquet")
            column = pa.array(["hiyouga/geometry3k"] * table.num_rows)
            pq.write_table(
                table.set_column(table.schema.get_field_index("data_source"), "data_source", column),
                data / f"{split}.parquet",
            )
    else:
        subprocess.run(
            [
                sys.executable,
                str(REPO / "data_prep" / "gsm8k.py"),
                "--synthetic",
                str(rows),
                "--local_save_dir",
                str(data),
            ],
            check=True,
            cwd=REPO,
            capture_output=True,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
    return model, data


def score(data_sources, texts, ground_truths) -> list[float]:
    from verl_npu.rewards import default_compute_score

    scores = [default_compute_score(src, text, gt) for src, text, gt in zip(data_sources, texts, ground_truths)]
    return [float(s["score"] if isinstance(s, dict) else s) for s in scores]  # a dict carries extras too


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ---------------------------------------------------------------------------- verl-npu
def verl_side(task: str, steps: int, model: Path, data: Path, out: Path, remove_padding: bool) -> dict:
    """Runs verl-npu in this process; per-step seconds and phases come from its metrics.jsonl."""
    from verl_npu.config import load_recipe
    from verl_npu.trainer.entry import run_training

    overrides = {
        "af_output_dir": out,
        "data.train_files": data / "train.parquet",
        "data.val_files": data / "test.parquet",
        "data.train_batch_size": PROMPTS,
        "data.max_response_length": NEW_TOKENS,
        "data.max_prompt_length": 128,
        "data.shuffle": "false",
        "data.seed": SEED,
        "actor_rollout_ref.model.path": model,
        "actor_rollout_ref.model.use_remove_padding": str(remove_padding).lower(),
        "actor_rollout_ref.actor.ppo_mini_batch_size": PROMPTS,  # one optimizer step per batch
        "actor_rollout_ref.actor.ppo_epochs": 1,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": PROMPTS * SAMPLES,
        "actor_rollout_ref.actor.use_kl_loss": "false",
        "actor_rollout_ref.actor.optim.lr": LR,
        "actor_rollout_ref.actor.optim.warmup_style": "constant",
        "actor_rollout_ref.actor.optim.weight_decay": 0.0,
        "actor_rollout_ref.rollout.n": SAMPLES,
        "actor_rollout_ref.rollout.temperature": 1.0,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": PROMPTS * SAMPLES,
        "algorithm.use_kl_in_reward": "false",
        "trainer.total_training_steps": steps,
        "trainer.save_freq": -1,
        "trainer.test_freq": -1,
        "trainer.val_before_train": "false",
        "trainer.logger": "[console]",
    }
    code = run_training(load_recipe(RECIPES[task], [f"{k}={v}" for k, v in overrides.items()]))
    if code != 0:
        raise SystemExit(f"verl-npu run failed with exit code {code}; see {out}/logs/run.log")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "timing_s/step" in r]
    return {
        "step_s": [r["timing_s/step"] for r in rows],
        "completion_tokens": [r["response_length/mean"] * PROMPTS * SAMPLES for r in rows],
        "phases": [{k[len("timing_s/") :]: v for k, v in r.items() if k.startswith("timing_s/")} for r in rows],
        "score": [r["critic/score/mean"] for r in rows],
    }


# ---------------------------------------------------------------------------- TRL
def trl_dataset(task: str, data: Path):
    """verl's parquet as TRL rows: the conversational prompt (images as an `image` column, the
    `<image>` placeholder dropped: TRL puts the image before the text, where verl's prompts have it)."""
    import io

    import pyarrow.parquet as pq
    from datasets import Dataset, Features, Image, List, Value

    rows = pq.read_table(data / "train.parquet").to_pylist()
    out = {"prompt": [], "data_source": [], "ground_truth": []}
    if task == "vl":
        from PIL import Image as PILImage

        out["image"] = []
    for row in rows:
        messages = [{"role": m["role"], "content": m["content"].replace("<image>", "")} for m in row["prompt"]]
        out["prompt"].append(messages)
        out["data_source"].append(row["data_source"])
        out["ground_truth"].append(str(row["reward_model"]["ground_truth"]))
        if task == "vl":
            out["image"].append(PILImage.open(io.BytesIO(row["images"][0]["bytes"])).convert("RGB"))
    features = {
        "prompt": List({"role": Value("string"), "content": Value("string")}),
        "data_source": Value("string"),
        "ground_truth": Value("string"),
    }
    if task == "vl":
        features["image"] = Image()
    return Dataset.from_dict(out, features=Features(features))


def trl_side(task: str, steps: int, model_path: Path, data: Path, out: Path) -> dict:
    """Runs TRL's GRPOTrainer in this process. Phases: `gen` = its `_generate` (tokenize + HF
    generate), `reward` = `_calculate_rewards`, `prepare` = `_generate_and_score_completions`
    (gen + reward + advantages + any extra log-prob pass), `loss_forward` = `compute_loss`, and
    `backward_optim` = the rest of the step (backward, clipping, optimizer)."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoProcessor,
        AutoTokenizer,
        TrainerCallback,
    )
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(SEED)
    if task == "vl":
        model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32)
        processing = AutoProcessor.from_pretrained(model_path)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        processing = AutoTokenizer.from_pretrained(model_path)

    def reward(prompts, completions, data_source, ground_truth, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return score(data_source, texts, ground_truth)

    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=PROMPTS * SAMPLES,
        num_generations=SAMPLES,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        max_completion_length=NEW_TOKENS,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        beta=0.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_steps=steps,
        use_cpu=True,
        bf16=False,
        fp16=False,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        shuffle_dataset=False,
        seed=SEED,
        dataloader_num_workers=0,
        gradient_checkpointing=False,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=trl_dataset(task, data), processing_class=processing
    )
    phase: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phase[name] = phase.get(name, 0.0) + time.perf_counter() - start

        return wrapper

    for name, attr in (
        ("gen", "_generate"),
        ("reward", "_calculate_rewards"),
        ("prepare", "_generate_and_score_completions"),
        ("loss_forward", "compute_loss"),
    ):
        setattr(trainer, attr, timed(name, getattr(trainer, attr)))
    result = {"step_s": [], "completion_tokens": [], "phases": [], "score": []}

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            phase.clear()
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            step = time.perf_counter() - self.start
            result["step_s"].append(step)
            done = {k: v for k, v in phase.items()}
            done["backward_optim"] = step - done.get("prepare", 0.0) - done.get("loss_forward", 0.0)
            done["step"] = step
            result["phases"].append(done)

        def on_log(self, args, state, control, logs=None, **k):
            if logs and "completions/mean_length" in logs:
                result["completion_tokens"].append(logs["completions/mean_length"] * PROMPTS * SAMPLES)
                result["score"].append(logs.get("reward", float("nan")))

    trainer.add_callback(Clock())
    trainer.train()
    return result


# ---------------------------------------------------------------------------- driver
def summarize(side: dict, first: int) -> dict:
    steps = side["step_s"][first:]
    tokens = side["completion_tokens"][first:]
    median = statistics.median(steps)
    closest = min(range(len(steps)), key=lambda i: abs(steps[i] - median)) + first
    return {
        "median_step_s": median,
        "completion_tokens_per_s": sum(tokens) / sum(steps),
        "peak_rss_mb": side["peak_rss_mb"],
        "phases_of_median_step": {k: round(v, 4) for k, v in side["phases"][closest].items()},
        "steps": len(side["step_s"]),
        "mean_score": statistics.fmean(side["score"]) if side["score"] else float("nan"),
    }


def child(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    if args.side == "verl":
        result = verl_side(args.task, args.steps, Path(args.model), Path(args.data), work / "verl", not args.padded)
    else:
        result = trl_side(args.task, args.steps, Path(args.model), Path(args.data), work / "trl")
    result["peak_rss_mb"] = peak_rss_mb()
    Path(args.result).write_text(json.dumps(result))


def trl_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("trl") is not None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", choices=["vl", "text"], default="vl", help="picture task (tiny Qwen2.5-VL) or text")
    parser.add_argument("--steps", type=int, default=10, help="training steps per side (median over steps 3..N)")
    parser.add_argument(
        "--smoke", action="store_true", help="2 steps per side (verl-npu only without TRL); no timing goal"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads in each trainer process (1: stable on a shared machine)"
    )
    parser.add_argument("--padded", action="store_true", help="verl-npu with use_remove_padding=false (default: true)")
    parser.add_argument("--sides", default="verl,trl", help="comma-separated: verl, trl")
    parser.add_argument("--json", help="also write the summary here")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    for hidden in ("--model", "--data", "--work", "--result"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        child(args)
        return 0
    steps = 2 if args.smoke else args.steps
    if steps < 3 and not args.smoke:
        parser.error("--steps must be at least 3 (the median is over steps 3..N)")
    sides = [s for s in args.sides.split(",") if s]
    if "trl" in sides and not trl_available():
        if not args.smoke:
            raise SystemExit("TRL is not installed: pip install -e .[bench] (or run --smoke for verl-npu only)")
        print("TRL is not installed: running the verl-npu side only")
        sides.remove("trl")
    load = os.getloadavg()
    summary = {
        "task": args.task,
        "steps": steps,
        "threads": args.threads,
        "remove_padding": not args.padded,
        "loadavg_before": [round(x, 2) for x in load],
        "sides": {},
    }
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp:
        work = Path(tmp)
        model, data = prepare_inputs(args.task, steps, work)
        env = dict(
            os.environ,
            PYTHONPATH=str(REPO),
            OMP_NUM_THREADS=str(args.threads),
            VERL_NPU_CACHE=str(work / "models"),
            TOKENIZERS_PARALLELISM="false",
        )
        for side in sides:
            result = work / f"{side}.json"
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--side",
                side,
                "--task",
                args.task,
                "--steps",
                str(steps),
                "--threads",
                str(args.threads),
                "--model",
                str(model),
                "--data",
                str(data),
                "--work",
                str(work),
                "--result",
                str(result),
            ] + (["--padded"] if args.padded else [])
            proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
                raise SystemExit(f"the {side} side failed (exit {proc.returncode})")
            summary["sides"][side] = summarize(json.loads(result.read_text()), 0 if args.smoke else 2)
    summary["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    if {"verl", "trl"} <= set(summary["sides"]):
        summary["ratio_verl_over_trl"] = (
            summary["sides"]["verl"]["median_step_s"] / summary["sides"]["trl"]["median_step_s"]
        )
    print_summary(summary)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0


def print_summary(summary: dict) -> None:
    print(
        f"task {summary['task']}, {summary['steps']} steps, {PROMPTS} prompts x {SAMPLES} samples, "
        f"<= {NEW_TOKENS} new tokens, {summary['threads']} threads, remove_padding={summary['remove_padding']}, "
        f"load average before {summary['loadavg_before']} after {summary['loadavg_after']}"
    )
    print("| side | median step s | completion tokens/s | peak RSS MB | mean score | phases of the median step (s) |")
    print("|---|---|---|---|---|---|")
    for name, s in summary["sides"].items():
        phases = ", ".join(f"{k} {v:.3f}" for k, v in s["phases_of_median_step"].items())
        print(
            f"| {name} | {s['median_step_s']:.3f} | {s['completion_tokens_per_s']:.0f} | {s['peak_rss_mb']:.0f} "
            f"| {s['mean_score']:.3f} | {phases} |"
        )
    if "ratio_verl_over_trl" in summary:
        print(f"ratio verl-npu / TRL median step: {summary['ratio_verl_over_trl']:.3f} (goal <= 0.67)")


if __name__ == "__main__":
    sys.exit(main())
