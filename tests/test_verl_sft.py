"""verl-npu's SFT against upstream verl 0.9.1's (issue 38): on the same conversations (multi-turn, tool calls),
the same token ids and assistant-token loss masks as verl's `MultiTurnSFTDataset`, and the same loss and gradient
of every parameter as verl's `sft_loss` (verl runs in its side venv: tests/verl_side_sft.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from run_helpers import run_on_verl_side, verl_side_python
from verl_npu.batch import Batch

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tests" / "verl_side_sft.py"
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
    theirs = run_on_verl_side(TOOL, {"model": str(tiny_lm_path), "parquet": paths["train"],
                                     "config": {k: data_cfg[k] for k in ("max_length", "truncation", "messages_key",
                                                                         "tools_key", "enable_thinking_key")}},
                              tmp_path)
    tok, _ = load_tokenizer_and_processor(tiny_lm_path)
    ours = SFTDataset(paths["train"], tok, Node("backend_config.data", data_cfg))
    assert [list(r.input_ids) for r in ours.rows] == theirs["input_ids"]
    assert [list(r.loss_mask) for r in ours.rows] == theirs["loss_mask"]
    assert all(sum(m) > 0 for m in theirs["loss_mask"])

    for remove_padding in (True, False):
        model = load_policy_model(tiny_lm_path, dtype=torch.float32, attn_implementation="eager")
        batch: Batch = collate(ours.rows, tok.pad_token_id)
        cfg = Node("backend_config", {"model": {"use_remove_padding": remove_padding}})
        worker = SFTWorker.__new__(SFTWorker)   # the role's forward and loss, without an engine
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
