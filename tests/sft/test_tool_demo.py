"""The tool demo (recipes/tiny_tool_demo.yaml, issue 38) end to end, cut short: the untrained tiny model validated
on the multi-turn tool task, then `verl-npu run tiny_tool_demo` (SFT on tool-call transcripts, then GRPO with the
tool from the SFT checkpoint) on small local data. The SFT stage must raise the share of greedy validation
conversations with well-formed tool calls (bench/tool_demo.py's parse rate) above the untrained model's; the RL
stage must train a step from the SFT checkpoint. The learning over seeds is bench/results/tool_demo.md's."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SFT_STEPS = 60


def _bench():
    spec = importlib.util.spec_from_file_location("tool_demo", REPO / "bench" / "tool_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_stages_run_and_sft_teaches_the_tool_call(tmp_path, tiny_lm_path):
    from verl_npu.cli import main
    from verl_npu.data import gsm8k_multiturn, sft_synthetic

    bench = _bench()
    sft_data, rl_data = tmp_path / "sft_data", tmp_path / "rl_data"
    sft_synthetic.prepare_synthetic(sft_data, 160, 4, seed=0)
    gsm8k_multiturn.prepare_synthetic(rl_data, 8, 8, seed=0)
    rl = {
        "data.train_files": rl_data / "train.parquet",
        "data.val_files": rl_data / "test.parquet",
        "data.train_batch_size": 4,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8,
        "actor_rollout_ref.rollout.n": 2,
        "trainer.logger": "[console]",
    }
    untrained = tmp_path / "untrained"
    assert (
        main(
            [
                "run",
                "tiny_tool_gsm8k",
                f"af_output_dir={untrained}",
                f"actor_rollout_ref.model.path={tiny_lm_path}",
                "data.max_response_length=160",
                "trainer.val_only=true",
                f"trainer.validation_data_dir={untrained / 'val'}",
                *[f"{k}={v}" for k, v in rl.items()],
            ]
        )
        == 0
    )
    before = bench.conversation_stats(bench.read_dump(untrained / "val", 0))

    demo = tmp_path / "demo"
    overrides = [
        f"af_output_dir={demo}",
        f"sft.model.path={tiny_lm_path}",
        f"sft.data.train_files={sft_data / 'train.parquet'}",
        f"sft.data.val_files={sft_data / 'test.parquet'}",
        f"sft.trainer.total_training_steps={SFT_STEPS}",
        "sft.trainer.logger=console",
        "sft.data.train_batch_size=8",
        "sft.data.micro_batch_size_per_gpu=8",
        "rl.trainer.total_training_steps=1",
        "rl.trainer.test_freq=-1",
        "rl.trainer.save_freq=1",
        f"rl.trainer.validation_data_dir={demo / 'val'}",
        f"rl.trainer.rollout_data_dir={demo / 'rollouts'}",
        *[f"rl.{k}={v}" for k, v in rl.items()],
    ]
    assert main(["run", "tiny_tool_demo", *overrides]) == 0
    state = json.loads((demo / "stages.json").read_text())
    assert state["sft"]["checkpoint"].endswith(f"global_step_{SFT_STEPS}") and state["rl"]["finished"]
    after_sft = bench.conversation_stats(bench.read_dump(demo / "val", 0))
    assert after_sft["parse_rate"] > before["parse_rate"], (before, after_sft)
    assert after_sft["parse_rate"] >= 0.5, after_sft
    rl_rows = [json.loads(line) for line in (demo / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["training/global_step"] for r in rl_rows if "critic/score/mean" in r] == [1]
    assert (demo / "rl" / "checkpoints" / "global_step_1").is_dir() and (demo / "rollouts" / "1.jsonl").is_file()


def test_conversation_stats_reads_the_dumped_calls():
    """The parse rate counts a conversation only when it calls the tool and every call is well formed."""
    bench = _bench()
    good = {"name": "calc_gsm8k_reward", "arguments": {"answer": "4"}, "known": True}
    bad = {"name": None, "arguments": None, "error": "Error: the tool call is not valid JSON"}
    rows = [
        {"score": 0.8, "turns": [{"role": "tool", "calls": [good]}]},
        {"score": 0.0, "turns": [{"role": "tool", "calls": [good, bad]}]},
        {"score": 1.0, "turns": [{"role": "assistant"}]},
        {"score": 0.0, "turns": [{"role": "tool", "calls": [{**good, "name": "other", "known": False}]}]},
    ]
    stats = bench.conversation_stats(rows)
    assert stats == {"parse_rate": 0.25, "reward": 0.45, "right": 0.5, "calls": 1.0}
