"""Checkpoints interchangeable with upstream verl 0.9.1 (issue 15), checked with verl's own code.

verl pins its own torch and transformers, so it lives in a side venv (`.venv-verl`, built by
tests/verl_side.sh, which sets VERL_SIDE_PYTHON and runs these tests: `pytest -m verl_side`).
verl runs there as a subprocess; verl-npu runs here. Checked:
- verl's model merger (`python -m verl.model_merger merge --backend fsdp`) reads verl-npu's 1- and
  2-worker checkpoints of the tiny demo into the weights of verl-npu's own `huggingface/` export
  (same keys; the merger always writes bfloat16: equal to the export cast to bfloat16), and the
  critic's checkpoint of a PPO run into the critic's export (value head included), and a LoRA
  actor's checkpoint into its base weights and peft adapter, both equal to ours;
- verl's `FSDPCheckpointManager.load_checkpoint` reads them into an FSDP2 model, AdamW and LR
  schedule (weights equal to the export exactly);
- a checkpoint written by verl's `FSDPCheckpointManager` (plus verl's trainer's `data.pt` and
  marker) resumes in verl-npu at the same world size: weights, AdamW moments, LR schedule, step,
  and the data position (exact without shuffling; with shuffling the epoch starts over, warned).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from run_helpers import (
    run_overrides,
    step_metrics,
    text_data,
    text_run_overrides,
    verl_side_python,
    write_varied_reward,
)
from safetensors.torch import load_file

from verl_npu.config import load_recipe
from verl_npu.trainer.checkpoint import load_torch
from verl_npu.trainer.entry import run_training

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tests" / "helpers" / "verl_side_tool.py"
VERL_PY = verl_side_python()

pytestmark = [pytest.mark.verl_side, pytest.mark.slow]


def side(*args: str, timeout: int = 300) -> str:
    """Run `args` with the side venv's python (no PYTHONPATH: verl-npu is not importable there)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([VERL_PY, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args[:3]} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc.stdout + proc.stderr


