"""LoRA through peft (actor_rollout_ref.model.lora_rank > 0) on CPU with a tiny text model: only the
adapters train, the reference is the base model with adapters off, vLLM's sync gets peft's own merged
weights, the HF export holds the merged model and a peft adapter folder, resume and lora_adapter_path."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file
from test_e2e_cpu import COMPARED, _gsm8k_like, read_metrics, tiny_overrides

from verl_npu.batch import Batch
from verl_npu.config import load_recipe
from verl_npu.models import lora
from verl_npu.models.forward import response_log_probs
from verl_npu.models.loading import load_policy_model
from verl_npu.trainer.entry import run_training

LORA = {
    "actor_rollout_ref.model.path": "tiny://qwen2",
    "actor_rollout_ref.model.lora_rank": 4,
    "actor_rollout_ref.model.lora_alpha": 8,
    "actor_rollout_ref.actor.optim.lr": 0.05,
    "data.max_prompt_length": 48,
    "trainer.test_freq": -1,
    "trainer.logger": "[console]",
}


def _worker(tmp_path, **extra):
    from verl_npu.device import detect_device
    from verl_npu.workers.actor import ActorRolloutRefWorker

    data = _gsm8k_like(tmp_path / "gsm")
    rc = load_recipe("tiny_geo3k", tiny_overrides(tmp_path, data, **{**LORA, **extra}))
    worker = ActorRolloutRefWorker(rc.typed, device=detect_device("cpu"), total_training_steps=2)
    worker.init_model()
    return worker


def _batch(vocab: int, rows: int = 4, prompt: int = 6, response: int = 4) -> Batch:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, prompt + response), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # one left-padded prompt
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "responses": ids[:, prompt:],
            "response_mask": torch.ones(rows, response),
            "advantages": torch.linspace(-1, 1, rows)[:, None].expand(rows, response).contiguous(),
        }
    )


def _base_log_probs(path: str, batch: Batch) -> torch.Tensor:
    base = load_policy_model(path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        lp, _ = response_log_probs(base, batch["input_ids"], batch["attention_mask"], batch["responses"].shape[1])
    return lp


def test_only_adapters_train_and_the_reference_is_the_base_model(tmp_path, tiny_lm_path):
    worker = _worker(tmp_path)
    module = worker.module
    assert lora.is_lora(module) and worker.ref_module is None and worker.ref_is_actor
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # all-linear: every projection of every block, never the output head
    assert any("q_proj.lora_A" in n for n in trainable) and any("down_proj.lora_B" in n for n in trainable)
    assert not any("lm_head" in n for n in trainable)
    batch = _batch(module.config.vocab_size)
    batch.update(worker.compute_log_prob(batch))
    batch.update(worker.compute_ref_log_prob(batch))
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    metrics = worker.update_actor(batch)
    assert metrics["actor/grad_norm"] > 0
    changed = {n for n, p in module.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable
    assert any(".lora_B." in n for n in changed)  # B starts at zero: the adapter is now active
    state_params = set(worker.optimizer.state)
    assert state_params == {p for n, p in module.named_parameters() if n in trainable}
    # after the step the actor differs from the base; the reference still equals a fresh base model
    ref = worker.compute_ref_log_prob(batch)["ref_log_prob"]
    base = _base_log_probs(tiny_lm_path, batch)
    torch.testing.assert_close(ref, base, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(worker.compute_log_prob(batch)["old_log_probs"], base, atol=1e-4)
    # what the vLLM sync streams: the base model's names, W + B @ A * scaling for adapted layers
    from verl_npu.workers import parallel

    synced = dict(lora.merged_tensors(module, parallel.iter_full_tensors(module), dtype=torch.bfloat16))
    expected = worker.peft_model.merge_and_unload().state_dict()
    assert set(synced) == set(expected) and all(v.dtype == torch.bfloat16 for v in synced.values())
    for key, value in expected.items():
        torch.testing.assert_close(synced[key], value.to(torch.bfloat16), msg=key)


def test_merged_weights_equal_peft_merge_and_unload(tiny_lm_path):
    from peft import LoraConfig, get_peft_model

    base = load_policy_model(tiny_lm_path, dtype=torch.float32)
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=16, target_modules="all-linear", exclude_modules=["o_proj"])
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(std=0.5)
    merged = lora.merged_state_dict(model, {k: v.clone() for k, v in model.state_dict().items()})
    expected = model.merge_and_unload().state_dict()
    assert set(merged) == set(expected)
    assert not any("lora" in k or "base_layer" in k for k in merged)
    for key, value in expected.items():
        torch.testing.assert_close(merged[key], value, rtol=1e-6, atol=1e-6, msg=key)
    assert not any("o_proj" in k for k in lora._lora_layers(model))


@pytest.mark.slow
def test_checkpoint_export_resume_and_adapter_path(tmp_path, tiny_lm_path):
    """A 3-step LoRA run with checkpoints; huggingface/ holds the merged model and a peft adapter
    folder; resuming from global_step_2 trains step 3 as the straight run did; a new run started
    from the exported adapter (lora_adapter_path) computes that adapter's log-probs."""
    from peft import PeftModel

    data = _gsm8k_like(tmp_path / "gsm")
    common = {
        **LORA,
        "trainer.total_training_steps": 3,
        "trainer.save_freq": 1,
        "trainer.max_actor_ckpt_to_keep": "null",
        "custom_reward_function.path": _dense_reward(tmp_path),
    }
    straight = tmp_path / "straight"
    assert run_training(load_recipe("tiny_geo3k", tiny_overrides(straight, data, **common))) == 0
    reference = {r["step"]: r for r in read_metrics(straight / "out")}
    hf = straight / "out" / "checkpoints" / "global_step_3" / "actor" / "huggingface"
    assert (hf / "lora_adapter" / "adapter_config.json").is_file()
    assert (hf / "lora_adapter" / "adapter_model.safetensors").is_file()
    adapter = PeftModel.from_pretrained(load_policy_model(tiny_lm_path, dtype=torch.float32), hf / "lora_adapter")
    merged = adapter.merge_and_unload().state_dict()
    exported = load_file(hf / "model.safetensors")
    assert exported and not any("lora" in k for k in exported)
    for key, value in exported.items():
        torch.testing.assert_close(value, merged[key], rtol=1e-5, atol=1e-6, msg=key)

    # resume from global_step_2 (global_step_3 gone): step 3 is trained again exactly
    out = tmp_path / "resumed" / "out"
    shutil.copytree(straight / "out", out)
    shutil.rmtree(out / "checkpoints" / "global_step_3")
    (out / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2\n")
    assert run_training(load_recipe("tiny_geo3k", tiny_overrides(out.parent, data, **common))) == 0
    assert f"resumed from {out / 'checkpoints' / 'global_step_2'}" in (out / "logs" / "run.log").read_text()
    rows = {r["step"]: r for r in read_metrics(out)}
    assert sorted(rows) == [1, 2, 3]
    for key in COMPARED:
        assert rows[3][key] == pytest.approx(reference[3][key], rel=1e-4, abs=1e-6), key

    # lora_adapter_path: a fresh worker starts from the exported adapter
    worker = _worker(tmp_path / "from_adapter", **{"actor_rollout_ref.model.lora_adapter_path": hf / "lora_adapter"})
    batch = _batch(worker.module.config.vocab_size)
    got = worker.compute_log_prob(batch)["old_log_probs"]
    adapter = PeftModel.from_pretrained(load_policy_model(tiny_lm_path, dtype=torch.float32), hf / "lora_adapter")
    adapter.eval()
    with torch.no_grad():
        want, _ = response_log_probs(adapter, batch["input_ids"], batch["attention_mask"], 4)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(want, _base_log_probs(tiny_lm_path, batch), atol=1e-4)


def _dense_reward(tmp_path):
    reward = tmp_path / "dense.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(sum(map(ord, solution_str)) % 7) / 6.0\n"
    )
    return reward


