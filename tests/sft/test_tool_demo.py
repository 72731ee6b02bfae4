"""The tool demo (recipes/tiny_tool_demo.yaml, issue 38): `verl-npu run tiny_tool_demo` end to end, cut short (SFT
on the lookup task's transcripts, then GRPO with the lookup tool from the SFT checkpoint), on small local data:
the SFT stage must make the sampled model call the tool, and the RL stage must train a step from its checkpoint;
bench/tool_demo.py's conversation counts; the transcripts' loss masks. The learning over seeds is
bench/results/tool_demo.md's."""

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
    from verl_npu.data import tool_lookup

    bench = _bench()
    sft_data, rl_data = tmp_path / "sft_data", tmp_path / "rl_data"
    tool_lookup.prepare_sft(sft_data, 160, 4, seed=0)
    tool_lookup.prepare_synthetic(rl_data, 8, 8, seed=0)
    demo = tmp_path / "demo"
    rl = {
        "data.train_files": rl_data / "train.parquet",
        "data.val_files": rl_data / "test.parquet",
        "data.train_batch_size": 4,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8,
        "actor_rollout_ref.rollout.n": 2,
        "trainer.logger": "[console]",
        "trainer.total_training_steps": 1,
        "trainer.test_freq": -1,
        "trainer.save_freq": 1,
        "trainer.validation_data_dir": demo / "val",
        "trainer.rollout_data_dir": demo / "rollouts",
    }
    overrides = [
        f"af_output_dir={demo}",
        f"sft.model.path={tiny_lm_path}",
        f"sft.data.train_files={sft_data / 'train.parquet'}",
        f"sft.data.val_files={sft_data / 'test.parquet'}",
        f"sft.trainer.total_training_steps={SFT_STEPS}",
        "sft.trainer.logger=console",
        "sft.data.train_batch_size=16",
        "sft.data.micro_batch_size_per_gpu=16",
        *[f"rl.{k}={v}" for k, v in rl.items()],
    ]
    assert main(["run", "tiny_tool_demo", *overrides]) == 0
    state = json.loads((demo / "stages.json").read_text())
    assert state["sft"]["checkpoint"].endswith(f"global_step_{SFT_STEPS}") and state["rl"]["finished"]
    after_sft = bench.conversation_stats(bench.read_dump(demo / "val", 0))  # sampled, 8 problems x 2
    assert after_sft["calls"] >= 0.25, after_sft  # the untrained model writes no call
    rl_rows = [json.loads(line) for line in (demo / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["training/global_step"] for r in rl_rows if "critic/score/mean" in r] == [1]
    assert (demo / "rl" / "checkpoints" / "global_step_1").is_dir() and (demo / "rollouts" / "1.jsonl").is_file()


def test_conversation_stats_counts_answered_calls_and_their_successes():
    """A call counts when the agent loop parsed it and the lookup tool answered; a success is a call and the right
    code (score 1); a right guess is reward, not call success."""
    bench = _bench()
    good = {"name": "lookup", "arguments": {}, "known": True}
    bad = {"name": None, "arguments": None, "error": "Error: the tool call is not valid JSON"}
    rows = [
        {"score": 1.0, "turns": [{"role": "tool", "calls": [good]}]},
        {"score": 0.0, "turns": [{"role": "tool", "calls": [good]}]},
        {"score": 1.0, "turns": [{"role": "assistant"}]},
        {"score": 0.0, "turns": [{"role": "tool", "calls": [bad]}]},
    ]
    assert bench.conversation_stats(rows) == {"calls": 0.5, "success": 0.25, "reward": 0.5}


def test_the_lookup_transcripts_train_the_call_and_the_copied_answer_only(tmp_path, tiny_lm_path):
    """The SFT loss mask of a calling transcript covers the fixed call and the `#### n` answer, not the question
    or the tool's reply (the code the answer must copy); a guessing transcript's covers its guess."""
    from verl_npu.config.sft import Node
    from verl_npu.config.sft_schema import defaults_tree
    from verl_npu.data import tool_lookup
    from verl_npu.data.sft_dataset import SFTDataset
    from verl_npu.models.loading import load_tokenizer_and_processor

    paths = tool_lookup.prepare_sft(tmp_path, 40, 2, seed=3)["paths"]
    tok, _ = load_tokenizer_and_processor(str(tiny_lm_path))
    data = SFTDataset(paths["train"], tok, Node("backend_config.data", {**defaults_tree()["data"], "max_length": 96}))
    rows = tool_lookup.sft_rows(40, 3, "train")
    kinds = set()
    for row, conv in zip(rows, data.rows):
        trained = tok.decode([t for t, m in zip(conv.input_ids, conv.loss_mask) if m])
        answer = row["messages"][-1]["content"]
        if len(row["messages"]) == 4:
            call = row["messages"][1]["content"]
            assert trained == f"{call}<|im_end|>\n{answer}<|im_end|>\n", trained  # the tool's reply is not trained
        else:
            assert trained == f"{answer}<|im_end|>\n", trained
        kinds.add(len(row["messages"]))
    assert kinds == {2, 4}
