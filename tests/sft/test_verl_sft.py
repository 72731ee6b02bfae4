"""verl-npu's SFT against upstream verl 0.9.1's (issue 38): on the same conversations (multi-turn, tool calls),
the same token ids and assistant-token loss masks as verl's `MultiTurnSFTDataset`, and the same loss and gradient
of every parameter as verl's `sft_loss` (verl runs in its side venv: tests/helpers/verl_side_sft.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from run_helpers import run_on_verl_side, verl_side_python

from verl_npu.batch import Batch

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tests" / "helpers" / "verl_side_sft.py"
pytestmark = pytest.mark.verl_side
verl_side_python()


def test_masks_loss_and_gradient_equal_verls(tmp_path, tiny_lm_path):
    from verl_npu.config.sft import Node
    from verl_npu.config.sft_schema import defaults_tree
    from verl_npu.data.sft_dataset import SFTDataset, collate
    from verl_npu.data.sft_synthetic import prepare_synthetic
    from verl_npu.models.loading import load_policy_model, load_tokenizer_and_processor
    from verl_npu.sft.worker import SFTWorker

    paths = prepare_synthetic(tmp_path / "data", 5, 1, seed=7)["paths"]
    data_cfg = {**defaults_tree()["data"], "max_length": 1024}
    theirs = run_on_verl_side(
        TOOL,
        {
            "model": str(tiny_lm_path),
            "parquet": paths["train"],
            "config": {
                k: data_cfg[k] for k in ("max_length", "truncation", "messages_key", "tools_key", "enable_thinking_key")
            },
        },
        tmp_path,
    )
    tok, _ = load_tokenizer_and_processor(tiny_lm_path)
    ours = SFTDataset(paths["train"], tok, Node("backend_config.data", data_cfg))
    assert [list(r.input_ids) for r in ours.rows] == theirs["input_ids"]
    assert [list(r.loss_mask) for r in ours.rows] == theirs["loss_mask"]
    assert all(sum(m) > 0 for m in theirs["loss_mask"])

    for remove_padding in (True, False):
        model = load_policy_model(tiny_lm_path, dtype=torch.float32, attn_implementation="eager")
        batch: Batch = collate(ours.rows, tok.pad_token_id)
        cfg = Node("backend_config", {"model": {"use_remove_padding": remove_padding}})
        worker = SFTWorker.__new__(SFTWorker)  # the role's forward and loss, without an engine
        object.__setattr__(worker, "cfg", cfg)
        log_probs = worker._forward(model, batch)
        mask = batch["response_mask"].float()
        loss, _ = SFTWorker._loss(batch, log_probs, mask, {"global_tokens": float(mask.sum()), "dp_size": 1})
        loss.backward()
        assert float(loss.detach()) == pytest.approx(theirs["loss"], rel=1e-5)
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert set(grads) == set(theirs["grads"])
        for name, grad in grads.items():
            torch.testing.assert_close(grad, theirs["grads"][name], rtol=1e-4, atol=1e-6)


def test_verl_model_merger_reads_our_sft_checkpoint(tmp_path, tiny_lm_path):
    """An SFT checkpoint (global_step_N/, no actor/ level) merged by verl's own model merger gives the weights of
    our huggingface/ export (in bf16, as the merger writes)."""
    import os
    import subprocess

    import yaml
    from safetensors.torch import load_file

    from verl_npu.config.sft import load_sft_recipe
    from verl_npu.data.sft_synthetic import prepare_synthetic
    from verl_npu.sft.loop import run_sft

    paths = prepare_synthetic(tmp_path / "data", 2, 1, seed=1)["paths"]
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "af_output_dir": str(tmp_path / "out"),
                "backend_config": {
                    "data": {
                        "train_files": paths["train"],
                        "max_length": 512,
                        "train_batch_size": 2,
                        "use_dynamic_bsz": False,
                    },
                    "model": {"path": str(tiny_lm_path)},
                    "optim": {"lr": 1e-2},
                    "checkpoint": {"save_contents": ["model", "optimizer", "extra", "hf_model"]},
                    "trainer": {"total_training_steps": 1, "logger": ["console"]},
                },
            }
        )
    )
    assert run_sft(load_sft_recipe(recipe)) == 0
    step = tmp_path / "out" / "checkpoints" / "global_step_1"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [
            verl_side_python(),
            "-m",
            "verl.model_merger",
            "merge",
            "--backend",
            "fsdp",
            "--local_dir",
            str(step),
            "--target_dir",
            str(tmp_path / "merged"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    merged = load_file(tmp_path / "merged" / "model.safetensors")
    ours = load_file(step / "huggingface" / "model.safetensors")
    assert sorted(merged) == sorted(ours)
    for name, value in ours.items():
        assert torch.equal(merged[name].float(), value.to(torch.bfloat16).float()), name
