"""verl's checkpoint keys: `actor.checkpoint.save_contents` / `load_contents` do what they say in
verl, and `trainer.del_local_ckpt_after_load` (a remote-checkpoint feature) is refused by name.
Real 1-step runs of the tiny text model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from run_helpers import run_overrides, text_data, write_varied_reward

from verl_npu.config import load_recipe
from verl_npu.errors import ConfigErrors, UserError
from verl_npu.trainer.checkpoint import load_torch
from verl_npu.trainer.entry import run_training

A = "backend_config.actor_rollout_ref.actor."


@pytest.mark.parametrize(
    "override,key,fragment",
    [
        ("trainer.del_local_ckpt_after_load=true", "backend_config.trainer.del_local_ckpt_after_load", "HDFS"),
        (
            "actor_rollout_ref.actor.checkpoint.load_contents=[model,hf_model]",
            A + "checkpoint.load_contents",
            "does not support load_contents=hf_model",
        ),
        ("actor_rollout_ref.actor.checkpoint.save_contents=[model,weights]", A + "checkpoint.save_contents", "weights"),
    ],
)
def test_unsupported_checkpoint_values_are_refused_by_name(override, key, fragment):
    with pytest.raises(ConfigErrors) as info:
        load_recipe("tiny_gsm8k", [override])
    named = [p for p in info.value.problems if p.key == key]
    assert named and any(fragment in f"{p.message} {p.fix}" for p in named), str(info.value)


def overrides(out: Path, data: Path, model: str, steps: int, **extra) -> list[str]:
    return run_overrides(
        out,
        data,
        {
            "actor_rollout_ref.model.path": model,
            "custom_reward_function.path": write_varied_reward(data / "reward.py"),
            "data.train_batch_size": 2,
            "data.max_response_length": 3,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
            "actor_rollout_ref.actor.optim.lr": 1e-3,
            "actor_rollout_ref.rollout.n": 2,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
            "trainer.total_training_steps": steps,
            "trainer.save_freq": 1,
            "trainer.test_freq": -1,
            "trainer.val_before_train": "false",
            "trainer.logger": "[console]",
            "trainer.default_local_dir": out.parent / "ckpt",
        },
        extra,
    )


@pytest.mark.slow
def test_save_and_load_contents(tmp_path, tiny_lm_path):
    data = text_data(tmp_path / "data", rows=4)
    # a checkpoint of the model and the extra state only: no optimizer file, no Hugging Face weights
    save = {"actor_rollout_ref.actor.checkpoint.save_contents": "[model,extra]"}
    assert run_training(load_recipe("tiny_gsm8k", overrides(tmp_path / "a", data, tiny_lm_path, 1, **save))) == 0
    actor = tmp_path / "ckpt" / "global_step_1" / "actor"
    names = sorted(p.name for p in actor.iterdir())
    assert names == [
        "extra_state_world_size_1_rank_0.pt",
        "fsdp_config.json",
        "huggingface",
        "model_world_size_1_rank_0.pt",
    ]
    hf = {p.name for p in (actor / "huggingface").iterdir()}
    assert {"config.json", "tokenizer.json"} <= hf and not any(n.endswith(".safetensors") for n in hf)
    assert json.loads((actor / "fsdp_config.json").read_text()) == {"FSDP_version": 2, "world_size": 1}
    saved = {
        k: v.to_local() for k, v in load_torch(actor / "model_world_size_1_rank_0.pt").items() if hasattr(v, "to_local")
    }

    # resuming with the default load_contents needs the optimizer file: an error naming it and the key
    with pytest.raises(UserError, match=r"optim_world_size_1_rank_0\.pt \(optimizer\).*load_contents"):
        run_training(load_recipe("tiny_gsm8k", overrides(tmp_path / "b", data, tiny_lm_path, 1, **save)))

    def resumed_state(name: str, contents: str) -> dict:
        seen = []
        rc = load_recipe(
            "tiny_gsm8k",
            overrides(
                tmp_path / name,
                data,
                tiny_lm_path,
                1,
                **save,
                **{"actor_rollout_ref.actor.checkpoint.load_contents": contents},
            ),
        )
        assert run_training(rc, after_fit=lambda group: seen.extend(group.broadcast("training_state_snapshot"))) == 0
        return seen[0]

    state = resumed_state("c", "[model,extra]")  # weights and LR schedule; a fresh optimizer
    assert all(torch.equal(state["params"][k], v) for k, v in saved.items() if k in state["params"])
    assert state["last_epoch"] == 1 and all(not m for m in state["moments"].values())
    state = resumed_state("d", "[model]")  # weights only: the schedule starts over too
    assert state["last_epoch"] == 0 and all(
        torch.equal(state["params"][k], v) for k, v in saved.items() if k in state["params"]
    )


# ---- checkpoints of upstream verl's trainer, recognised without verl (the real ones: test_verl_interop.py)
def _verl_like(root: Path, step: int, fsdp_version: int = 2, world_size: int = 1) -> Path:
    """The shape of a folder verl's trainer writes: actor/ with fsdp_config.json, data.pt, no COMPLETE."""
    folder = root / f"global_step_{step}"
    (folder / "actor").mkdir(parents=True)
    (folder / "actor" / "fsdp_config.json").write_text(
        json.dumps({"FSDP_version": fsdp_version, "world_size": world_size})
    )
    torch.save({"_num_yielded": step, "_sampler_iter_state": {"samples_yielded": 2 * step}}, folder / "data.pt")
    return folder


