"""actor_rollout_ref.model.use_shm (issue 39): accepted, and the actor loads the model from one copy in
shared memory ($VERL_NPU_SHM_DIR here), made once and remade when the model changes."""

from __future__ import annotations

import filecmp
import os

import torch
from test_e2e_cpu import _gsm8k_like, read_metrics, tiny_overrides

from verl_npu.config import load_recipe
from verl_npu.models.shm import DONE, shm_folder


def test_the_copy_is_made_once_and_remade_when_the_model_changes(tmp_path, monkeypatch, tiny_lm_path):
    src = tmp_path / "model"
    import shutil

    shutil.copytree(tiny_lm_path, src)
    monkeypatch.setenv("VERL_NPU_SHM_DIR", str(tmp_path / "shm"))
    first = shm_folder(str(src))
    assert first.startswith(str(tmp_path / "shm")) and (os.path.isfile(os.path.join(first, DONE)))
    same = filecmp.dircmp(src, first)
    assert not same.diff_files and not same.left_only
    marker = os.stat(os.path.join(first, DONE)).st_mtime_ns
    assert shm_folder(str(src)) == first and os.stat(os.path.join(first, DONE)).st_mtime_ns == marker
    (src / "config.json").write_text((src / "config.json").read_text() + " ")
    assert shm_folder(str(src)) != first


def test_the_actor_loads_from_shared_memory(tmp_path, monkeypatch, tiny_lm_path):
    from verl_npu.device import detect_device
    from verl_npu.workers.actor import ActorRolloutRefWorker

    monkeypatch.setenv("VERL_NPU_SHM_DIR", str(tmp_path / "shm"))
    data = _gsm8k_like(tmp_path / "gsm")
    rc = load_recipe(
        "tiny_geo3k",
        tiny_overrides(
            tmp_path,
            data,
            **{
                "actor_rollout_ref.model.path": tiny_lm_path,
                "actor_rollout_ref.model.use_shm": "true",
                "data.max_prompt_length": 48,
                "trainer.test_freq": -1,
                "trainer.logger": "[console]",
            },
        ),
    )
    assert rc.backend.actor_rollout_ref.model.use_shm is True
    worker = ActorRolloutRefWorker(rc.typed, device=detect_device("cpu"), total_training_steps=2)
    worker.init_model()
    copies = list((tmp_path / "shm" / "verl_npu_models").glob("*/" + DONE))
    assert len(copies) == 1
    assert worker.tokenizer.name_or_path == str(copies[0].parent)
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    name, param = next(iter(original.named_parameters()))
    loaded = dict(worker.module.named_parameters())[name]
    loaded = loaded.full_tensor() if hasattr(loaded, "full_tensor") else loaded  # an FSDP2 shard
    assert torch.equal(loaded.detach(), param.detach())


def test_a_verl_script_with_use_shm_and_activation_offload_runs_two_steps(tmp_path, monkeypatch, tiny_lm_path):
    """What verl 0.9.1 accepts (model.use_shm, model.enable_activation_offload) runs here too: 2 steps on CPU."""
    from run_helpers import text_data, text_run_overrides

    from verl_npu.trainer.entry import run_training

    monkeypatch.setenv("VERL_NPU_SHM_DIR", str(tmp_path / "shm"))
    data = text_data(tmp_path / "data")
    rc = load_recipe(
        "tiny_gsm8k",
        text_run_overrides(
            tmp_path / "out",
            data,
            **{
                "actor_rollout_ref.model.use_shm": "true",
                "actor_rollout_ref.model.enable_activation_offload": "true",
                "actor_rollout_ref.model.enable_gradient_checkpointing": "true",
            },
        ),
    )
    assert run_training(rc) == 0
    steps = [r["step"] for r in read_metrics(tmp_path / "out") if "actor/pg_loss" in r]
    assert steps == [1, 2]
    assert list((tmp_path / "shm" / "verl_npu_models").glob("*/" + DONE))
