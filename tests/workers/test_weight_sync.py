"""Weight sync and the rollout-vs-actor check, without a rollout engine.

- every rank of an FSDP2 group gets the whole weights from `iter_full_tensors` (the stream a
  rollout engine loads), bucket by bucket, in the same order (real gloo, 2 processes): the bug
  this guards against gave rank 1 an empty state dict;
- verl's rollout_probs_diff metrics on known numbers, and the trainer stopping on a stale engine.
"""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pytest
import torch
from gloo_workers import gloo_group, spawn_gloo

from verl_npu.batch import Batch
from verl_npu.config.typed import section
from verl_npu.trainer.metrics import rollout_probs_diff_metrics
from verl_npu.trainer.ppo import EngineOutOfSync, PPOTrainer


def _gather_worker(rank: int, world: int, port: int, model_path: str, out_dir: str) -> None:
    from verl_npu.models.loading import load_policy_model
    from verl_npu.workers import parallel

    with gloo_group(rank, world, port):
        module = load_policy_model(model_path, dtype=torch.float32, attn_implementation="sdpa")
        sharded = parallel.shard_module(module, section("actor_rollout_ref.actor.fsdp_config"), world)
        # a tiny bucket (64 KiB): several buckets, and entries bigger than a bucket stand alone
        streamed = list(parallel.iter_full_tensors(sharded, dtype=torch.bfloat16, bucket_bytes=64 << 10))
        full = parallel.full_state_dict(sharded)
        torch.save({"streamed": streamed, "full": full}, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.slow
def test_every_rank_gets_the_whole_weights(tmp_path, tiny_lm_path):
    from safetensors.torch import load_file

    spawn_gloo(_gather_worker, str(tiny_lm_path), str(tmp_path))
    reference = load_file(str(tiny_lm_path / "model.safetensors"))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for rank, got in enumerate(ranks):
        names = [name for name, _ in got["streamed"]]
        assert names == [name for name, _ in ranks[0]["streamed"]]  # the same order everywhere
        assert len(names) == len(set(names)) == len(got["full"])
        for name, tensor in reference.items():
            assert torch.equal(got["full"][name], tensor), (rank, name)  # whole, not a shard, on every rank
        for name, tensor in got["streamed"]:
            assert tensor.dtype == torch.bfloat16 and tensor.shape == got["full"][name].shape
            assert torch.equal(tensor, got["full"][name].to(torch.bfloat16)), (rank, name)


def test_rollout_probs_diff_metrics_on_known_numbers():
    actor = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.1, 0.6, 0.3]]))
    rollout = torch.log(torch.tensor([[0.5, 0.30, 0.1], [0.2, 0.6, 0.9]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])  # the last column is padding: never counted
    m = rollout_probs_diff_metrics(rollout, actor, mask)
    diffs = torch.tensor([0.0, 0.05, 0.1, 0.0], dtype=torch.float64)
    assert m["training/rollout_probs_diff_valid"] == 1.0
    assert m["training/rollout_probs_diff_max"] == pytest.approx(0.1)
    assert m["training/rollout_probs_diff_mean"] == pytest.approx(float(diffs.mean()))
    assert m["training/rollout_probs_diff_std"] == pytest.approx(float(diffs.std(unbiased=False)))
    p_r, p_a = torch.tensor([0.5, 0.3, 0.2, 0.6]), torch.tensor([0.5, 0.25, 0.1, 0.6])
    expected = float(torch.corrcoef(torch.stack([p_r, p_a]))[0, 1])
    assert m["training/rollout_actor_probs_pearson_corr"] == pytest.approx(expected, rel=1e-6)
    same = rollout_probs_diff_metrics(actor, actor, mask)
    assert same["training/rollout_probs_diff_max"] == 0.0
    assert same["training/rollout_actor_probs_pearson_corr"] == pytest.approx(1.0)
    assert rollout_probs_diff_metrics(actor, actor, torch.zeros_like(mask)) == {
        "training/rollout_probs_diff_valid": 0.0
    }


def _trainer(limit):
    trainer = PPOTrainer.__new__(PPOTrainer)  # only the sync check's state
    trainer.cfg = section("backend_config", {"actor_rollout_ref": {"rollout": {"max_probs_diff": limit}}})
    trainer.checkpoints = SimpleNamespace(root="/ckpts")
    trainer.global_step = 7
    return trainer


def _batch(shift: float) -> Batch:
    torch.manual_seed(0)
    old = torch.log(torch.rand(4, 6) * 0.8 + 0.1)
    rollout = torch.log(torch.exp(old) + shift)
    return Batch({"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": torch.ones(4, 6)})


def test_a_stale_engine_stops_the_run():
    assert _trainer(0.05).check_rollout_sync(Batch({"old_log_probs": torch.zeros(1, 1)})) == {}  # hf: no check
    in_sync = _trainer(0.05).check_rollout_sync(_batch(0.01))
    assert in_sync["training/rollout_probs_diff_mean"] == pytest.approx(0.01, rel=1e-4)
    with pytest.raises(EngineOutOfSync) as err:
        _trainer(0.05).check_rollout_sync(_batch(0.08))
    msg = str(err.value)
    assert msg.startswith("step 7: the rollout engine is out of sync with the actor")
    assert "actor_rollout_ref.rollout.max_probs_diff=0.05" in msg and "/ckpts" in msg
    logged_only = _trainer(None).check_rollout_sync(_batch(0.08))  # null: log, never stop
    assert math.isclose(logged_only["training/rollout_probs_diff_mean"], 0.08, rel_tol=1e-4)