def test_a_verl_checkpoint_is_found_by_marker_or_path(tmp_path, caplog):
    from verl_npu.trainer.checkpoint import CheckpointManager
    from verl_npu.trainer.verl_resume import is_verl_checkpoint

    folder = _verl_like(tmp_path, 3)
    assert is_verl_checkpoint(folder)
    mgr = CheckpointManager(tmp_path)
    assert mgr.resolve_resume("auto", None) is None  # verl moves its marker only after a save completes
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    assert mgr.resolve_resume("auto", None) == folder
    assert mgr.resolve_resume("resume_path", str(folder)) == folder
    assert "written by upstream verl" in caplog.text
    (folder / "COMPLETE").write_text("")
    assert not is_verl_checkpoint(folder)  # one of verl-npu's own


@pytest.mark.parametrize("shuffle, expected", [(False, (1, 2)), (True, (1, 0))])
def test_data_position_of_a_verl_checkpoint(tmp_path, shuffle, expected, caplog):
    from verl_npu.data import StatefulBatchLoader
    from verl_npu.trainer.verl_resume import trainer_state_from_verl

    folder = _verl_like(tmp_path, 5)  # 4 batches per epoch: epoch 1, batch 1
    loader = StatefulBatchLoader(list(range(8)), 2, shuffle, 1, drop_last=True)
    state = trainer_state_from_verl(folder, loader, kl_coef=0.001)
    assert state["global_step"] == 5 and state["kl_coef"] == 0.001 and state["rng"] is None
    assert (state["dataloader"]["epoch"], state["dataloader"]["sample_index"]) == expected
    assert ("starts epoch 1 over" in caplog.text) == shuffle


def test_an_fsdp1_verl_checkpoint_is_refused_by_name(tmp_path):
    from types import SimpleNamespace

    from verl_npu.config.typed import section
    from verl_npu.workers.actor_ckpt import load_actor

    folder = _verl_like(tmp_path, 2, fsdp_version=1)
    worker = SimpleNamespace(checkpoint=section("actor_rollout_ref.actor.checkpoint"), world_size=1, rank=0)
    with pytest.raises(UserError, match=r"FSDP1 .*strategy=fsdp2"):
        load_actor(worker, folder / "actor")
    folder = _verl_like(tmp_path / "b", 2, world_size=4)
    with pytest.raises(UserError, match="saved by 4 workers, this run has 1"):
        load_actor(worker, folder / "actor")
