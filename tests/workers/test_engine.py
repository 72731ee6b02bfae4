"""The training engine on a toy model: micro-batches add up to one step over the mini-batch, and
`infer` gives the rows of one forward over the whole batch, in order."""

from __future__ import annotations

import pytest
import torch

from verl_npu import algorithms
from verl_npu.batch import Batch
from verl_npu.config.typed import section
from verl_npu.device import detect_device
from verl_npu.workers.engine import TrainingEngine, micro_batching

ROWS, PROMPT, RESPONSE = 6, 3, 4


def _engine() -> TrainingEngine:
    engine = TrainingEngine("toy", detect_device("cpu"), seed=0)
    torch.manual_seed(0)
    engine.attach(torch.nn.Linear(2, 1), {})
    engine.add_optimizer(
        section("actor_rollout_ref.actor.optim", {"lr": 0.1, "weight_decay": 0.0}), total_training_steps=1
    )
    return engine


def _batch() -> Batch:
    generator = torch.Generator().manual_seed(1)
    attention = torch.ones(ROWS, PROMPT + RESPONSE, dtype=torch.long)
    attention[:3, 0] = 0  # left padding
    response_mask = torch.ones(ROWS, RESPONSE)
    response_mask[1, 2:] = 0  # a shorter response
    return Batch(
        {
            "input_ids": torch.zeros(ROWS, PROMPT + RESPONSE, dtype=torch.long),
            "attention_mask": attention,
            "responses": torch.zeros(ROWS, RESPONSE, dtype=torch.long),
            "response_mask": response_mask,
            "features": torch.randn(ROWS, RESPONSE, 2, generator=generator),
            "targets": torch.randn(ROWS, RESPONSE, generator=generator),
        }
    )


def _forward(module, part):
    return module(part["features"]).squeeze(-1)


def _loss(part, out, mask, agg):
    loss = algorithms.agg_loss((out - part["targets"]) ** 2, mask, "token-mean", **agg)
    return loss, {"toy/loss": loss, "toy/mean_output": algorithms.masked_mean(out.detach(), mask)}


@pytest.mark.parametrize("micro", [{"micro_batch_size": 1}, {"max_token_len": 15}])
def test_micro_batches_add_up_to_one_step_over_the_mini_batch(micro):
    whole, split = _engine(), _engine()
    settings = dict(mini_rows=ROWS, epochs=1, shuffle=False, grad_clip=1e9, summed=("toy/loss",))
    expected = whole.train(_batch(), _forward, _loss, micro=micro_batching(False, None, None), **settings)
    got = split.train(_batch(), _forward, _loss, micro=micro, **settings)
    for name, param in whole.module.named_parameters():
        torch.testing.assert_close(dict(split.module.named_parameters())[name], param)
    assert set(got) == {
        "toy/loss",
        "toy/mean_output",
        "toy/grad_norm",
        "toy/lr",
        "toy/skipped_updates",
        "toy/skipped_updates_in_a_row",
    }
    for key in ("toy/loss", "toy/mean_output", "toy/grad_norm"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5), key


def test_two_mini_batches_are_two_optimizer_steps_with_averaged_metrics():
    engine = _engine()
    metrics = engine.train(
        _batch(),
        _forward,
        _loss,
        mini_rows=ROWS // 2,
        epochs=1,
        shuffle=True,
        micro={"micro_batch_size": 2},
        grad_clip=1e9,
    )
    assert int(next(iter(engine.optimizer.state.values()))["step"]) == 2
    assert metrics["toy/skipped_updates"] == 0.0 and engine.lr_scheduler.last_epoch == 1


def test_infer_gives_the_rows_of_one_forward_in_order_and_keeps_the_mode():
    engine = _engine()
    batch = _batch()
    engine.module.train()
    both = engine.infer(batch, lambda module, part: (_forward(module, part), None), {"max_token_len": 13})
    assert both[1] is None and engine.module.training
    with torch.no_grad():
        torch.testing.assert_close(both[0], _forward(engine.module, batch))
