"""bench/cuda_check.py's log-prob parity check, and its checks of the stages beyond one RL run: SFT (with resume, then RL from its export),
on-policy distillation, activation offload, the torch_memory profiler and the model through shared memory.

Each function runs in a `--check NAME` process of cuda_check.py (declared in `MORE_CHECKS`, appended to its
CHECKS), with the same Context, tiny local models and synthetic data, on the device or, with `--device cpu`,
on the CPU (torch_memory is an accelerator tool: on the CPU that check asserts the validator refuses it)."""

from __future__ import annotations

import json
import math
import pickle
import shutil
import sys
from pathlib import Path

import cuda_check as cc

A = "actor_rollout_ref.actor"
DISTILL = [
    "distillation.enabled=true",
    "distillation.teacher_models.teacher_model.model_path=tiny://qwen2?seed=1",
    "distillation.distillation_loss.use_task_rewards=true",
    "distillation.distillation_loss.distillation_loss_coef=1.0",
]
PROFILE = [
    "global_profiler.tool=torch_memory",
    "global_profiler.steps=[2]",
    f"{A}.profiler.enable=true",
    f"{A}.profiler.all_ranks=true",
]


def setup(ctx: cc.Context) -> None:
    """What the checks below share, made once before they run in parallel: the distillation teacher."""
    from verl_npu.models.tiny import materialize

    materialize(DISTILL[1].split("=", 1)[1], cache_dir=ctx.work / "cache")


def _sft_args(ctx: cc.Context, out: Path, steps: int) -> list[str]:
    data = ctx.work / "data" / "tiny_sft"
    return [
        f"af_output_dir={out}",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}",
        f"trainer.device={ctx.device}",
        "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=2",
        "trainer.test_freq=2",
        "trainer.logger=[console]",
        "trainer.resume_mode=auto",
    ]


def _sft(ctx: cc.Context, args: list[str]) -> str:
    code, output = cc.run_process(
        [sys.executable, "-m", "verl_npu.cli", "sft", "tiny_sft", "--demo-data", *args], ctx.env, 280
    )
    if code != 0:
        raise RuntimeError(f"verl-npu sft tiny_sft exited {code}:\n" + cc.tail(output))
    return output


def check_sft(ctx: cc.Context) -> dict:
    """SFT 4 steps (checkpoints at 2, 4), resumed to 6; the loss falls; then 2 RL steps from its export."""
    out = cc.run_folder(ctx)
    _sft(ctx, _sft_args(ctx, out, 4))
    second = _sft(ctx, _sft_args(ctx, out, 6))
    assert "global_step_4" in second, "the second SFT run did not name global_step_4:\n" + cc.tail(second)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if "train/loss" in r]
    steps = [r["step"] for r in train]
    assert steps == [1, 2, 3, 4, 5, 6], f"SFT metrics.jsonl train steps {steps}"
    losses = [r["train/loss"] for r in train]
    assert all(v == v and abs(v) < 1e6 for v in losses), f"non-finite SFT loss {losses}"
    assert losses[-1] < losses[0], f"the SFT loss did not fall over 6 steps: {losses}"
    ckpts = out / "checkpoints"
    assert (ckpts / "latest_checkpointed_iteration.txt").read_text().strip() == "6"
    export = next(
        (
            p.parent
            for p in (ckpts / "global_step_6").rglob("config.json")
            if (p.parent / "model.safetensors").is_file()
        ),
        None,
    )
    assert export is not None, f"no huggingface export under {ckpts / 'global_step_6'}"
    ctx.found.update(sft_losses=losses, export=str(export))
    rl = out.with_name(ctx.name + "-rl")  # beside the SFT run's folder (run_folder would empty that)
    shutil.rmtree(rl, ignore_errors=True)
    done = cc.train(
        ctx, "tiny_gsm8k", cc.small_overrides(ctx, "tiny_gsm8k", rl, 2) + [f"actor_rollout_ref.model.path={export}"]
    )
    rl_rows = cc.training_rows(rl)
    cc.assert_finite(rl_rows)
    return {
        "sft_losses": [round(v, 4) for v in losses],
        "sft_export": str(export.relative_to(out)),
        "rl_from_sft": cc.run_numbers(rl_rows, done["report"], done["seconds"]),
    }


