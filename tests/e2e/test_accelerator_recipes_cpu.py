"""The accelerator recipes' own combinations run one step on the CPU, shrunk to a tiny model: qwen25_retool_dapo
(multi-turn rollout with ReTool's sandboxed interpreter, the GSM8K reward read the flexible way through
custom_reward_function, the dapo manager's overlong penalty and dynamic sampling on flexible_accuracy) and
qwen25_distill (forward_kl_topk from a frozen teacher). Only sizes, the device, the engine and the models change;
the recipe's tool config and reward file are read from the repository root, as the launcher runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_helpers import run_overrides

from verl_npu.config import load_recipe
from verl_npu.data.gsm8k import prepare_synthetic
from verl_npu.trainer.entry import run_training

REPO = Path(__file__).resolve().parents[2]
#: one CPU worker, the hf engine, no parallelism or offload, one step without validation or checkpoints
CPU = {
    "trainer.device": "cpu",
    "trainer.n_gpus_per_node": 1,
    "actor_rollout_ref.rollout.name": "hf",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "trainer.total_training_steps": 1,
    "trainer.val_before_train": "false",
    "trainer.test_freq": -1,
    "trainer.save_freq": -1,
    "trainer.logger": "[console]",
}


def _step_metrics(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if "training/global_step" in r)


@pytest.mark.slow
def test_retool_dapo_recipe_runs_a_step_with_its_tool_reward_and_dynamic_sampling(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the recipe names its tool config and reward file from the repository root
    prepare_synthetic(tmp_path / "data", 16, 4)
    overrides = run_overrides(
        tmp_path / "out",
        tmp_path / "data",
        CPU,
        {
            "actor_rollout_ref.model.path": "tiny://qwen2",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 1,
            "actor_rollout_ref.ref.ulysses_sequence_parallel_size": 1,
            "actor_rollout_ref.model.use_fused_kernels": "false",
            "actor_rollout_ref.actor.fsdp_config.param_offload": "false",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload": "false",
            "data.train_batch_size": 2,
            "data.gen_batch_size": 4,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
            "actor_rollout_ref.rollout.n": 2,
            "data.max_prompt_length": 448,  # the question and the tool schema the chat template adds
            "data.max_response_length": 64,
            "reward_model.reward_kwargs.max_resp_len": 64,
            "reward_model.reward_kwargs.overlong_buffer_cfg.len": 16,
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 1024,
            "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 1024,
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 2,
            "actor_rollout_ref.rollout.multi_turn.max_user_turns": 1,
        },
    )
    rc = load_recipe("qwen25_retool_dapo", overrides)
    assert run_training(rc) == 0
    step = _step_metrics(tmp_path / "out")
    for key in (
        "critic/score/flexible_accuracy/mean",  # the reward the recipe names, its extras logged
        "critic/score/overlong/mean",  # the dapo manager's overlong penalty
        "train/num_gen_batches",  # dynamic sampling
        "tool_call_counts/mean",  # the multi-turn loop with the tool
    ):
        assert key in step, (key, sorted(step))
    # the recipe's limit of 10 generation batches holds: the random model's last numbers sometimes match (seeded)
    assert 1 <= step["train/num_gen_batches"] <= 10


@pytest.mark.slow
def test_distill_recipe_runs_a_step_with_its_teacher(tmp_path):
    prepare_synthetic(tmp_path / "data", 16, 4)
    overrides = run_overrides(
        tmp_path / "out",
        tmp_path / "data",
        CPU,
        {
            "actor_rollout_ref.model.path": "tiny://qwen2?seed=1",
            "distillation.teacher_models.teacher_model.model_path": "tiny://qwen2",  # the same tiny tokenizer
            "data.train_batch_size": 4,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
            "data.max_prompt_length": 80,
            "data.max_response_length": 8,
            "distillation.distillation_loss.topk": 8,
        },
    )
    rc = load_recipe("qwen25_distill", overrides)
    assert run_training(rc) == 0
    step = _step_metrics(tmp_path / "out")
    assert step["distillation/loss"] > 0 and 0 <= step["distillation/overlap_ratio"] <= 1, sorted(step)
