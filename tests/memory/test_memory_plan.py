"""The memory planner (issue 26): each part's formula against hand-computed numbers, parameter counts
against real models, `verl-npu plan` / `validate`, and one loose check against a real CPU update."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from verl_npu.cli import main
from verl_npu.config import load_recipe
from verl_npu.errors import UserError
from verl_npu.memory import plan as mp
from verl_npu.memory.budget import parse_device_memory
from verl_npu.memory.recipe import add_knobs, build_plan, plan_recipe
from verl_npu.memory.settings import settings_from_recipe

REPO = Path(__file__).resolve().parents[2]
#: Qwen2.5-7B-Instruct's config.json numbers (public); 7,615,616,512 parameters
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
}
QWEN25_VL_7B = {
    **QWEN25_7B,
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "vision_config": {
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}
SMALL = mp.ModelSize(hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=10, tied=True)
OUT = ["af_output_dir=/tmp/out", "data.train_files=/tmp/t.parquet", "data.val_files=/tmp/t.parquet"]


# ------------------------------------------------------------------ model numbers
def test_parameter_counts_of_the_public_7b_configs():
    assert mp.model_size(QWEN25_7B).params == 7_615_616_512
    assert mp.model_size(QWEN25_VL_7B).params == 8_292_166_656  # Qwen2.5-VL-7B: 8.29 B


@pytest.mark.parametrize("which", ["tiny_lm_path", "tiny_vl_path"])
def test_parameter_count_equals_the_loaded_tiny_model(which, request):
    import torch

    from verl_npu.models.loading import load_policy_model

    folder = request.getfixturevalue(which)
    size = mp.model_size(json.loads((Path(folder) / "config.json").read_text()))
    model = load_policy_model(str(folder), dtype=torch.float32)
    assert size.params == sum(p.numel() for p in model.parameters())


def test_a_tiny_model_of_other_sizes_is_planned_with_its_own_shapes(tiny_cache):
    """tiny://qwen2?num_hidden_layers=1 (the distillation demo's student) is planned from a build of those sizes,
    any seed, never from the default-size build."""
    from verl_npu.memory.budget import model_numbers
    from verl_npu.models.tiny import materialize

    materialize("tiny://qwen2", cache_dir=tiny_cache)
    materialize("tiny://qwen2?seed=2&num_hidden_layers=1", cache_dir=tiny_cache)
    full, half = model_numbers("tiny://qwen2?seed=7"), model_numbers("tiny://qwen2?seed=5&num_hidden_layers=1")
    assert (full.layers, half.layers) == (2, 1) and half.params < full.params
    assert model_numbers("tiny://qwen2?hidden_size=64") is None  # not built yet: unknown, not guessed


def test_small_model_by_hand():
    # embeddings 10*8; layer: q 8*8+8, k,v 2*(8*4+4), o 8*8, mlp 3*8*16, norms 16; final norm 8
    layer = 72 + 72 + 64 + 384 + 16
    assert SMALL.layer_params == layer and SMALL.params == 80 + 2 * layer + 8
    # LoRA r=2 on q (8->8), k, v (8->4), o (8->8), gate, up (8->16), down (16->8), per layer
    assert mp.lora_params(SMALL, 2) == 2 * 2 * (16 + 12 + 12 + 16 + 24 + 24 + 24)


# ------------------------------------------------------------------ the parts
def test_weights_grads_adam_shard_and_offload():
    assert mp.weight_bytes(1000, 4, 4, False) == 1000
    assert mp.weight_bytes(1000, 2, 1, False) == 2000
    assert mp.weight_bytes(1000, 4, 4, True) == 0
    assert mp.grad_bytes(1000, 8, False) == 500 and mp.grad_bytes(1000, 8, True) == 0
    assert mp.adam_bytes(1000, 8, False) == 1000 and mp.adam_bytes(1000, 1, True) == 0


def test_activations_by_hand():
    # no checkpointing: T * (L * (6.4 H + 4.7 I) + 8 H) * b = 100 * (2 * (51.2 + 75.2) + 64) * 4
    assert mp.activation_bytes(SMALL, 100, checkpointing=False, remove_padding=False, compute_bytes=4) == int(
        100 * (2 * (6.4 * 8 + 4.7 * 16) + 8 * 8) * 4
    )
    # padding-free adds 2 H per layer; bf16 halves
    assert mp.activation_bytes(SMALL, 100, checkpointing=False, remove_padding=True, compute_bytes=2) == int(
        100 * (2 * (6.4 * 8 + 4.7 * 16 + 16) + 64) * 2
    )
    # checkpointing: each layer's input + one layer recomputed: T * (L * H + 9 H + 6 I) * b
    assert mp.activation_bytes(SMALL, 100, checkpointing=True, remove_padding=False, compute_bytes=4) == int(
        100 * (2 * 8 + 9 * 8 + 6 * 16) * 4
    )


def test_logits_and_fused_cap():
    assert mp.logits_bytes(1000, 152064, copies=3, fused=False) == 3 * 4 * 1000 * 152064
    assert mp.logits_bytes(1000, 152064, copies=3, fused=True) == 3 * (64 << 20)
    assert mp.logits_bytes(10, 10, copies=3, fused=True) == 3 * 400  # below one chunk: unchanged


def test_kv_cache_per_token_and_tensor_parallel():
    m = mp.model_size(QWEN25_7B)
    assert mp.kv_bytes_per_token(m, 1, 2) == 2 * 28 * 4 * 128 * 2 == 57344
    assert mp.kv_bytes_per_token(m, 4, 2) == 57344 // 4
    assert mp.kv_bytes_per_token(m, 8, 2) == 57344 // 4  # 4 kv heads: one per rank at TP 8 (replicated)


def _settings(*overrides, accelerator=True):
    return settings_from_recipe(
        load_recipe("qwen25_gsm8k", [*OUT, "actor_rollout_ref.model.path=/tmp/none", *overrides]), accelerator
    )


def test_vllm_engine_kv_cache_holds_whole_sequences():
    m = mp.model_size(QWEN25_7B)
    s = _settings()  # 8 devices, TP 2, gpu_memory_utilization 0.6, max_model_len 1536
    plan = build_plan(s, m, device_bytes=64 << 30, device_name="910B")
    rollout = plan.phases[0]
    engine = next(p for p in rollout.parts if p.name == "vLLM engine")
    assert engine.bytes == int(0.6 * (64 << 30))
    weights = math.ceil(m.params * 2 / 2)
    act = 8192 * (8 * 3584 + 2 * 18944) * 2 + 1024 * 152064 * 4
    seqs = (engine.bytes - weights - act) // (mp.kv_bytes_per_token(m, 2, 2) * 1536)
    assert f"{seqs} sequences of 1536 tokens" in engine.formula and seqs > 100
    tiny = build_plan(s, m, device_bytes=12 << 30, device_name="12 GiB")  # 7.2 GiB < the weights' 7.1 + 1.6
    assert tiny.verdict == "will not fit" and "holds no sequence" in tiny.problems[0]


def test_actor_update_sums_the_resident_state_and_its_micro_batch():
    m = mp.model_size(QWEN25_7B)
    s = _settings()
    plan = add_knobs(build_plan(s, m, device_bytes=64 << 30, device_name="910B"), s, m)
    update = {p.name: p.bytes for p in next(ph for ph in plan.phases if ph.name == "actor update").parts}
    assert update["actor weights"] == math.ceil(4 * m.params / 8)
    # 256 prompts x 5 / 8 ranks = 160 rows a mini-batch, 10 micro-batches of 16: later backwards run beside
    # the accumulated gradients
    assert update["actor grads (accumulated)"] == math.ceil(4 * m.params / 8)
    one = build_plan(replace(s, micro_rows=160), m, device_bytes=1 << 40, device_name="x")  # one micro-batch
    first = {p.name: p.bytes for p in next(ph for ph in one.phases if ph.name == "actor update").parts}
    assert first["actor grads at the peak"] == 4 * 152064 * 3584 // 8  # zero_grad freed the rest: the head's
    assert next(p for p in plan.phases if p.name == "rollout").parts[1].bytes == math.ceil(4 * m.params / 8)
    assert update["actor AdamW"] == math.ceil(8 * m.params / 8)
    tokens = 16 * 1536  # ppo_micro_batch_size_per_gpu 16 x (512 + 1024)
    assert update["logits + grads"] == 3 * 4 * 16 * 1024 * 152064  # padding-free: response tokens only
    saved, recompute = mp.checkpointed_split(m, tokens, remove_padding=True, compute_bytes=2)
    assert saved + recompute == mp.activation_bytes(m, tokens, checkpointing=True, remove_padding=True, compute_bytes=2)
    # checkpointing: one layer's recompute (12.4 GB - 4.9 GB) is smaller than the logits (29.9 GB): not added;
    # 8 balanced ranks with n = 5: a prompt's samples land on different ranks, no prompt is shared
    assert update["activations"] == saved == 16 * 1536 * 28 * 3584 * 2
    assert "ref weights" not in update  # the ref is offloaded in this recipe
    assert "actor_rollout_ref.model.use_fused_kernels=true" in dict(plan.knobs)


def test_a_distillation_teacher_is_planned_beside_the_actor():
    """distillation.enabled: the teacher's weights stay on every device (compute dtype, sharded like the
    reference policy) and its scoring forward is a phase of its own: the ref's micro-batch, the teacher's
    logits twice (log-softmax, then its top-k)."""
    actor, teacher = mp.model_size(QWEN25_7B), mp.model_size({**QWEN25_7B, "num_hidden_layers": 40})
    on = (
        "distillation.enabled=true",
        "distillation.teacher_models.teacher_model.model_path=/tmp/teacher",
        "distillation.distillation_loss.loss_mode=forward_kl_topk",
    )
    s = _settings(*on, "actor_rollout_ref.ref.fsdp_config.param_offload=false")
    assert s.teacher and not _settings().teacher
    plan = build_plan(s, actor, device_bytes=64 << 30, device_name="910B", teacher=teacher)
    phases = {ph.name: {p.name: p.bytes for p in ph.parts} for ph in plan.phases}
    for name in ("rollout", "actor update", "teacher log-probs"):
        assert phases[name]["teacher weights"] == math.ceil(2 * teacher.params / 8)
    tokens = (s.ref_micro_rows or s.rows_per_device) * s.seq
    scoring = phases["teacher log-probs"]
    assert scoring["forward (no grad)"] == mp.inference_bytes(teacher, tokens, 2)
    assert scoring["logits"] == mp.logits_bytes(
        tokens - (s.ref_micro_rows or s.rows_per_device) * s.prompt, teacher.vocab, copies=2, fused=False
    )
    without = build_plan(s, actor, device_bytes=64 << 30, device_name="910B")  # the teacher's shape unknown
    assert "teacher log-probs" not in {ph.name for ph in without.phases}
    # the recipe offloads the reference policy, and with it the teacher: its weights move to the host
    offloaded = build_plan(_settings(*on), actor, device_bytes=64 << 30, device_name="910B", teacher=teacher)
    assert all("teacher weights" not in {p.name for p in ph.parts} for ph in offloaded.phases)
    host = {p.name: p.bytes for p in offloaded.host}
    assert host["offloaded teacher"] == 8 * math.ceil(2 * teacher.params / 8)  # a node: 8 workers, a shard each


def test_device_memory_spellings():
    assert parse_device_memory("64GiB")[0] == 64 << 30
    assert parse_device_memory("80GB")[0] == 80 * 10**9
    assert parse_device_memory("24")[0] == 24 << 30
    assert parse_device_memory("910B")[:1] == (64 << 30,) and parse_device_memory("h200")[0] == 141 << 30
    with pytest.raises(UserError, match="--device-memory"):
        parse_device_memory("lots")


# ------------------------------------------------------------------ the commands
@pytest.fixture()
def qwen7b(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    return tmp_path


def test_plan_of_a_tiny_recipe_fits(tiny_lm_path, capsys):
    assert main(["plan", "tiny_gsm8k"]) == 0
    out = capsys.readouterr().out
    assert "actor update" in out and "peak: " in out and ": fits" in out  # (its 32 samples share a prompt)


def test_every_shipped_recipe_gets_a_plan(tiny_lm_path, tiny_vl_path, tmp_path):
    from verl_npu.config.recipes import list_recipes
    from verl_npu.memory.budget import plan_for

    for name, conf in (("qwen7b", QWEN25_7B), ("qwen7bvl", QWEN25_VL_7B)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(conf))
    from verl_npu.config.sft import is_sft_recipe
    from verl_npu.config.stages import is_stages_tree
    from verl_npu.config.tree import read_yaml_file

    for recipe in list_recipes():
        if is_stages_tree(read_yaml_file(recipe.path)):
            continue  # stages name two recipes, each planned on its own
        text = recipe.path.read_text()
        if is_sft_recipe(recipe.path):
            from verl_npu.config.sft import load_sft_recipe
            from verl_npu.memory.budget import plan_for_sft

            model = [] if "tiny://" in text else [f"model.path={tmp_path / 'qwen7b'}"]
            plan, why = plan_for_sft(load_sft_recipe(recipe.name, [*OUT[:2], *model]))
            assert plan is not None and plan.peak.name == "model update", (recipe.name, why)
            continue
        model = (
            []
            if "tiny://" in text
            else [f"actor_rollout_ref.model.path={tmp_path / ('qwen7bvl' if 'vl' in recipe.name else 'qwen7b')}"]
        )
        if model and "distillation" in text:  # the teacher, a placeholder like the student
            model.append(f"distillation.teacher_models.teacher_model.model_path={tmp_path / 'qwen7b'}")
        plan, why = plan_for(load_recipe(recipe.name, [*OUT, *model] if model else []))
        assert plan is not None, (recipe.name, why)
        assert plan.verdict in ("fits", "tight", "will not fit") and plan.peak.total > 0
        if not model:
            assert plan.verdict == "fits", recipe.name  # the CPU demos are never refused by `run`


def test_plan_names_the_phase_and_part_that_overflow_and_the_knobs(qwen7b, capsys):
    assert (
        main(
            [
                "plan",
                "qwen25_gsm8k",
                *OUT,
                f"actor_rollout_ref.model.path={qwen7b}",  # verl's micro batch
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
                "--device-memory",
                "64GiB",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "peak: old log-probs" in out and "will not fit" in out and "largest part: logits" in out
    assert "actor_rollout_ref.model.use_fused_kernels=true" in out
    assert (
        main(
            [
                "plan",
                "qwen25_gsm8k",
                *OUT,
                f"actor_rollout_ref.model.path={qwen7b}",
                "--json",
                "actor_rollout_ref.model.use_fused_kernels=true",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
                "--device-memory",
                "H100",
            ]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert plan["verdict"] in ("fits", "tight") and plan["device_bytes"] == 80 << 30
    assert {p["name"] for p in plan["phases"]} >= {"rollout", "old log-probs", "ref log-probs", "actor update"}


def test_validate_prints_one_memory_line_and_plan_refuses_unknown_models(qwen7b, capsys):
    assert main(["validate", "qwen25_gsm8k", *OUT, f"actor_rollout_ref.model.path={qwen7b}"]) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if "memory plan:" in l]
    assert len(lines) == 1 and "per device at the" in lines[0]
    assert main(["plan", "qwen25_gsm8k", *OUT, "actor_rollout_ref.model.path=/nowhere/model"]) == 1
    err = capsys.readouterr().err
    assert "actor_rollout_ref.model.path" in err and "Traceback" not in err


def test_run_refuses_a_plan_that_will_not_fit_unless_forced(tiny_lm_path, tmp_path, monkeypatch, capsys):
    import verl_npu.trainer.entry as entry

    trained = []
    monkeypatch.setattr(entry, "run_training", lambda rc, **_: trained.append(rc) or 0)
    monkeypatch.chdir(tmp_path)  # the demo data is written under ./data
    big = [
        f"af_output_dir={tmp_path / 'out'}",
        "data.max_prompt_length=2000",
        "data.max_response_length=2000",
        "actor_rollout_ref.rollout.n=64",
        "data.train_batch_size=64",
        "actor_rollout_ref.actor.ppo_mini_batch_size=64",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4096",
    ]  # 4096 rows of 4000 tokens at once
    assert main(["run", "tiny_gsm8k", *big]) == 1
    err = capsys.readouterr().err
    assert "will not fit" in err and "actor update" in err and "--force" in err and "Traceback" not in err
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2048" in err and not trained
    assert main(["run", "tiny_gsm8k", *big, "--force"]) == 0 and len(trained) == 1
    assert main(["run", "tiny_gsm8k", f"af_output_dir={tmp_path / 'out2'}"]) == 0 and len(trained) == 2
    assert ": fits" in capsys.readouterr().out


def test_run_only_warns_for_an_assumed_accelerator_card(qwen7b, capsys):
    from verl_npu.cli import _refuse_if_it_will_not_fit

    rc = load_recipe(
        "qwen25_gsm8k",
        [
            *OUT,
            f"actor_rollout_ref.model.path={qwen7b}",  # will not fit a 910B
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
        ],
    )
    _refuse_if_it_will_not_fit(rc, force=False)  # trainer.device auto: the 910B is assumed
    assert "will not fit" in capsys.readouterr().out
    with pytest.raises(UserError, match="will not fit"):
        _refuse_if_it_will_not_fit(rc, force=False, device_memory="64GiB")
    _refuse_if_it_will_not_fit(rc, force=False, device_memory="H200")  # 141 GiB: fits
    assert "warning" not in capsys.readouterr().out


# ------------------------------------------------------------------ against a real CPU update (loose bound)
def _measure():
    spec = importlib.util.spec_from_file_location("memory_measure", REPO / "bench" / "memory_measure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.measure_update


def test_actor_update_prediction_is_near_a_real_cpu_update(tiny_lm_path):
    rows, prompt, response = 8, 64, 32
    measured = _measure()(tiny_lm_path, rows=rows, prompt=prompt, response=response)
    rc = load_recipe(
        "tiny_gsm8k",
        [
            f"actor_rollout_ref.model.path={tiny_lm_path}",
            f"data.max_prompt_length={prompt}",
            f"data.max_response_length={response}",
            "actor_rollout_ref.rollout.n=2",
            f"data.train_batch_size={rows // 2}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={rows // 2}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={rows}",
            "actor_rollout_ref.model.use_remove_padding=false",
        ],
    )
    size = mp.model_size(json.loads((Path(tiny_lm_path) / "config.json").read_text()))
    assert size.params == measured["params"]
    plan = plan_recipe(rc, 1 << 34, "test", {"actor": size}, accelerator=False)
    predicted = next(p for p in plan.phases if p.name == "actor update").total
    print(f"predicted {predicted} B, measured {measured['peak']} B ({predicted / measured['peak'] - 1:+.1%})")
    assert 0.7 * measured["peak"] < predicted < 1.35 * measured["peak"], (predicted, measured)


# ------------------------------------------------------------------ the grid's formulas (bench/memory_grid.py)
def test_shared_prompts_run_each_prompt_once_padding_free():
    m = mp.model_size(QWEN25_7B)
    base = _settings("actor_rollout_ref.model.enable_gradient_checkpointing=false", accelerator=True)
    padded = replace(base, remove_padding=False)
    free = replace(base, remove_padding=True, balance=False)  # trainer.balance_batch=false: samples stay together
    balanced = replace(base, remove_padding=True)
    act = {}
    for name, s in (("padded", padded), ("free", free), ("balanced", balanced)):
        plan = build_plan(s, m, device_bytes=64 << 30, device_name="910B")
        act[name] = next(
            p for p in next(ph for ph in plan.phases if ph.name == "actor update").parts if p.name == "activations"
        )
    # 16 rows, n = 5: ceil(16 / 5) = 4 prompts of 512 + 16 responses of 1024 tokens
    assert act["free"].bytes == mp.activation_bytes(
        m, 4 * 512 + 16 * 1024, checkpointing=False, remove_padding=True, compute_bytes=2
    )
    assert act["padded"].bytes == mp.activation_bytes(
        m, 16 * 1536, checkpointing=False, remove_padding=False, compute_bytes=2
    )
    assert "each prompt once" in act["free"].formula
    # balance_batch deals a prompt's 5 samples to 5 of the 8 ranks: nothing shared
    assert act["balanced"].bytes == mp.activation_bytes(
        m, 16 * 1536, checkpointing=False, remove_padding=True, compute_bytes=2
    )


def test_fsdp_backward_holds_a_prefetched_layer_and_two_layers_of_grads():
    m = mp.model_size(QWEN25_7B)
    s = _settings()
    plan = build_plan(s, m, device_bytes=64 << 30, device_name="910B")
    update = {p.name: p.bytes for p in next(ph for ph in plan.phases if ph.name == "actor update").parts}
    assert (
        update["FSDP2 backward: a prefetched layer + two layers' unsharded grads"]
        == m.layer_params * 2 + 2 * 4 * m.layer_params
    )
    lora = build_plan(replace(s, lora_rank=8), m, device_bytes=64 << 30, device_name="910B")
    part = next(
        p for p in next(ph for ph in lora.phases if ph.name == "actor update").parts if "FSDP2 backward" in p.name
    )
    assert part.bytes == m.layer_params * 2 + 2 * 4 * (mp.lora_params(m, 8) // m.layers)
    one = build_plan(replace(s, world=1, fsdp=False), m, device_bytes=1 << 40, device_name="x")
    assert not any("FSDP2" in p.name for ph in one.phases for p in ph.parts)


def test_offload_moves_nothing_off_a_cpu_device_and_lora_has_a_reference_pass():
    m = mp.model_size(QWEN25_7B)
    s = _settings(
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
        accelerator=False,
    )
    cpu = build_plan(s, m, device_bytes=1 << 40, device_name="cpu")
    accel = build_plan(replace(s, cpu=False), m, device_bytes=1 << 40, device_name="npu")
    resident = lambda plan: {p.name: p.bytes for p in plan.phases[-1].parts}  # noqa: E731 - checkpoint save
    assert resident(cpu)["actor weights"] == math.ceil(4 * m.params / 8) and "actor weights" not in resident(accel)
    assert not any("offloaded" in p.name for p in cpu.host)
    lora = settings_from_recipe(
        load_recipe(
            "qwen25_gsm8k", [*OUT, "actor_rollout_ref.model.path=/tmp/none", "actor_rollout_ref.model.lora_rank=8"]
        )
    )
    assert not lora.use_ref and lora.kl
    phases = {p.name: p for p in build_plan(lora, m, device_bytes=64 << 30, device_name="910B").phases}
    assert "ref log-probs" in phases and not any(p.name == "ref weights" for p in phases["ref log-probs"].parts)


# ------------------------------------------------------------------ known model shapes
@pytest.mark.parametrize(
    "path, hub_id, params",
    [
        ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct", 494_032_768),  # the model card's counts
        ("/home/user/verl/models/Qwen2.5-3B", "Qwen/Qwen2.5-3B-Instruct", 3_085_938_688),
        ("/home/user/verl/models/Qwen2.5-7B-Instrct", "Qwen/Qwen2.5-7B-Instruct", 7_615_616_512),
        ("Qwen/Qwen2.5-32B", "Qwen/Qwen2.5-32B-Instruct", 32_763_876_352),
        ("EDIT_ME: /path/to/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct", 8_292_166_656),
    ],
)
def test_known_shapes_give_the_published_parameter_counts(path, hub_id, params):
    from verl_npu.config.known_models import known_config

    found = known_config(path)
    assert found is not None and found[0] == hub_id
    assert mp.model_size(found[1]).params == params


def test_unknown_names_are_not_guessed():
    from verl_npu.config.known_models import known_config

    assert known_config("/models/llama-3-8b") is None and known_config("Qwen/Qwen9-1B") is None
    assert known_config("") is None and known_config(None) is None


# ------------------------------------------------------------------ the shipped recipes' headers
HEADER = re.compile(
    r"^# Memory: per NPU: ([0-9.]+) GiB of ([0-9]+) at the ([a-z -]+?) \(([a-z ]+)\): a forecast, "
    r"not measured on an NPU, from\n#   `verl-npu plan (\w+) ((?:actor_rollout_ref\.)?model\.path)=([^`]+)`",
    re.M,
)


def _planned(path: Path) -> bool:
    """Whether `verl-npu plan` plans the recipe: RL and SFT recipes; a stages recipe names two recipes that are
    planned each on its own."""
    from verl_npu.config.stages import is_stages_tree
    from verl_npu.config.tree import read_yaml_file

    return not is_stages_tree(read_yaml_file(path))


#: every shipped accelerator recipe that `plan` plans (the tiny_* ones run on a CPU)
ACCELERATOR_RECIPES = sorted(
    p.stem for p in (REPO / "recipes").glob("*.yaml") if not p.stem.startswith("tiny_") and _planned(p)
)


@pytest.mark.parametrize("recipe", ACCELERATOR_RECIPES)
def test_accelerator_recipe_header_states_its_plan(recipe, capsys):
    """The header's figure is what `verl-npu plan` prints for the recipe with its model path set (so it
    cannot drift from the planner), and the recipe fits its stated hardware."""
    text = (REPO / "recipes" / f"{recipe}.yaml").read_text()
    m = HEADER.search(text)
    assert m, f"recipes/{recipe}.yaml has no '# Memory: per NPU: ...' header line"
    gib, device, phase, verdict, name, model_key, model = m.groups()
    assert name == recipe and f"EDIT_ME: /path/to/{model}" in text
    args = [*OUT, f"{model_key}={model}"]
    assert main(["plan", recipe, *args]) == 0
    out = capsys.readouterr().out
    printed = re.search(r"^peak: (.+?), ([0-9.]+) GiB of ([0-9.]+) GiB \(\d+%\): (.+)$", out, re.M)
    assert printed, out
    assert (printed[1], f"{float(printed[2]):.1f}", float(printed[3]), printed[4]) == (
        phase,
        gib,
        float(device),
        verdict,
    )
    assert verdict in ("fits", "tight")


# ------------------------------------------------------------------ against real CPU training steps (bench/memory_grid.py)
def _grid():
    spec = importlib.util.spec_from_file_location("memory_grid", REPO / "bench" / "memory_grid.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_grid_point(name: str, work: Path) -> None:
    result = _grid().run_one(name, work)
    measured, planned = result["measured"]["phases"], result["planned"]["phases"]
    assert {"rollout", "old log-probs", "actor update"} <= set(measured)
    for phase, got in measured.items():
        want = planned[phase]
        low, high = (0.75, 1.33) if phase in ("actor update", "critic update") else (0.6, 1.5)
        assert low * got < want < high * got, (name, phase, want, got)
    assert 0.6 < result["planned"]["host"] / result["measured"]["host"] < 1.5, result


def test_plan_is_near_a_real_cpu_training_step(tmp_path):
    """One grid point: 2 real steps of tiny_gsm8k (one worker), every phase's peak from torch's
    profiler against the plan (loose bounds; bench/results/memory_plan.md has the grid)."""
    _check_grid_point("text-tiny-ckpt-kl", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["text-mid-2w-critic", "vl-tiny-rmpad-kl"])
def test_plan_is_near_real_cpu_training_steps_two_workers_critic_vision(name, tmp_path):
    _check_grid_point(name, tmp_path)
