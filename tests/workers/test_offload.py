"""FSDP2 parameter / optimizer offloading on one worker: the worker shards its roles over a process
group of itself (as verl does on one device), trains like the unsharded worker, writes verl's
checkpoint layout, resumes at the right step, and a later run in the same process is not sharded."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch.distributed as dist
from run_helpers import step_metrics, text_data, text_run_overrides

from verl_npu.config import load_recipe
from verl_npu.trainer.entry import run_training
from verl_npu.workers import parallel

COMPARED = [
    "critic/score/mean",
    "response_length/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
    "actor/ppo_kl",
]
OFFLOAD = {
    "actor_rollout_ref.actor.fsdp_config.param_offload": "true",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": "true",
    "actor_rollout_ref.ref.fsdp_config.param_offload": "true",
}


def overrides(out: Path, data: Path, steps: int, **extra) -> list[str]:
    return text_run_overrides(
        out,
        data,
        **{
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
            "actor_rollout_ref.actor.use_kl_loss": "true",
            "actor_rollout_ref.actor.optim.lr": 1e-3,
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
            "trainer.total_training_steps": steps,
            "trainer.save_freq": 2,
            **extra,
        },
    )


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)


@pytest.mark.slow
def test_one_worker_offload_trains_like_the_plain_worker_and_resumes(tmp_path, tiny_cache):
    data = text_data(tmp_path / "data")
    seen = {}

    def inspect(group):
        actor = group.worker
        seen["group_size"] = dist.get_world_size() if dist.is_initialized() else 0
        for name, module in (("actor", actor.module), ("ref", actor.ref_module)):
            params = module._get_fsdp_state()._fsdp_param_group  # FSDP2 on a one-rank mesh
            seen[name] = (type(params.offload_policy).__name__, params.mesh_info.mesh.size())
        seen["params"] = {n: p.full_tensor().clone() for n, p in actor.module.named_parameters()}

    plain, offloaded = tmp_path / "plain", tmp_path / "offloaded"
    assert run_training(load_recipe("tiny_geo3k", overrides(plain, data, 3))) == 0
    assert run_training(load_recipe("tiny_geo3k", overrides(offloaded, data, 3, **OFFLOAD)), after_fit=inspect) == 0
    assert not parallel.fsdp_enabled(1), "a later run in this process would be sharded too"
    assert seen["group_size"] == 1
    assert seen["actor"] == ("CPUOffloadPolicy", 1) and seen["ref"] == ("CPUOffloadPolicy", 1)

    ref, got = step_metrics(plain), step_metrics(offloaded)
    assert sorted(got) == [1, 2, 3]
    for step in (1, 2, 3):
        for key in COMPARED:
            assert _close(got[step][key], ref[step][key]), (step, key, got[step][key], ref[step][key])

    # verl's layout: the rank's shard file holds DTensors on a one-rank "fsdp" mesh
    import torch

    actor_dir = offloaded / "checkpoints" / "global_step_2" / "actor"
    shard = torch.load(actor_dir / "model_world_size_1_rank_0.pt", weights_only=False)
    first = next(iter(shard.values()))
    assert type(first).__name__ == "DTensor" and first.device_mesh.mesh_dim_names == ("fsdp",)

    # resume from the offloaded run's step-2 checkpoint in a fresh folder: step 3 and the final
    # weights equal the straight run's
    import shutil

    resumed = tmp_path / "resumed"
    shutil.copytree(offloaded / "checkpoints" / "global_step_2", resumed / "checkpoints" / "global_step_2")
    (resumed / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2\n")
    straight_params = seen.pop("params")
    assert run_training(load_recipe("tiny_geo3k", overrides(resumed, data, 3, **OFFLOAD)), after_fit=inspect) == 0
    again = step_metrics(resumed)
    assert sorted(again) == [3]
    for key in COMPARED:
        assert again[3][key] == got[3][key], key
    for name, value in straight_params.items():
        assert torch.equal(seen["params"][name], value), name


@pytest.mark.slow
def test_offload_can_be_switched_on_or_off_at_a_resume(tmp_path, tiny_cache):
    """The out-of-memory advice says: turn on param_offload and rerun to resume. A checkpoint of the
    plain worker resumes with offloading on, and the other way round, continuing like the run that
    wrote it."""
    import shutil

    data = text_data(tmp_path / "data")
    for source, target in (({}, OFFLOAD), (OFFLOAD, {})):
        name = "offload_on" if target else "offload_off"
        straight, resumed = tmp_path / f"{name}_straight", tmp_path / f"{name}_resumed"
        assert run_training(load_recipe("tiny_geo3k", overrides(straight, data, 3, **source))) == 0
        shutil.copytree(straight / "checkpoints" / "global_step_2", resumed / "checkpoints" / "global_step_2")
        (resumed / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2\n")
        assert run_training(load_recipe("tiny_geo3k", overrides(resumed, data, 3, **target))) == 0
        assert not parallel.fsdp_enabled(1)
        ref, got = step_metrics(straight), step_metrics(resumed)
        assert sorted(got) == [3], name
        for key in COMPARED:
            assert _close(got[3][key], ref[3][key]), (name, key, got[3][key], ref[3][key])