def test_an_adapter_path_without_adapter_config_is_a_config_error(tmp_path):
    from verl_npu.errors import ConfigErrors

    data = _gsm8k_like(tmp_path / "gsm")
    over = tiny_overrides(tmp_path, data, **{**LORA, "actor_rollout_ref.model.lora_adapter_path": tmp_path})
    with pytest.raises(ConfigErrors) as info:
        load_recipe("tiny_geo3k", over, check_paths=True)
    [problem] = info.value.problems
    assert problem.key.endswith("model.lora_adapter_path") and "adapter_config.json" in problem.message


@pytest.mark.slow
def test_two_fsdp2_workers_train_the_adapter(tmp_path, tiny_lm_path):
    """2 CPU workers (FSDP2 shards, gloo): a LoRA step (two optimizer updates) with the KL loss to the adapters-off
    reference; the export's merged weights are peft's merge of the exported adapter, and weights
    without an adapter (embeddings, norms) are still the base model's."""
    from peft import PeftModel

    data = _gsm8k_like(tmp_path / "gsm")
    over = {
        **LORA,
        "trainer.n_gpus_per_node": 2,
        "trainer.total_training_steps": 1,
        "trainer.save_freq": 1,
        "custom_reward_function.path": _dense_reward(tmp_path),
        "ray_init.num_cpus": 2,
    }
    assert run_training(load_recipe("tiny_geo3k", tiny_overrides(tmp_path, data, **over))) == 0
    [row] = read_metrics(tmp_path / "out")
    # two mini-batches: the second one's KL to the adapters-off reference is above 0
    assert row["actor/grad_norm"] > 0 and 0 < row["actor/kl_loss"] < 1
    hf = tmp_path / "out" / "checkpoints" / "global_step_1" / "actor" / "huggingface"
    base = load_policy_model(tiny_lm_path, dtype=torch.float32).state_dict()
    merged = (
        PeftModel.from_pretrained(load_policy_model(tiny_lm_path, dtype=torch.float32), hf / "lora_adapter")
        .merge_and_unload()
        .state_dict()
    )
    exported = load_file(hf / "model.safetensors")
    for key, value in exported.items():
        torch.testing.assert_close(value, merged[key], rtol=1e-5, atol=1e-6, msg=key)
    assert torch.equal(exported["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    assert not torch.equal(
        exported["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
