"""`verl-npu plan` of an SFT recipe (verl_npu.memory.settings.settings_from_sft, recipe.plan_sft): the model's update
planned from verl's SFT keys, checked against a real SFT step on the CPU measured by torch's memory tracker (the
instrument of bench/memory_measure.py); its knobs are SFT keys, each lowering the peak by what it says when applied."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from verl_npu.cli import main
from verl_npu.config.known_models import known_config
from verl_npu.config.sft import load_sft_recipe
from verl_npu.memory import plan as mp
from verl_npu.memory.recipe import plan_sft

QWEN25_7B = known_config("Qwen2.5-7B-Instruct")[1]  # the public config.json's numbers (the known-shapes table)

OUT = ["af_output_dir=/tmp/out", "data.train_files=/tmp/t.parquet"]


def _sft_step_peak(rc, rows: int, length: int) -> int:
    """The peak bytes of tensors during the second optimizer step of a real SFTWorker on the CPU (one micro-batch of
    `rows` full conversations of `length` tokens, every token the assistant's)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from verl_npu.batch import Batch
    from verl_npu.device import detect_device
    from verl_npu.sft.worker import SFTWorker

    worker = SFTWorker(rc.typed, total_training_steps=4, device=detect_device("cpu"))
    worker.init_model()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 400, (rows, length), generator=g)
    batch = Batch(
        {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "responses": ids[:, 1:].clone(),
            "response_mask": torch.ones(rows, length - 1, dtype=torch.long),
        }
    )
    worker.train_step(batch)  # the second step starts with the AdamW state and the gradients the first left
    tracker = MemTracker()
    tracker.track_external(worker.module, worker.engine.optimizer)
    with tracker:
        worker.train_step(batch)
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return int({str(getattr(k, "value", k)): v for k, v in peak.items()}["Total"])


@pytest.mark.parametrize("padding_free", [True, False])
def test_sft_update_prediction_is_near_a_real_cpu_sft_step(tiny_lm_path, padding_free):
    rows, length = 8, 96
    rc = load_sft_recipe(
        "tiny_sft",
        [
            *OUT,
            f"model.path={tiny_lm_path}",
            f"data.max_length={length}",
            f"data.train_batch_size={rows}",
            f"data.micro_batch_size_per_gpu={rows}",  # one micro-batch: the tracker follows one forward per module
            "data.use_dynamic_bsz=false",
            f"model.use_remove_padding={str(padding_free).lower()}",
            "trainer.device=cpu",
        ],
    )
    measured = _sft_step_peak(rc, rows, length)
    size = mp.model_size(json.loads((Path(tiny_lm_path) / "config.json").read_text()))
    plan = plan_sft(rc, 1 << 34, "test", size, accelerator=False)
    assert [p.name for p in plan.phases] == ["model update", "checkpoint save"]
    predicted = plan.phases[0].total
    print(f"predicted {predicted} B, measured {measured} B ({predicted / measured - 1:+.1%})")
    assert 0.7 * measured < predicted < 1.35 * measured, (predicted, measured)


def _peak(out: str) -> float:
    m = re.search(r"^peak: model update, ([0-9.]+) GiB of", out, re.M)
    assert m, out
    return float(m[1])


