"""Helpers of the separate_async tests that stop a run and resume it (tests/trainer/test_async_run.py,
test_async_vllm.py): the per-group version records, what the stopped run's checkpoint holds, and the checks that
the rerun trained every prompt of the epoch exactly once."""

from __future__ import annotations

import json

from run_helpers import step_metrics

from verl_npu.trainer import async_ppo
from verl_npu.trainer.checkpoint import load_torch


def versions_of(out) -> list[dict]:
    return [json.loads(line) for line in (out / "async" / "versions.jsonl").read_text().splitlines()]


def stopped_at(out) -> tuple[int, list[str]]:
    """The newest checkpoint of a stopped one-step-off run and the uids it holds as issued and untrained: the next
    batch (read before the rerun, which removes old checkpoints)."""
    last = int((out / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
    state = load_torch(out / "checkpoints" / f"global_step_{last}" / async_ppo.ASYNC_STATE_FILE)
    reissued = [uid for uid, _ in state["untrained"]]
    assert reissued == [f"{last + 1}-{i}" for i in range(4)] and state["issued_batches"] == last + 1
    assert [row for _, row in state["untrained"]] == list(range(4 * last, 4 * last + 4))  # data.shuffle=false
    return last, reissued


def resumed_once(out, steps, last, reissued) -> None:
    """After the rerun: the prompts the checkpoint held were reissued at the restored version, and each of the
    epoch's 4 x `steps` prompts was trained exactly once, every other group one version before the one it updates."""
    records = versions_of(out)
    assert sorted(r["uid"] for r in records) == sorted(f"{s}-{i}" for s in range(1, steps + 1) for i in range(4))
    for r in records:
        expected = last if r["uid"] in reissued else max(0, r["step"] - 2)
        assert r["generation_version"] == expected and r["uid"].split("-")[0] == str(r["step"]), r
    assert sorted(step_metrics(out)) == list(range(1, steps + 1))


def transfer_mid_part(cfg, model_path, prompts, params):
    """A rollout side of one process (one engine) built from the typed config `cfg`: version 0 (the weights at
    `model_path`) is pushed, `prompts` (their `uid`s name the part) are issued with `params`, and version 1, far from
    version 0, is pushed right behind the part, so that it arrives while the part is in flight. Checks both
    versions' digests as the rollout side reports them; returns (the part's rows, the model, {version: weights})."""
    import torch
    from transformers import AutoModelForCausalLM

    from verl_npu.device import DeviceInfo
    from verl_npu.workers.rollout_side import RolloutSide
    from verl_npu.workers.weight_transfer import weights_digest

    side = RolloutSide(cfg, "collective", 1, DeviceInfo("cpu"))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
        v0 = {n: p.detach().clone() for n, p in model.named_parameters()}
        side.send_all("weights", 0)
        side.sender.send(0, v0)
        uids = list(prompts["uid"])
        side.generate(uids, prompts, params)
        torch.manual_seed(0)
        v1 = {n: t + 0.3 * torch.randn_like(t) for n, t in v0.items()}  # far from v0: its tokens differ clearly
        side.send_all("weights", 1)  # queued right behind the part: taken after the part's first engine step
        side.sender.send(1, v1)
        digests, rows = {}, None
        while rows is None or len(digests) < 2:
            reply = side.next_reply(timeout_s=300)
            if reply[0] == "weights":
                digests[reply[2]] = reply[4]
            elif reply[0] == "groups":
                rows = reply[4]
        assert digests == {0: weights_digest(v0.items()), 1: weights_digest(v1.items())}
    finally:
        side.close()
    return rows, model, {0: v0, 1: v1}


def assert_each_token_is_its_versions(rows, model, weights: dict) -> None:
    """Each model token's behaviour log-prob (`rollout_log_probs`) is transformers' log-prob of it, over its whole
    context, under the weights of the version that sampled it (`rollout_versions`), to 1e-3; under the other
    version's weights it differs by more than 0.1 somewhere (so the check can fail)."""
    import torch

    from verl_npu.models.forward import response_log_probs

    versions, mask = rows["rollout_versions"], rows["response_mask"].bool()
    width = versions.shape[1]
    behaviour = rows["rollout_log_probs"]
    gap = {}
    for version, state in weights.items():
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(state[name])
            lp, _ = response_log_probs(model, rows["input_ids"], rows["attention_mask"], width)
        mine = (versions == version) & mask
        assert float((behaviour - lp).abs()[mine].max()) < 1e-3, version  # each token: its own version's log-prob
        gap[version] = float((behaviour - lp).abs()[(versions != version) & mask].max())
    assert min(gap.values()) > 0.1, gap


def one_step_off(rollout_processes: int = 1) -> dict:
    """The overrides of a one-step-off run (k=1, a weight push after every one-mini-batch step, decoupled PPO) with
    `rollout_processes` rollout processes."""
    return {
        "trainer.v1.trainer_mode": "separate_async",
        "actor_rollout_ref.rollout.nnodes": 1,
        "actor_rollout_ref.rollout.n_gpus_per_node": rollout_processes,
        "trainer.v1.separate_async.parameter_sync_step": 1,
        "trainer.v1.sampler.max_off_policy_threshold": 1,
        "algorithm.rollout_correction.rollout_is": "token",
    }


def async_mode(k: int | None) -> dict:
    """The overrides of a separate_async run with staleness bound `k` (one rollout process, a weight push after
    every one-mini-batch step); none for k=None (the sync run it is compared with)."""
    if k is None:
        return {}
    return {
        "trainer.v1.trainer_mode": "separate_async",
        "actor_rollout_ref.rollout.nnodes": 1,
        "trainer.v1.separate_async.parameter_sync_step": 1,
        "trainer.v1.sampler.max_off_policy_threshold": k,
    }


def kill_then_resume(monkeypatch, rc, out, steps: int) -> int:
    """Run `rc` (one-step-off, a checkpoint every step, writing to `out`) with rollout process 1 killed by SIGKILL
    in step 3: the run stops with an error naming it, the last checkpoint holds the next batch as issued and
    untrained, and the version records are those of the checkpointed steps. Then the same command again: it resumes
    and trains every prompt of the epoch (`steps` steps) exactly once. Returns the step it resumed from."""
    import os
    import signal

    import pytest

    from verl_npu.trainer.entry import run_training
    from verl_npu.workers.rollout_side import RolloutSideDied

    step = async_ppo.AsyncPPOTrainer.train_step

    def kill_rollout_in_step_3(self, prompts):
        if self.global_step == 3:
            os.kill(self.rollout.processes[1].pid, signal.SIGKILL)
            self.rollout.processes[1].join(timeout=60)
        return step(self, prompts)

    monkeypatch.setattr(async_ppo.AsyncPPOTrainer, "train_step", kill_rollout_in_step_3)
    with pytest.raises(RolloutSideDied, match=r"rollout process 1 \(pid \d+\) exited with code -9"):
        run_training(rc)
    last, reissued = stopped_at(out)
    assert last in (2, 3)
    assert sorted(r["step"] for r in versions_of(out)) == sorted(s for s in range(1, last + 1) for _ in range(4))
    monkeypatch.setattr(async_ppo.AsyncPPOTrainer, "train_step", step)
    assert run_training(rc) == 0
    resumed_once(out, steps, last, reissued)
    return last
