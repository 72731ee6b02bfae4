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
