"""Valid verl settings the trainer does not implement yet are refused by name, never ignored: they
are rules of the config registry (verl_npu.config.rules.RULES, names starting with `trainer_`), so
`validate` and `run` report them with every other problem, before anything starts."""

import pytest

from verl_npu.config import RULES, load_recipe
from verl_npu.errors import ConfigErrors
from verl_npu.trainer.entry import total_steps

REQUIRED = [
    "af_output_dir=/tmp/out",
    "data.train_files=/d/train.parquet",
    "data.val_files=/d/test.parquet",
    "actor_rollout_ref.model.path=/m/qwen",
]


def refused(recipe, overrides):
    """The problems `load_recipe` reports (each must come from a trainer_* rule or a key check)."""
    with pytest.raises(ConfigErrors) as info:
        load_recipe(recipe, overrides)
    return info.value.problems


def test_trainer_refusals_live_in_the_rule_registry():
    names = {r.name for r in RULES}
    assert {"trainer_ref_sp", "trainer_full_kl_in_reward", "trainer_fsdp_offload_and_sharding"} <= names


def test_demo_recipe_is_fully_supported():
    load_recipe("tiny_geo3k")


def test_tensor_parallel_rollout_runs_and_full_kl_in_reward_is_refused_by_name():
    rc = load_recipe("qwen25vl_geo3k_longseq", REQUIRED)  # the shipped recipe runs as shipped
    assert int(rc.backend.actor_rollout_ref.rollout.tensor_model_parallel_size) > 1
    [problem] = refused(
        "tiny_geo3k",
        [
            "algorithm.use_kl_in_reward=true",
            "algorithm.kl_penalty=full",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        ],
    )
    assert problem.key.endswith("algorithm.kl_penalty") and "low_var_kl" in problem.fix


def test_total_steps_is_the_smaller_of_epochs_and_explicit_steps():
    rc = load_recipe("tiny_geo3k", ["trainer.total_training_steps=null", "trainer.total_epochs=3"])
    assert total_steps(rc.backend, 32) == 96
    rc = load_recipe("tiny_geo3k", ["trainer.total_training_steps=50", "trainer.total_epochs=3"])
    assert total_steps(rc.backend, 32) == 50
    rc = load_recipe("tiny_geo3k", ["trainer.total_training_steps=500", "trainer.total_epochs=1"])
    assert total_steps(rc.backend, 32) == 32


def test_reference_sequence_parallel_must_match_the_actor():
    [problem] = refused(
        "tiny_geo3k",
        [
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.model.use_remove_padding=true",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.model.path=tiny://qwen2",
        ],
    )
    assert problem.key.endswith("ref.ulysses_sequence_parallel_size") and "set both to 2" in problem.fix


def test_ulysses_is_accepted_for_text_and_vision_language_models():
    sp = [
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    ]
    load_recipe("tiny_geo3k", sp)
    load_recipe("tiny_geo3k", sp + ["actor_rollout_ref.model.path=tiny://qwen2"])


def test_validate_refuses_what_run_would_refuse(capsys):
    from verl_npu.cli import main

    assert main(["validate", "qwen25vl_geo3k", *REQUIRED, "actor_rollout_ref.actor.fsdp_config.fsdp_size=4"]) == 1
    err = capsys.readouterr().err
    assert "backend_config.actor_rollout_ref.actor.fsdp_config.fsdp_size" in err and "hybrid sharding" in err
    assert main(["validate", "qwen25vl_geo3k", *REQUIRED]) == 0  # the flagship runs as shipped


def test_out_of_memory_in_a_worker_becomes_advice(monkeypatch, tmp_path):
    """A device OOM (here raised by the actor update, wrapped as a worker failure) ends the run with
    the settings to lower and where the intact checkpoint is, not a traceback."""
    import pytest
    import torch

    from verl_npu.errors import UserError
    from verl_npu.trainer import entry
    from verl_npu.workers.group import LocalWorkerGroup

    def failing_update(self, batch, old_log_probs=None):
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except torch.OutOfMemoryError as oom:
            raise RuntimeError("worker rank 0 failed") from oom

    monkeypatch.setattr(LocalWorkerGroup, "update_actor", failing_update)
    rc = load_recipe(
        "tiny_geo3k",
        [
            f"af_output_dir={tmp_path / 'out'}",
            "trainer.total_training_steps=1",
            "trainer.test_freq=-1",
            "trainer.logger=[console]",
            f"data.train_files={tmp_path / 'd' / 'train.parquet'}",
            f"data.val_files={tmp_path / 'd' / 'test.parquet'}",
        ],
    )
    from verl_npu.data.geometry3k import prepare_synthetic

    prepare_synthetic(tmp_path / "d", 16, 4, seed=0, image_size=56)
    with pytest.raises(UserError, match="ran out of memory.*ppo_micro_batch_size_per_gpu.*resume_mode=auto"):
        entry.run_training(rc)
