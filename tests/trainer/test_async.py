"""separate_async without a run (issue 37): the staleness sampler's drop and wait acting on a forced-stale group, and
the config keys (verl's batch rule, refusals by name). The weight transfer between real processes is checked by the
runs of tests/trainer/test_async_run.py (both backends, every transfer)."""

from __future__ import annotations

import pytest

from verl_npu.config import load_recipe
from verl_npu.errors import ConfigErrors
from verl_npu.trainer import async_ppo
from verl_npu.trainer.off_policy import StalenessSampler, staleness_metrics

BC = "backend_config."
ASYNC = [
    "trainer.v1.trainer_mode=separate_async",
    "actor_rollout_ref.rollout.nnodes=1",
    "trainer.v1.separate_async.parameter_sync_step=1",
]  # tiny_gsm8k: train_batch_size 8 = 1 x mini-batch 8


# ---- the sampler ---------------------------------------------------------------------------------------------
def _issue_batch(sampler, tag, version, size=2):
    uids = [f"{tag}-{i}" for i in range(size)]
    for uid in uids:
        sampler.issue(uid, version, data=f"prompt {uid}")
    return uids


def test_drop_evicts_a_forced_stale_group_and_its_refill_is_trained_once():
    """k=1: a group of batch 1 (version 0) arrives late, after batch 2's; at step version 1 it is not yet there, so
    the step takes the oldest ready groups; at version 2 it is staler than 1: evicted, reissued, and its refill
    (generated at version 2) is trained. Every uid is trained exactly once."""
    s = StalenessSampler(1, "drop")
    first = _issue_batch(s, 1, 0)
    second = _issue_batch(s, 2, 0)
    for uid in first:
        s.arrive(uid, 0, uid)
    picked = s.select(0, 2)
    assert [r.uid for r in picked.groups] == first and not picked.dropped
    third = _issue_batch(s, 3, 1)
    s.arrive(second[1], 0, second[1])  # second[0] is the straggler
    for uid in third:
        s.arrive(uid, 1, uid)
    picked = s.select(1, 2)  # drop does not wait for the straggler
    assert [r.uid for r in picked.groups] == [second[1], third[0]]
    s.arrive(second[0], 0, second[0])  # arrives late: staleness 2 at version 2
    assert s.select(2, 2) is None  # only third[1] is left after the eviction
    assert [r.uid for r in s.pending_dropped] == [second[0]] and s.dropped_total == 1
    s.issue(second[0], 2)  # the refill, at the current version
    s.arrive(second[0], 2, "refill")
    picked = s.select(2, 2)
    assert [(r.uid, r.version) for r in picked.groups] == [(third[1], 1), (second[0], 2)]
    assert max(2 - r.version for r in picked.groups) <= 1


def test_wait_blocks_on_an_in_flight_group_at_the_threshold_and_trains_it_in_time():
    """The same straggler with wait: the step at version 1 may not leave it behind (its staleness reached k=1), so
    select waits until it arrives and trains it at staleness 1; nothing is dropped."""
    s = StalenessSampler(1, "wait")
    first = _issue_batch(s, 1, 0)
    second = _issue_batch(s, 2, 0)
    for uid in first:
        s.arrive(uid, 0, uid)
    assert [r.uid for r in s.select(0, 2).groups] == first  # version-0 groups have staleness 0 < 1: no wait
    third = _issue_batch(s, 3, 1)
    s.arrive(second[1], 0, second[1])
    for uid in third:
        s.arrive(uid, 1, uid)
    assert s.blocking(1) == [second[0]] and s.select(1, 2) is None  # waits although 3 groups are ready
    s.arrive(second[0], 0, second[0])
    picked = s.select(1, 2)
    assert [r.uid for r in picked.groups] == second and not picked.dropped and s.dropped_total == 0
    assert [r.uid for r in s.untrained()] == third


def test_sampler_refuses_a_twice_issued_uid_and_reports_verls_metrics():
    s = StalenessSampler(0, "drop")
    s.issue("1-0", 0)
    with pytest.raises(ValueError, match="issued twice"):
        s.issue("1-0", 0)
    with pytest.raises(ValueError, match="never issued"):
        s.arrive("9-9", 0, None)
    m = staleness_metrics([0, 0, 2, 2], [3, 1], dropped=1)
    assert m["training/off_policy/trajectory_staleness/max"] == 2 and m["training/off_policy/trajectory_spans/max"] == 1
    assert (
        m["training/off_policy/trajectory_staleness_worst/mean"] == 1
        and m["training/off_policy/dropped_stale_groups"] == 1
    )