def check_distill(ctx: cc.Context, mode: str, extra: tuple = ()) -> dict:
    """2 GRPO steps with the teacher scoring the student's samples (distillation_loss.loss_mode=mode)."""
    out = cc.run_folder(ctx)
    args = (
        cc.small_overrides(ctx, "tiny_gsm8k", out, 2)
        + DISTILL
        + [f"distillation.distillation_loss.loss_mode={mode}", *extra]
    )
    done = cc.train(ctx, "tiny_gsm8k", args)
    rows = cc.training_rows(out)
    cc.assert_finite(rows)
    assert all("distillation/loss" in r for r in rows), f"no distillation/loss: {sorted(rows[0])}"
    return {
        **cc.run_numbers(rows, done["report"], done["seconds"]),
        "distillation/loss": [round(r["distillation/loss"], 4) for r in rows],
    }


def check_memory_profile(ctx: cc.Context) -> dict:
    """torch_memory over step 2: the caching allocator's history dumped as memory_snapshot.pickle per rank."""
    out = cc.run_folder(ctx)
    args = cc.small_overrides(ctx, "tiny_gsm8k", out, 2) + PROFILE
    if ctx.device == "cpu":  # the tool needs a device allocator: the validator must refuse it by name
        code, output = cc.run_process(
            [sys.executable, "-m", "verl_npu.cli", "validate", "tiny_gsm8k", *args], ctx.env, 120
        )
        assert code != 0 and "torch_memory profiler" in output, "torch_memory on cpu was not refused:\n" + output
        return {"refused_on_cpu": True}
    done = cc.train(ctx, "tiny_gsm8k", args)
    snapshots = sorted(out.rglob("memory_snapshot.pickle"))
    assert snapshots, f"no memory_snapshot.pickle under {out}"
    with open(snapshots[0], "rb") as f:
        snap = pickle.load(f)
    events = sum(len(t) for t in snap.get("device_traces", []))
    assert snap.get("segments") and events > 0, "the snapshot holds no segments or no allocation events"
    return {
        **cc.run_numbers(cc.training_rows(out), done["report"], done["seconds"]),
        "snapshots": [str(p.relative_to(out)) for p in snapshots],
        "trace_events": events,
        "segments": len(snap["segments"]),
    }