def test_plan_of_an_sft_recipe_names_sft_knobs_that_each_lower_the_peak(tmp_path, capsys):
    """An SFT recipe that does not fit: the phases are the model's, the knobs are keys of the SFT schema, and
    applying a knob's override gives the peak it promised (the knob's saving, to the printed precision)."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    base = ["plan", "qwen25_retool_sft", *OUT, f"model.path={tmp_path}", "engine.param_offload=false"]
    assert main([*base, "model.enable_gradient_checkpointing=false", "--device-memory", "48GiB"]) == 0
    out = capsys.readouterr().out
    assert "rollout" not in out and "log-probs" not in out and "actor" not in out, out
    assert ": will not fit" in out
    knobs = re.findall(r"^  (\S+=\S+)(?: \(twice the devices\))?\s+-([0-9.]+) GiB$", out, re.M)
    names = [k.split("=")[0] for k, _ in knobs]
    assert "model.enable_gradient_checkpointing" in names and "engine.param_offload" in names, out
    assert set(names) <= {
        "model.enable_gradient_checkpointing",
        "engine.param_offload",
        "data.micro_batch_size_per_gpu",
        "data.max_token_len_per_gpu",
        "trainer.n_gpus_per_node",
    }, names
    peak = _peak(out)
    for override, saved in knobs:
        assert main([*base, "model.enable_gradient_checkpointing=false", override, "--device-memory", "48GiB"]) == 0
        after = _peak(capsys.readouterr().out)
        assert abs((peak - after) - float(saved)) < 0.02, (override, peak, after, saved)


def test_sft_plan_follows_the_micro_batch_and_the_token_budget(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    size = mp.model_size(QWEN25_7B)

    def update(*overrides):
        rc = load_sft_recipe("qwen25_retool_sft", [*OUT, f"model.path={tmp_path}", *overrides])
        return next(p for p in plan_sft(rc, 64 << 30, "t", size, accelerator=True).phases if p.name == "model update")

    one, two = update(), update("data.micro_batch_size_per_gpu=2")
    logits = {p.name: p.bytes for p in one.parts}["logits + grads"]
    assert {p.name: p.bytes for p in two.parts}["logits + grads"] == 2 * logits
    # a token budget of 2 conversations' tokens holds 2 rows, as data.micro_batch_size_per_gpu=2 does (one worker:
    # token budgets over several are refused)
    one_worker = update("trainer.n_gpus_per_node=1", "data.micro_batch_size_per_gpu=2")
    dynamic = update("trainer.n_gpus_per_node=1", "data.use_dynamic_bsz=true", "data.max_token_len_per_gpu=32768")
    assert {p.name: p.bytes for p in dynamic.parts}["logits + grads"] == 2 * logits
    assert {p.name: p.bytes for p in dynamic.parts} == {p.name: p.bytes for p in one_worker.parts}
    # offloading keeps the sharded weights, gradients and AdamW state on the host
    offloaded = update("engine.param_offload=true")
    assert offloaded.total < one.total and not any(p.name == "model AdamW" and p.bytes for p in offloaded.parts)


def test_an_sft_run_that_will_not_fit_stops_before_training_unless_forced(tiny_lm_path, tmp_path, monkeypatch, capsys):
    """`verl-npu run` of an SFT recipe prints the plan's line, and stops (naming SFT knobs) before any worker starts
    when the device's memory is known to be too small; --force runs it anyway."""
    import verl_npu.sft.loop as loop

    trained = []
    monkeypatch.setattr(loop, "run_sft", lambda rc, **_: trained.append(rc) or 0)
    monkeypatch.chdir(tmp_path)  # the demo data is written under ./data
    args = ["run", "tiny_sft", f"af_output_dir={tmp_path / 'out'}", "--demo-data"]  # tiny://qwen2: tiny_lm_path
    assert main([*args, "--device-memory", "16MiB"]) == 1
    err = capsys.readouterr().err
    assert "will not fit" in err and "model update" in err and "--force" in err and "Traceback" not in err
    assert "data.micro_batch_size_per_gpu=4" in err and not trained
    assert main([*args, "--device-memory", "16MiB", "--force"]) == 0 and len(trained) == 1
    assert main(args) == 0 and len(trained) == 2
    assert "memory plan: " in capsys.readouterr().out


def test_a_stages_recipe_plans_each_stage_the_rl_stage_with_the_sft_models_shapes(capsys):
    """`verl-npu plan qwen25_retool`: the SFT stage, then the RL stage, whose model is the SFT stage's export (the
    placeholder of the RL recipe's own model path names no model): both planned with Qwen2.5-7B's numbers."""
    assert main(["plan", "qwen25_retool"]) == 0
    out = capsys.readouterr().out
    assert out.index("stage sft (sft)") < out.index("qwen25_retool_sft.yaml: memory plan") < out.index("stage rl (rl)")
    peaks = re.findall(r"^peak: ([a-z ]+), ", out, re.M)
    assert peaks[0] == "model update" and len(peaks) == 2, out
    assert main(["plan", "qwen25_retool", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in body["stages"]] == ["sft", "rl"] and body["stages"][0]["peak_phase"] == "model update"
    assert main(["plan", "qwen25_retool_dapo", "actor_rollout_ref.model.path=Qwen2.5-7B-Instruct", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert body["stages"][1]["phases"] == alone["phases"]  # the RL stage: Qwen2.5-7B, the SFT stage's model
    assert main(["plan", "qwen25_retool", "sft.data.max_length=32768", "--json"]) == 0
    longer = json.loads(capsys.readouterr().out)["stages"]
    assert longer[0]["peak_bytes"] > body["stages"][0]["peak_bytes"]
    assert longer[1]["peak_bytes"] == body["stages"][1]["peak_bytes"]  # a stage's override reaches its stage only


def test_json_is_alone_on_stdout_when_placeholders_are_filled(capsys):
    """`plan --json` of a recipe with EDIT_ME fields: the note about the stand-in values goes to stderr."""
    assert main(["plan", "qwen25_gsm8k", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["peak_phase"] and "EDIT_ME fields still unfilled" in captured.err