# ---- config ------------------------------------------------------------------------------------------------------
def test_separate_async_keys_load_and_derive_the_behaviour_log_probs():
    rc = load_recipe(
        "tiny_gsm8k",
        ASYNC + ["trainer.v1.sampler.max_off_policy_threshold=1", "trainer.v1.sampler.max_off_policy_strategy=wait"],
    )
    v1 = rc.typed.trainer.v1
    assert (v1.trainer_mode, v1.sampler.max_off_policy_threshold, v1.sampler.max_off_policy_strategy) == (
        "separate_async",
        1,
        "wait",
    )
    assert rc.typed.actor_rollout_ref.rollout.calculate_log_probs is True
    assert BC + "actor_rollout_ref.rollout.calculate_log_probs" in {d.key for d in rc.derived}
    assert load_recipe("tiny_gsm8k", []).typed.trainer.v1.trainer_mode == "sync"
    two = load_recipe("tiny_gsm8k", ASYNC + ["actor_rollout_ref.rollout.n_gpus_per_node=2"]).typed
    assert async_ppo.rollout_processes(two) == 2 and async_ppo.rollout_processes(rc.typed) == 1


def test_the_device_layer_places_rollout_processes_and_picks_the_weight_broadcast_backend(monkeypatch):
    """Beside a trainer on device 0: devices of their own when the node has enough (the device's own collective
    backend, device to device), else the node's devices in turn, shared with the trainer (gloo through host memory:
    NCCL and HCCL refuse two ranks on one device). The CPU: host memory is everyone's, gloo."""
    from verl_npu.device import DeviceInfo

    for kind, backend, count, processes, want in [
        ("cuda", "nccl", 8, 2, ([1, 2], False)),
        ("cuda", "nccl", 1, 1, ([0], True)),
        ("npu", "hccl", 2, 2, ([0, 1], True)),
        ("npu", "hccl", 16, 8, (list(range(1, 9)), False)),
        ("cpu", "gloo", 2, 2, ([0, 0], False)),
    ]:
        device = DeviceInfo(kind)
        monkeypatch.setattr(DeviceInfo, "count", lambda self, _n=count: _n)
        placed = device.beside_trainer(1, processes)
        assert placed == want, (kind, count, processes)
        assert device.weight_sync_backend(placed[1]) == ("gloo" if placed[1] else backend)


@pytest.mark.parametrize(
    "overrides,key,words",
    [
        (
            ["trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1"],
            "trainer.v1.separate_async.parameter_sync_step",
            "parameter_sync_step=1",
        ),
        (["trainer.v1.trainer_mode=colocate_async"], "trainer.v1.trainer_mode", "separate_async"),
        (ASYNC[:1] + ASYNC[2:], "actor_rollout_ref.rollout.nnodes", "rollout.nnodes=1"),
        (ASYNC + ["actor_rollout_ref.rollout.nnodes=2"], "actor_rollout_ref.rollout.nnodes", "n_gpus_per_node=2"),
        (["actor_rollout_ref.rollout.nnodes=1"], "actor_rollout_ref.rollout.nnodes", "trainer_mode=separate_async"),
        (ASYNC + ["trainer.nnodes=2"], "trainer.nnodes", "trainer.nnodes=1"),
        (ASYNC + ["actor_rollout_ref.model.lora_rank=8"], "actor_rollout_ref.model.lora_rank", "lora_rank=0"),
        (ASYNC + ["algorithm.adv_estimator=remax"], "algorithm.adv_estimator", "grpo"),
        (
            ASYNC
            + ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc", "data.gen_batch_size=16"],
            "data.gen_batch_size",
            "gen_batch_size=null",
        ),
        (
            ASYNC + ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
            "actor_rollout_ref.rollout.n_gpus_per_node",
            "multiple of 2",
        ),
        # a custom agent loop's rows carry no per-token versions: refused with vllm's partial rollout
        (
            ASYNC
            + [
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.agent.agent_loop_config_path=loops.yaml",
            ],
            "actor_rollout_ref.rollout.agent.agent_loop_config_path",
            "rollout.name=hf",
        ),
        (
            ASYNC + ["actor_rollout_ref.rollout.calculate_log_probs=false"],
            "actor_rollout_ref.rollout.calculate_log_probs",
            "calculate_log_probs=true",
        ),
        (
            ASYNC + ["trainer.v1.sampler.max_off_policy_threshold=0", "trainer.v1.separate_async.num_warmup_batches=2"],
            "trainer.v1.separate_async.num_warmup_batches",
            "num_warmup_batches <= 1",
        ),
        (
            ASYNC + ["trainer.v1.separate_async.hybrid_rollout.enable_switch=true"],
            "trainer.v1.separate_async.hybrid_rollout.enable_switch",
            "hybrid_rollout",
        ),
        (
            ASYNC + ["trainer.v1.sampler.custom_sampler.path=my.py"],
            "trainer.v1.sampler.custom_sampler.path",
            "max_off_policy_strategy",
        ),
    ],
)
def test_what_separate_async_does_not_build_is_refused_by_name_with_a_fix(overrides, key, words):
    with pytest.raises(ConfigErrors) as info:
        load_recipe("tiny_gsm8k", overrides)
    problems = [p for p in info.value.problems if p.key == BC + key]
    assert problems, [p.key for p in info.value.problems]
    assert words in problems[0].fix + problems[0].message, str(problems[0])
