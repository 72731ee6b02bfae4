"""actor_rollout_ref.actor.fsdp_config.model_dtype (verl's master-weight dtype): bf16 loads the actor's weights in
bfloat16, so its gradients and AdamW moments are bfloat16 too, and the memory plan counts 2 bytes for each; fp32 (the
default) is unchanged; fp16 is refused by name. A third-party on-policy distillation script that sets it (and
verl 0.9.1's distillation keys) validates with its paths made local."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from test_e2e_cpu import _gsm8k_like, tiny_overrides

from verl_npu.config import load_recipe
from verl_npu.errors import ConfigErrors

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _worker(tmp_path, tiny_lm_path, dtype: str):
    from verl_npu.device import detect_device
    from verl_npu.workers.actor import ActorRolloutRefWorker

    data = _gsm8k_like(tmp_path / "gsm")
    rc = load_recipe(
        "tiny_geo3k",
        tiny_overrides(
            tmp_path,
            data,
            **{
                "actor_rollout_ref.model.path": tiny_lm_path,
                "actor_rollout_ref.actor.fsdp_config.model_dtype": dtype,
                "data.max_prompt_length": 48,
                "trainer.test_freq": -1,
                "trainer.logger": "[console]",
            },
        ),
    )
    worker = ActorRolloutRefWorker(rc.typed, device=detect_device("cpu"), total_training_steps=2)
    worker.init_model()
    return worker


@pytest.mark.parametrize("dtype,expected", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_the_actors_weights_grads_and_adam_state_are_in_model_dtype(tmp_path, tiny_lm_path, dtype, expected):
    worker = _worker(tmp_path, tiny_lm_path, dtype)
    params = [p for p in worker.module.parameters() if p.requires_grad]
    assert {p.dtype for p in params} == {expected}
    # one optimizer step on a loss of every parameter: the gradients and AdamW's moments take the weights' dtype
    loss = sum((p.float() ** 2).sum() for p in params)
    loss.backward()
    assert {p.grad.dtype for p in params} == {expected}
    worker.engine.optimizer.step()
    states = [worker.engine.optimizer.state[p] for p in params]
    assert {s["exp_avg"].dtype for s in states} == {expected} == {s["exp_avg_sq"].dtype for s in states}


def test_the_memory_plan_counts_two_bytes_for_bf16_master_weights():
    from verl_npu.memory import plan as mp
    from verl_npu.memory.recipe import build_plan
    from verl_npu.memory.settings import settings_from_recipe

    out = [
        "af_output_dir=/tmp/x",
        "actor_rollout_ref.model.path=/tmp/none",
        "data.train_files=/tmp/t.parquet",
        "data.val_files=/tmp/t.parquet",
    ]
    m = mp.model_size(
        {
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "vocab_size": 152064,
            "tie_word_embeddings": False,
            "max_position_embeddings": 32768,
        }
    )

    def update(*extra):
        s = settings_from_recipe(load_recipe("qwen25_gsm8k", [*out, *extra]), True)
        plan = build_plan(s, m, device_bytes=64 << 30, device_name="910B")
        return {p.name: p.bytes for p in next(ph for ph in plan.phases if ph.name == "actor update").parts}

    fp32, bf16 = update(), update("actor_rollout_ref.actor.fsdp_config.model_dtype=bf16")
    assert fp32["actor weights"] == math.ceil(4 * m.params / 8) and bf16["actor weights"] == math.ceil(2 * m.params / 8)
    assert fp32["actor AdamW"] == math.ceil(8 * m.params / 8) and bf16["actor AdamW"] == math.ceil(4 * m.params / 8)
    grads = [k for k in fp32 if k.startswith("actor grads")]
    assert grads and all(bf16[k] * 2 == fp32[k] for k in grads)


def test_fp16_master_weights_are_refused_by_name():
    with pytest.raises(ConfigErrors) as e:
        load_recipe("tiny_gsm8k", ["af_output_dir=/tmp/x", "actor_rollout_ref.actor.fsdp_config.model_dtype=fp16"])
    (problem,) = [p for p in e.value.problems if p.key.endswith("actor.fsdp_config.model_dtype")]
    assert "fp16" in problem.message and "bf16" in problem.fix


def test_a_third_party_distillation_script_validates_with_local_paths(tmp_path, tiny_lm_path, monkeypatch, capsys):
    """tests/fixtures/third_party_scripts/opd_forward_kl_topk_finqa.txt: a public verl on-policy distillation
    launcher's overrides (verl 0.9.1's distillation.* keys, bf16 master weights, a swanlab logger, the reward
    section), validated as on the accelerators it was written for, with its data, student, teacher and reward
    paths pointing at local tiny ones."""
    import verl_npu.device as device
    from verl_npu.cli import main
    from verl_npu.data import gsm8k

    monkeypatch.setattr(device, "configured_device", lambda requested=None: device.DeviceInfo("npu"))
    monkeypatch.setitem(sys.modules, "swanlab", type(sys)("swanlab"))  # the logger's package, as installed there
    gsm8k.prepare_synthetic(tmp_path / "data", 32, 8, seed=0)
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    local = {
        "data.train_files": tmp_path / "data" / "train.parquet",
        "data.val_files": tmp_path / "data" / "test.parquet",
        "actor_rollout_ref.model.path": tiny_lm_path,
        "distillation.teacher_models.teacher_model.model_path": tiny_lm_path,
        "reward.custom_reward_function.path": reward,
        "trainer.default_local_dir": tmp_path / "ckpt",
        "trainer.validation_data_dir": tmp_path / "val",
    }
    args = []
    for line in (FIXTURES / "third_party_scripts" / "opd_forward_kl_topk_finqa.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key = line.split("=", 1)[0]
            args.append(f"{key}={local[key]}" if key in local else line)
    assert sum(a.startswith("distillation.") for a in args) == 20
    code = main(
        [
            "validate",
            str(FIXTURES / "verl_scripts" / "verl_base.yaml"),
            *args,
            f"af_output_dir={tmp_path}",
            "--check-paths",
        ]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    rc = load_recipe(FIXTURES / "verl_scripts" / "verl_base.yaml", [*args, f"af_output_dir={tmp_path}"])
    b = rc.backend
    assert b.distillation.enabled is True and b.distillation.distillation_loss.loss_mode == "forward_kl_topk"
    assert b.distillation.distillation_loss.topk == 32
    assert b.actor_rollout_ref.actor.fsdp_config.model_dtype == "bfloat16"
