"""The instrument that checks the memory planner (verl_npu/config/memory_plan.py) on CPU, independent of it.

`measure_update(model_dir, ...)` runs ONE real actor update of the training engine
(`verl_npu.workers.engine.TrainingEngine`: fp32 weights, AdamW, `response_log_probs` forward, a
policy-gradient loss, backward, optimizer step) on the CPU and returns the peak of the bytes its
tensors hold at one moment, by kind (parameters, gradients, optimizer state, activations, temporaries).

The instrument is torch's own memory tracker (`torch.distributed._tools.mem_tracker.MemTracker`): a
TorchDispatchMode that sees every tensor storage an operator creates and, through weak references,
when it is freed, plus the module's and optimizer's tensors made before (`track_external`); it keeps
the peak of their sum per device. torch's CPU allocator has no `max_memory_allocated`, and
torch.profiler's `[memory]` events carry only the allocations no operator owns. The tracker counts
tensors, not the Python heap or libraries' own buffers, which is what the planner predicts for a
device. Nothing here reads the planner. Used by bench/memory_plan.py and tests/memory/test_memory_plan.py.
"""

from __future__ import annotations

import torch


def synthetic_batch(rows: int, prompt: int, response: int, vocab: int, *, seed: int = 0):
    """A [rows, prompt + response] batch of random tokens, full prompts and responses (no padding)."""
    from verl_npu.batch import Batch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, min(vocab, 400), (rows, prompt + response), generator=g)
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "responses": ids[:, prompt:].clone(),
            "response_mask": torch.ones(rows, response),
            "advantages": torch.randn(rows, response, generator=g),
        }
    )


def measure_update(
    model_dir, *, rows: int, prompt: int, response: int, remove_padding: bool = False, checkpointing: bool = False
) -> dict:
    """The peak of an actor update of `rows` rows in one micro-batch on the CPU, measured on the
    second update (the first one runs untracked: later updates start with the gradients and the AdamW
    state it left, as every update after a run's first does). Returns {"peak": bytes, "parts": the
    peak's bytes by kind, "params": count}. One micro-batch, because the tracker follows one forward
    per module."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from verl_npu import algorithms
    from verl_npu.device import detect_device
    from verl_npu.models.forward import response_log_probs
    from verl_npu.models.loading import load_policy_model
    from verl_npu.workers.engine import TrainingEngine

    torch.manual_seed(0)
    engine = TrainingEngine("actor", detect_device("cpu"), seed=0)
    module = load_policy_model(str(model_dir), dtype=torch.float32, gradient_checkpointing=checkpointing)
    engine.attach(module, {})
    from verl_npu.config.typed import section

    engine.add_optimizer(
        section("actor_rollout_ref.actor.optim", {"lr": 1e-5, "weight_decay": 0.01}), total_training_steps=2
    )
    batch = synthetic_batch(rows, prompt, response, int(module.config.get_text_config().vocab_size))

    def forward(mod, part):
        lp, _ = response_log_probs(
            mod, part["input_ids"], part["attention_mask"], response, remove_padding=remove_padding
        )
        return lp

    def loss_fn(part, lp, mask, agg):
        return algorithms.agg_loss(-lp * part["advantages"], mask, "token-mean", **agg), {}

    def update():
        engine.train(
            batch,
            forward,
            loss_fn,
            mini_rows=rows,
            epochs=1,
            shuffle=False,
            micro={"micro_batch_size": rows},
            grad_clip=1.0,
        )

    update()
    tracker = MemTracker()
    tracker.track_external(module, engine.optimizer)
    with tracker:
        update()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    kinds = {str(getattr(k, "value", k)): int(v) for k, v in peak.items()}
    return {"peak": kinds.pop("Total"), "parts": kinds, "params": sum(p.numel() for p in module.parameters())}
