"""The memory planner's actor-update prediction against real CPU updates (issue 26's accuracy grid).

    python bench/memory_plan.py                     # the grid, a markdown table on stdout
    python bench/memory_plan.py --quick             # 8 points

For every point: a random-init Qwen2 of the given sizes (written once under --models), one real actor
update on the CPU measured by bench/memory_measure.py (torch's MemTracker, the second of two updates),
and the plan of the same settings (`tiny_gsm8k` with the sizes, lengths and micro-batch as overrides,
planned for the CPU: float32). Points marked "fit" are among those the activation coefficients were
fitted on; "held-out" ones (other sizes and lengths, a token budget) were not. One worker only;
no vision tower, LoRA, offload, critic or host figure yet (docs/memory.md, "How right it is").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (name, hidden, intermediate, layers, vocab, in the fit)
MODELS = [
    ("h128", 128, 256, 2, 512, True),
    ("h256", 256, 256, 2, 512, True),
    ("i1024", 128, 1024, 2, 512, True),
    ("l4", 128, 256, 4, 512, True),
    ("v8192", 128, 256, 2, 8192, True),
    ("h192-l3-v2048", 192, 512, 3, 2048, False),
    ("h320-v4096", 320, 864, 2, 4096, False),
]
SHAPES = [(8, 64, 32, True), (4, 160, 32, True), (6, 100, 60, False)]  # rows, prompt, response, in the fit


def build(folder: Path, hidden: int, inter: int, layers: int, vocab: int) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if not (folder / "config.json").is_file():
        heads = max(2, hidden // 32)
        cfg = Qwen2Config(
            hidden_size=hidden,
            intermediate_size=inter,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2),
            vocab_size=vocab,
            tie_word_embeddings=True,
            max_position_embeddings=4096,
        )
        Qwen2ForCausalLM(cfg).save_pretrained(folder)
    return folder


def predict(folder: Path, rows: int, prompt: int, response: int, rmpad: bool, ckpt: bool, extra=()) -> int:
    from verl_npu.config import load_recipe
    from verl_npu.memory.plan import model_size
    from verl_npu.memory.recipe import plan_recipe

    rc = load_recipe(
        "tiny_gsm8k",
        [
            f"actor_rollout_ref.model.path={folder}",
            f"data.max_prompt_length={prompt}",
            f"data.max_response_length={response}",
            "actor_rollout_ref.rollout.n=2",
            f"data.train_batch_size={rows // 2}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={rows // 2}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={rows}",
            f"actor_rollout_ref.model.use_remove_padding={str(rmpad).lower()}",
            f"actor_rollout_ref.model.enable_gradient_checkpointing={str(ckpt).lower()}",
            *extra,
        ],
    )
    size = model_size(json.loads((folder / "config.json").read_text()))
    plan = plan_recipe(rc, 1 << 34, "cpu", {"actor": size}, accelerator=False)
    return next(p for p in plan.phases if p.name == "actor update").total


def host_check(recipe: str, out: Path) -> tuple[float, float]:
    """(planned host GiB, the peak RSS GiB of a real 2-step `verl-npu run` of `recipe` in a child process)."""
    import subprocess

    from verl_npu.config import load_recipe
    from verl_npu.memory.budget import plan_for

    args = [
        f"af_output_dir={out / recipe}",
        "trainer.total_training_steps=2",
        "trainer.resume_mode=disable",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[console]",
    ]
    # a wrapper process of its own per run: its RUSAGE_CHILDREN is this run's peak RSS alone
    wrapper = (
        "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True); "
        "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    done = subprocess.run(
        [sys.executable, "-c", wrapper, sys.executable, "-m", "verl_npu.cli", "run", recipe, *args],
        capture_output=True,
        text=True,
        cwd=out,
    )
    code, kib = done.stdout.split()[-2:]
    if code != "0":
        raise SystemExit(f"the run of {recipe} failed (exit {code}): {done.stderr[-2000:]}")
    plan, _ = plan_for(load_recipe(recipe, args))
    return sum(p.bytes for p in plan.host) / 2**30, int(kib) / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="/tmp/verl_npu_memory_plan_models", help="folder for the models")
    parser.add_argument("--quick", action="store_true", help="8 points only")
    parser.add_argument(
        "--host",
        action="store_true",
        help="instead: the host figure of tiny_gsm8k and tiny_geo3k against a 2-step run's peak RSS",
    )
    args = parser.parse_args()
    if args.host:
        out = Path(args.models) / "host"
        out.mkdir(parents=True, exist_ok=True)
        print("| recipe | planned host GiB | peak RSS GiB | error |\n|---|---|---|---|")
        for recipe in ("tiny_gsm8k", "tiny_geo3k"):
            planned, rss = host_check(recipe, out)
            print(f"| {recipe} | {planned:.2f} | {rss:.2f} | {planned / rss - 1:+.0%} |", flush=True)
        return 0
    from memory_measure import measure_update

    points = [(m, s, rp, ck, "") for m in MODELS for s in SHAPES for rp in (False, True) for ck in (False, True)]
    # a token budget (use_dynamic_bsz) on the held-out models (LoRA: MemTracker hooks every parameter's
    # gradient and refuses peft's frozen base weights, so it is not measured here)
    points += [
        (m, s, rp, ck, "dynamic") for m in MODELS[5:] for s in SHAPES for rp, ck in ((False, False), (True, True))
    ]
    if args.quick:
        points = points[:: len(points) // 8][:8]
    print(
        "| model (H, I, L, V) | rows x (prompt + response) | padding-free | checkpointing | variant | set | "
        "predicted MB | measured MB | error |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    errors = {"fit": [], "held-out": []}
    for (name, h, i, layers, v, fit_m), (rows, p, r, fit_s), rp, ck, variant in points:
        folder = build(Path(args.models) / name, h, i, layers, v)
        measured = measure_update(folder, rows=rows, prompt=p, response=r, remove_padding=rp, checkpointing=ck)["peak"]
        extra = (
            [
                "actor_rollout_ref.actor.use_dynamic_bsz=true",
                f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={rows * (p + r)}",
            ]
            if variant
            else []
        )
        predicted = predict(folder, rows, p, r, rp, ck, extra)
        err = predicted / measured - 1
        kind = "fit" if fit_m and fit_s and not variant else "held-out"
        errors[kind].append(err)
        print(
            f"| {name} ({h}, {i}, {layers}, {v}) | {rows} x ({p} + {r}) | {rp} | {ck} | {variant or '-'} | {kind} | "
            f"{predicted / 1e6:.1f} | {measured / 1e6:.1f} | {err:+.1%} |",
            flush=True,
        )
    for kind, errs in errors.items():
        if errs:
            print(
                f"\n{kind}: {len(errs)} points, median |error| {statistics.median(abs(e) for e in errs):.1%}, "
                f"worst {max(errs, key=abs):+.1%}, within 15%: {sum(abs(e) <= 0.15 for e in errs)}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
