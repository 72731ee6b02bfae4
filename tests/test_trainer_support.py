"""Valid verl settings the trainer does not implement yet are refused by name, never ignored."""

from verl_npu.config import load_recipe
from verl_npu.trainer.entry import total_steps, unsupported_by_trainer

REQUIRED = [
    "af_output_dir=/tmp/out",
    "data.train_files=/d/train.parquet",
    "data.val_files=/d/test.parquet",
    "actor_rollout_ref.model.path=/m/qwen",
]


def keys(problems):
    return {p.key for p in problems}


def test_demo_recipe_is_fully_supported():
    assert unsupported_by_trainer(load_recipe("tiny_geo3k")) == []


def test_tensor_parallel_rollout_runs_and_full_kl_in_reward_is_refused_by_name():
    rc = load_recipe("qwen25vl_geo3k_longseq", REQUIRED)
    assert int(rc.backend.actor_rollout_ref.rollout.tensor_model_parallel_size) > 1
    assert unsupported_by_trainer(rc) == []  # the shipped recipe runs as shipped
    rc = load_recipe("tiny_geo3k", ["algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=full",
                                    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8"])
    [problem] = unsupported_by_trainer(rc)
    assert problem.key.endswith("algorithm.kl_penalty") and "low_var_kl" in problem.fix


def test_total_steps_is_the_smaller_of_epochs_and_explicit_steps():
    rc = load_recipe("tiny_geo3k", ["trainer.total_training_steps=null", "trainer.total_epochs=3"])
    assert total_steps(rc.backend, 32) == 96
    rc = load_recipe("tiny_geo3k", ["trainer.total_training_steps=50", "trainer.total_epochs=3"])
    assert total_steps(rc.backend, 32) == 50
    rc = load_recipe("tiny_geo3k", ["trainer.total_training_steps=500", "trainer.total_epochs=1"])
    assert total_steps(rc.backend, 32) == 32


def test_reference_sequence_parallel_must_match_the_actor():
    rc = load_recipe("tiny_geo3k", ["trainer.n_gpus_per_node=2", "actor_rollout_ref.model.use_remove_padding=true",
                                    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                                    "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1",
                                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                                    "actor_rollout_ref.model.path=tiny://qwen2"])
    [problem] = unsupported_by_trainer(rc)
    assert problem.key.endswith("ref.ulysses_sequence_parallel_size") and "set both to 2" in problem.fix


def test_ulysses_is_accepted_for_text_and_vision_language_models():
    sp = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.model.use_remove_padding=true",
          "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
          "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2",
          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"]
    assert unsupported_by_trainer(load_recipe("tiny_geo3k", sp)) == []
    assert unsupported_by_trainer(load_recipe("tiny_geo3k", sp + ["actor_rollout_ref.model.path=tiny://qwen2"])) == []


def test_validate_warns_about_what_run_would_refuse(capsys):
    from verl_npu.cli import main

    assert main(["validate", "qwen25vl_geo3k", *REQUIRED, "actor_rollout_ref.actor.fsdp_config.fsdp_size=4"]) == 0
    err = capsys.readouterr().err
    assert "verl-npu run will refuse backend_config.actor_rollout_ref.actor.fsdp_config.fsdp_size" in err
    assert "hybrid sharding" in err
    capsys.readouterr()
    assert main(["validate", "qwen25vl_geo3k", *REQUIRED]) == 0
    assert "verl-npu run will refuse" not in capsys.readouterr().err  # the flagship runs as shipped


def test_out_of_memory_in_a_worker_becomes_advice(monkeypatch, tmp_path):
    """A device OOM (here raised by the actor update, wrapped as a worker failure) ends the run with
    the settings to lower and where the intact checkpoint is, not a traceback."""
    import pytest
    import torch

    from verl_npu.errors import UserError
    from verl_npu.trainer import entry
    from verl_npu.workers.group import LocalWorkerGroup

    def failing_update(self, batch):
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except torch.OutOfMemoryError as oom:
            raise RuntimeError("worker rank 0 failed") from oom

    monkeypatch.setattr(LocalWorkerGroup, "update_actor", failing_update)
    rc = load_recipe("tiny_geo3k", [f"af_output_dir={tmp_path / 'out'}", "trainer.total_training_steps=1",
                                    "trainer.test_freq=-1", "trainer.logger=[console]",
                                    f"data.train_files={tmp_path / 'd' / 'train.parquet'}",
                                    f"data.val_files={tmp_path / 'd' / 'test.parquet'}"])
    from verl_npu.data.geometry3k import prepare_synthetic

    prepare_synthetic(tmp_path / "d", 16, 4, seed=0, image_size=56)
    with pytest.raises(UserError, match="ran out of memory.*ppo_micro_batch_size_per_gpu.*resume_mode=auto"):
        entry.run_training(rc)