def torchrun(nproc: int, *args: str) -> str:
    return side("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), str(TOOL), *args)


def safetensors_of(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


def in_memory_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    """The weights of a Hugging Face folder under the model's own parameter names (transformers
    renames some keys between the file and the module)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(hf_dir)
    auto = AutoModelForCausalLM if config.architectures[0].endswith("ForCausalLM") else AutoModelForImageTextToText
    return auto.from_pretrained(hf_dir, dtype=torch.float32).state_dict()


# ---- verl-npu -> verl ---------------------------------------------------------------------------
_RUNS: dict[int, Path] = {}


def our_checkpoint(workers: int, geo_data: Path, root: Path) -> Path:
    """`global_step_1/actor` of a 1-step tiny_geo3k run on `workers` workers (once per module)."""
    if workers not in _RUNS:
        out = root / f"ours{workers}"
        values = {
            "af_output_dir": out,
            "data.train_files": geo_data / "train.parquet",
            "custom_reward_function.path": write_varied_reward(root / "varied_reward.py"),
            "data.val_files": geo_data / "test.parquet",
            "data.train_batch_size": 4,
            "data.max_response_length": 3,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
            "actor_rollout_ref.actor.optim.lr": 1e-3,
            "actor_rollout_ref.rollout.n": 2,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
            "trainer.total_training_steps": 1,
            "trainer.save_freq": 1,
            "trainer.test_freq": -1,
            "trainer.val_before_train": "false",
            "trainer.logger": "[console]",
            "ray_init.num_cpus": 2,
            "trainer.n_gpus_per_node": workers,
        }
        assert run_training(load_recipe("tiny_geo3k", [f"{k}={v}" for k, v in values.items()])) == 0
        _RUNS[workers] = out / "checkpoints" / "global_step_1" / "actor"
    return _RUNS[workers]


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.mark.parametrize("workers", [1, 2], ids=["1-worker", "2-workers"])
def test_verl_model_merger_reads_our_checkpoint(workers, geo_data, runs_root, tiny_cache, tmp_path):
    actor = our_checkpoint(workers, geo_data, runs_root)
    # every file verl writes there, under verl's names, with verl's contents
    assert json.loads((actor / "fsdp_config.json").read_text()) == {"FSDP_version": 2, "world_size": workers}
    for rank in range(workers):
        for kind in ("model", "optim", "extra_state"):
            assert (actor / f"{kind}_world_size_{workers}_rank_{rank}.pt").is_file()
    for name in (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "processor_config.json",
        "model.safetensors",
    ):
        assert (actor / "huggingface" / name).is_file(), name
    shards = load_torch(actor / f"model_world_size_{workers}_rank_0.pt")
    meshes = {v.device_mesh.mesh_dim_names for v in shards.values() if hasattr(v, "device_mesh")}
    assert meshes == {("fsdp",)}
    extra = load_torch(actor / f"extra_state_world_size_{workers}_rank_0.pt")
    assert set(extra) == {"lr_scheduler", "rng"} and {"cpu", "numpy", "random"} <= set(extra["rng"])
    assert extra["lr_scheduler"]["last_epoch"] == 1

    target = tmp_path / "merged"
    side(
        "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(actor), "--target_dir", str(target)
    )
    merged, ours = safetensors_of(target), safetensors_of(actor / "huggingface")
    assert sorted(merged) == sorted(ours)
    assert {t.dtype for t in merged.values()} == {torch.bfloat16}  # verl's merger always writes bf16
    diff = max(float((merged[k].float() - ours[k].to(torch.bfloat16).float()).abs().max()) for k in ours)
    assert diff == 0.0
    assert any(float(t.abs().sum()) > 0 for t in merged.values())


def test_verl_model_merger_reads_our_critic_checkpoint(runs_root, tiny_cache, tmp_path):
    """The critic's checkpoint of a PPO run (GAE, `global_step_N/critic` beside `actor`) is read by
    verl's merger into the weights of the critic's own `huggingface/` export (a token-classification
    model with one label: the value head)."""
    data = text_data(runs_root / "ppo_data")
    out = runs_root / "ppo"
    values = {  # the text run of run_helpers, with GAE and a critic, one step and its checkpoint
        "data.max_response_length": 3,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
        "algorithm.adv_estimator": "gae",
        "critic.optim.lr": 1e-3,
        "critic.ppo_micro_batch_size_per_gpu": 2,
        "trainer.total_training_steps": 1,
        "trainer.save_freq": 1,
        "ray_init.num_cpus": 2,
    }
    assert run_training(load_recipe("tiny_geo3k", text_run_overrides(out, data, **values))) == 0
    critic = out / "checkpoints" / "global_step_1" / "critic"
    assert json.loads((critic / "fsdp_config.json").read_text()) == {"FSDP_version": 2, "world_size": 1}
    for kind in ("model", "optim", "extra_state"):
        assert (critic / f"{kind}_world_size_1_rank_0.pt").is_file()
    for name in ("config.json", "tokenizer_config.json", "model.safetensors"):
        assert (critic / "huggingface" / name).is_file(), name
    target = tmp_path / "merged_critic"
    side(
        "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(critic), "--target_dir", str(target)
    )
    merged, ours = safetensors_of(target), safetensors_of(critic / "huggingface")
    assert sorted(merged) == sorted(ours) and any("score" in k for k in ours)  # the value head is there
    diff = max(float((merged[k].float() - ours[k].to(torch.bfloat16).float()).abs().max()) for k in ours)
    assert diff == 0.0


def test_verl_model_merger_reads_our_lora_checkpoint(runs_root, tiny_cache, tmp_path):
    """A LoRA actor's checkpoint (peft names, `lora_train_meta.json`): verl's merger writes the base
    weights and the adapter as a peft folder; both equal ours exactly (in the bfloat16 it writes):
    the base to the base layers of our shards, the adapter (keys, rank, alpha) to our
    `huggingface/lora_adapter/`."""
    data = text_data(runs_root / "lora_data")
    out = runs_root / "lora"
    values = {  # the text run of run_helpers, with LoRA adapters, one step and its checkpoint
        "data.max_response_length": 3,
        "actor_rollout_ref.model.lora_rank": 4,
        "actor_rollout_ref.model.lora_alpha": 8,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
        "trainer.total_training_steps": 1,
        "trainer.save_freq": 1,
    }
    assert run_training(load_recipe("tiny_geo3k", text_run_overrides(out, data, **values))) == 0
    actor = out / "checkpoints" / "global_step_1" / "actor"
    assert json.loads((actor / "lora_train_meta.json").read_text()) == {
        "r": 4,
        "lora_alpha": 8,
        "task_type": "CAUSAL_LM",
    }
    target = tmp_path / "merged_lora"
    side(
        "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(actor), "--target_dir", str(target)
    )
    shards = load_torch(actor / "model_world_size_1_rank_0.pt")
    assert all(name.startswith("base_model.model.") for name in shards)  # peft's names, as verl's files
    base = {
        name.removeprefix("base_model.model.").replace(".base_layer.", "."): t.full_tensor()
        for name, t in shards.items()
        if "lora_" not in name
    }
    merged = safetensors_of(target)
    assert set(merged) <= set(base) and set(base) - set(merged) <= {"lm_head.weight"}  # tied to the embeddings
    assert max(float((merged[k].float() - base[k].to(torch.bfloat16).float()).abs().max()) for k in merged) == 0.0
    theirs = safetensors_of(target / "lora_adapter")
    ours = safetensors_of(actor / "huggingface" / "lora_adapter")
    assert sorted(theirs) == sorted(ours) and len(ours) > 0
    assert max(float((theirs[k].float() - ours[k].to(theirs[k].dtype).float()).abs().max()) for k in ours) == 0.0
    adapter = json.loads((target / "lora_adapter" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"]) == (4, 8)


@pytest.mark.parametrize("workers", [1, 2], ids=["1-worker", "2-workers"])
def test_verl_checkpoint_manager_loads_our_checkpoint(workers, geo_data, runs_root, tiny_cache, tmp_path):
    actor = our_checkpoint(workers, geo_data, runs_root)
    reference = tmp_path / "loaded.pt"
    torchrun(workers, "load", "--actor-dir", str(actor), "--reference", str(reference))
    loaded = torch.load(reference, weights_only=False)
    expected = in_memory_weights(actor / "huggingface")
    assert set(loaded["weights"]) <= set(expected) and len(loaded["weights"]) >= len(expected) - 1  # tied
    for name, tensor in loaded["weights"].items():
        assert torch.equal(tensor, expected[name]), name
    assert loaded["last_epoch"] == 1  # the LR schedule continues after step 1
    assert {m["step"] for m in loaded["moments"].values()} == {1.0}
    # the moments came from the file, not from a fresh optimizer (whose state is empty)
    assert all("exp_avg" in m for m in loaded["moments"].values())
    assert sum(float(m["exp_avg_sq"].abs().sum()) for m in loaded["moments"].values()) > 0


# ---- verl -> verl-npu ---------------------------------------------------------------------------
STEPS, ROWS, BATCH, LR, WARMUP = 3, 8, 2, 1e-3, 8


_VERL_CKPTS: dict[tuple[int, bool], tuple[Path, dict]] = {}


def verl_checkpoint(dest: Path, model: Path, workers: int, shuffle: bool) -> dict:
    """A checkpoint of STEPS steps written by verl's FSDPCheckpointManager (plus verl's trainer's
    data.pt and marker), copied to `dest` (written once per module for each (workers, shuffle));
    returns verl's view of what it saved (full weights, AdamW moments, schedule, batches)."""
    key = (workers, shuffle)
    if key not in _VERL_CKPTS:
        root = dest.parent / f"verl_written_{workers}_{shuffle}"
        reference = dest.parent / f"verl_reference_{workers}_{shuffle}.pt"
        torchrun(
            workers,
            "save",
            "--model",
            str(model),
            "--root",
            str(root),
            "--steps",
            str(STEPS),
            "--lr",
            str(LR),
            "--warmup",
            str(WARMUP),
            "--rows",
            str(ROWS),
            "--batch-size",
            str(BATCH),
            "--reference",
            str(reference),
            *(["--shuffle"] if shuffle else []),
        )
        names = sorted(p.name for p in root.iterdir())
        assert names == [f"global_step_{STEPS}", "latest_checkpointed_iteration.txt"]
        assert not (root / f"global_step_{STEPS}" / "COMPLETE").exists()
        _VERL_CKPTS[key] = (root, torch.load(reference, weights_only=False))
    root, verl = _VERL_CKPTS[key]
    shutil.copytree(root, dest)
    return verl


def resume_overrides(
    out: Path, ckpt_root: Path, data: Path, model: Path, workers: int, total: int, shuffle: bool
) -> list[str]:
    return run_overrides(
        out,
        data,
        {
            "actor_rollout_ref.model.path": model,
            "data.train_batch_size": BATCH,
            "data.shuffle": str(shuffle).lower(),
            "data.max_response_length": 3,
            "actor_rollout_ref.actor.ppo_mini_batch_size": BATCH,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
            "actor_rollout_ref.actor.optim.lr": LR,
            "actor_rollout_ref.actor.optim.lr_warmup_steps": WARMUP,
            "actor_rollout_ref.rollout.n": 2,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
            "trainer.total_training_steps": total,
            "trainer.save_freq": 1,
            "trainer.test_freq": -1,
            "trainer.val_before_train": "false",
            "trainer.logger": "[console]",
            "ray_init.num_cpus": 2,
            "trainer.n_gpus_per_node": workers,
            "trainer.default_local_dir": ckpt_root,
            "trainer.resume_mode": "auto",
        },
    )


def assert_state_is_verls(snapshot: dict, verl: dict) -> None:
    for name, tensor in verl["weights"].items():
        assert torch.equal(snapshot["params"][name], tensor), name
    for name, moments in verl["moments"].items():
        assert snapshot["moments"][name]["step"] == moments["step"] == STEPS
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(snapshot["moments"][name][key], moments[key]), (name, key)
    assert snapshot["last_epoch"] == verl["last_epoch"] == STEPS
    assert snapshot["lr"] == pytest.approx(verl["lr"]) and verl["lr"] == pytest.approx(LR * STEPS / WARMUP)


@pytest.mark.parametrize("workers", [1, 2], ids=["1-worker", "2-workers"])
def test_a_verl_checkpoint_resumes_with_its_exact_state(workers, tmp_path, tiny_lm_path):
    """A resume to the checkpoint's own step trains nothing: what the workers hold then is exactly
    what verl saved (every rank)."""
    data = text_data(tmp_path / "data", rows=ROWS)
    root = tmp_path / "verl_ckpt"
    verl = verl_checkpoint(root, Path(tiny_lm_path), workers, shuffle=False)
    seen = []
    rc = load_recipe(
        "tiny_gsm8k", resume_overrides(tmp_path / "out", root, data, tiny_lm_path, workers, STEPS, shuffle=False)
    )
    assert run_training(rc, after_fit=lambda group: seen.extend(group.broadcast("training_state_snapshot"))) == 0
    assert len(seen) == workers
    for snapshot in seen:
        assert_state_is_verls(snapshot, verl)


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order-exact-position", "shuffled-epoch-restarts"])
def test_a_verl_checkpoint_continues_training(shuffle, tmp_path, tiny_lm_path, caplog):
    """One worker continues verl's run for one step: step STEPS+1, the LR of that step of the
    schedule, the data position after it, and a checkpoint of verl-npu beside verl's."""
    data = text_data(tmp_path / "data", rows=ROWS)
    root = tmp_path / "verl_ckpt"
    verl_checkpoint(root, Path(tiny_lm_path), 1, shuffle=shuffle)
    out = tmp_path / "out"
    caplog.set_level(logging.INFO)
    rc = load_recipe("tiny_gsm8k", resume_overrides(out, root, data, tiny_lm_path, 1, STEPS + 1, shuffle=shuffle))
    assert run_training(rc) == 0
    rows = step_metrics(out)
    assert sorted(rows) == [STEPS + 1]  # verl's steps are not redone
    assert rows[STEPS + 1]["actor/lr"] == pytest.approx(LR * (STEPS + 1) / WARMUP)  # the schedule went on
    state = json.loads((root / f"global_step_{STEPS + 1}" / "trainer_state.json").read_text())
    per_epoch = ROWS // BATCH
    if not shuffle:  # verl's batches 0..STEPS-1 of epoch 0 were used: this step used batch STEPS, the last
        assert STEPS + 1 == per_epoch and (state["dataloader"]["epoch"], state["dataloader"]["sample_index"]) == (1, 0)
        assert "cannot be carried over" not in caplog.text
    else:  # another order: epoch 0 starts over, so this step used its first batch
        assert (state["dataloader"]["epoch"], state["dataloader"]["sample_index"]) == (0, BATCH)
        assert "starts epoch 0 over from its first batch" in caplog.text
    assert (root / "latest_checkpointed_iteration.txt").read_text().strip() == str(STEPS + 1)
    shutil.rmtree(out)