def check_parity(ctx: cc.Context) -> dict:
    """Log-probs and entropies of one batch through `response_log_probs`, the actor's forward."""
    import memory_grid
    import torch

    from verl_npu.device import detect_device
    from verl_npu.models.forward import response_log_probs
    from verl_npu.models.loading import load_policy_model

    model_dir = memory_grid.build_model(ctx.work / "memory" / "models", "lm", memory_grid.MID)
    device = detect_device(ctx.device)
    g = torch.Generator().manual_seed(0)
    rows, prompt, response = 6, 24, 12
    ids = torch.randint(0, 400, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    for r in range(rows):  # left-padded prompts and right-padded responses of different lengths
        mask[r, : r * 3] = 0
        mask[r, prompt + response - r :] = 0
    ids = ids * mask
    resp = mask[:, prompt:].bool()

    def forward(model, dev, remove_padding, autocast_dtype=None):
        with torch.no_grad(), torch.autocast(dev.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            lp, ent = response_log_probs(
                model, ids.to(dev), mask.to(dev), response, with_entropy=True, remove_padding=remove_padding
            )
        return lp.float().cpu()[resp], ent.float().cpu()[resp]

    cpu_model = load_policy_model(str(model_dir), dtype=torch.float32).eval()
    reference = forward(cpu_model, torch.device("cpu"), False)
    dev = device.torch_device()
    fp32 = load_policy_model(str(model_dir), dtype=torch.float32, attn_implementation=device.attn_implementation())
    fp32 = fp32.to(dev).eval()
    bf16 = load_policy_model(str(model_dir), dtype=torch.bfloat16, attn_implementation=device.attn_implementation())
    bf16 = bf16.to(dev).eval()
    cases = {
        "cpu fp32": (cpu_model, torch.device("cpu"), None, 1e-4),
        "device fp32": (fp32, dev, None, 1e-3),
        "device bf16 autocast (actor)": (fp32, dev, torch.bfloat16, 0.25),
        "device bf16 weights (reference)": (bf16, dev, None, 0.25),
    }
    out, bad = ctx.found, []
    for name, (model, where, dtype, limit) in cases.items():
        for remove_padding in (False, True):
            lp, ent = forward(model, where, remove_padding, dtype)
            key = f"{name}, {'padding-free' if remove_padding else 'padded'}"
            out[key] = {
                "logprob_max_abs": float((lp - reference[0]).abs().max()),
                "entropy_max_abs": float((ent - reference[1]).abs().max()),
            }
            if max(out[key].values()) > limit or not all(map(math.isfinite, out[key].values())):
                bad.append((key, out[key], limit))
    out["reference_logprob_mean"] = float(reference[0].mean())
    out["reference_entropy_mean"] = float(reference[1].mean())
    assert not bad, f"differences over the limit: {bad}"
    return out


def check_master_bf16(ctx: cc.Context) -> dict:
    """actor.fsdp_config.model_dtype=bf16: 2 steps with the actor's master weights in bfloat16."""
    numbers = cc.check_run(ctx, "tiny_gsm8k", 2, ("actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",))
    assert numbers["actor"]["param_dtypes"] == ["torch.bfloat16"], f"actor weights {numbers['actor']['param_dtypes']}"
    return numbers


MORE_CHECKS = [
    cc.Check(
        "sft",
        "cuda_check_more:check_sft",
        420,
        True,
        "verl-npu sft tiny_sft 4 steps, resumed to 6 (steps "
        "1-6 once), loss finite and falling, a huggingface export; then 2 RL steps starting from it",
    ),
    cc.Check(
        "distill-topk",
        "cuda_check_more:check_distill",
        240,
        True,
        "on-policy distillation, forward_kl_topk (top-16): " + cc.FINITE + ", distillation/loss logged",
        ("forward_kl_topk", ("distillation.distillation_loss.topk=16",)),
    ),
    cc.Check(
        "distill-k3",
        "cuda_check_more:check_distill",
        240,
        False,
        "on-policy distillation, k3 as a policy-gradient term: " + cc.FINITE + ", distillation/loss logged",
        ("k3", ("distillation.distillation_loss.use_policy_gradient=true",)),
    ),
    cc.Check(
        "act-offload",
        "check_run",
        240,
        False,
        "activation offload with gradient checkpointing: " + cc.FINITE,
        (
            "tiny_gsm8k",
            2,
            (
                "actor_rollout_ref.model.enable_activation_offload=true",
                "actor_rollout_ref.model.enable_gradient_checkpointing=true",
            ),
        ),
    ),
    cc.Check(
        "profile-memory",
        "cuda_check_more:check_memory_profile",
        240,
        True,
        "global_profiler.tool=torch_memory "
        "over step 2: memory_snapshot.pickle with segments and allocation events (on cpu: refused by name)",
    ),
    cc.Check(
        "shm",
        "check_run",
        240,
        False,
        "actor model loaded from a copy in /dev/shm (model.use_shm): " + cc.FINITE,
        ("tiny_gsm8k", 2, ("actor_rollout_ref.model.use_shm=true",)),
    ),
    cc.Check(
        "master-bf16",
        "cuda_check_more:check_master_bf16",
        240,
        False,
        "actor.fsdp_config.model_dtype=bf16: 2 steps, every metric finite, the actor's weights bfloat16",
    ),
]
