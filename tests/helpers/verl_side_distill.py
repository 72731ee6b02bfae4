"""Upstream verl 0.9.1's own on-policy distillation losses on given inputs (run in the verl side venv by
tests/algorithms/test_verl_distillation.py; verl-npu is not importable there).

    python tests/helpers/verl_side_distill.py INPUTS.pt OUTPUTS.pt

INPUTS.pt (torch.save of a list of cases), each a dict with: `loss` (the `DistillationLossConfig` fields),
`loss_agg_mode`, `global_batch_info` (dp_size, batch_num_tokens, global_batch_size, loss_scale_factor),
`prompt_length` P, `response_lengths` (per row), and the padded response tensors [B, R]: `response_mask`,
`old_log_prob`, `log_prob` (the student's log-prob of each sampled token), optionally `rollout_is_weights`;
for forward_kl_topk `student_logits` [B, R, V], `teacher_topk_log_probs` / `teacher_topk_ids` [B, R, K]; for
an estimator `teacher_log_prob` [B, R].

verl computes on packed sequences (prompt + response of each row back to back; the output at position j
describes token j + 1), so each response position t of row i is placed at packed index offset_i + P - 1 + t and
the other packed positions get junk that must not matter. forward_kl_topk runs verl's FSDP logits processor
(`verl.trainer.distillation.fsdp.losses.compute_forward_kl_topk`) and then `losses.distillation_loss`, as
verl's actor does; the estimators go to `distillation_loss` directly. OUTPUTS gets, per case, `loss`, the
gradient of the loss with respect to the student's input (the logits for top-k without policy gradient,
else the log-probs) back in the padded [B, R, ...] layout, and the metrics (floats).
"""

from __future__ import annotations

import sys

import torch


def _pack(padded: torch.Tensor, prompt_length: int, lengths: list[int], junk: torch.Generator) -> torch.Tensor:
    """[B, R, ...] response values -> the packed [sum(P + r_i), ...] layout verl reads (junk elsewhere)."""
    rows = []
    for i, r in enumerate(lengths):
        if padded.is_floating_point():
            row = torch.randn((prompt_length + r, *padded.shape[2:]), generator=junk, dtype=padded.dtype)
        else:
            row = torch.zeros((prompt_length + r, *padded.shape[2:]), dtype=padded.dtype)
        row[prompt_length - 1 : prompt_length - 1 + r] = padded[i, :r]
        rows.append(row)
    return torch.cat(rows)


def _unpack(packed: torch.Tensor, like: torch.Tensor, prompt_length: int, lengths: list[int]) -> torch.Tensor:
    out = torch.zeros_like(like)
    offset = 0
    for i, r in enumerate(lengths):
        out[i, :r] = packed[offset + prompt_length - 1 : offset + prompt_length - 1 + r]
        offset += prompt_length + r
    return out


def _nested(packed: torch.Tensor, prompt_length: int, lengths: list[int]) -> torch.Tensor:
    sizes = [prompt_length + r for r in lengths]
    return torch.nested.as_nested_tensor(list(torch.split(packed, sizes)), layout=torch.jagged)


def run(case: dict) -> dict:
    from verl.trainer.distillation import losses
    from verl.trainer.distillation.fsdp import losses as fsdp_losses
    from verl.workers.config import ActorConfig, DistillationConfig, DistillationLossConfig

    loss_cfg = DistillationLossConfig(**case["loss"])
    distill_cfg = DistillationConfig(enabled=False, distillation_loss=loss_cfg)
    info = case["global_batch_info"]
    actor_cfg = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=case["loss_agg_mode"],
        global_batch_info={},
        loss_scale_factor=info["loss_scale_factor"],
    )
    P, lengths = case["prompt_length"], case["response_lengths"]
    B, R = case["response_mask"].shape
    junk = torch.Generator().manual_seed(0)
    attention = torch.cat(
        [
            torch.ones(B, P, dtype=torch.long),
            (torch.arange(R).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long(),
        ],
        dim=1,
    )
    data = {
        "prompts": torch.zeros(B, P, dtype=torch.long),
        "responses": torch.zeros(B, R, dtype=torch.long),
        "attention_mask": attention,
        "response_mask": case["response_mask"],
        "old_log_probs": case["old_log_prob"],
        "dp_size": info["dp_size"],
        "batch_num_tokens": info["batch_num_tokens"],
        "global_batch_size": info["global_batch_size"],
    }
    if case.get("rollout_is_weights") is not None:
        data["rollout_is_weights"] = case["rollout_is_weights"]
    log_prob_packed = _pack(case["log_prob"], P, lengths, junk).requires_grad_(True)
    model_output = {"log_probs": log_prob_packed}
    wrt = log_prob_packed
    if "student_logits" in case:
        logits_packed = _pack(case["student_logits"], P, lengths, junk).requires_grad_(True)
        teacher_lp = _nested(_pack(case["teacher_topk_log_probs"], P, lengths, junk), P, lengths)
        teacher_ids = _nested(_pack(case["teacher_topk_ids"], P, lengths, junk), P, lengths)
        outputs = fsdp_losses.compute_forward_kl_topk(
            student_logits=logits_packed.unsqueeze(0),
            teacher_topk_log_probs=teacher_lp,
            teacher_topk_ids=teacher_ids,
            config=distill_cfg,
            data_format="thd",
        )
        model_output.update({k: v.squeeze(0) for k, v in outputs.items()})
        if not loss_cfg.use_policy_gradient:
            wrt = logits_packed
    else:
        data["teacher_logprobs"] = _pack(case["teacher_log_prob"], P, lengths, junk).unsqueeze(-1)
    loss, metrics = losses.distillation_loss(actor_cfg, distill_cfg, model_output, data)
    loss.backward()
    like = case["student_logits"] if wrt is not log_prob_packed else case["log_prob"]
    grad = _unpack(wrt.grad, like, P, lengths)

    def number(v):
        if hasattr(v, "aggregate"):
            return float(v.aggregate())
        return float(v)

    return {"loss": loss.detach(), "grad": grad, "metrics": {k: number(v) for k, v in metrics.items()}}


def main(inputs: str, outputs: str) -> None:
    torch.set_num_threads(1)
    cases = torch.load(inputs, weights_only=False)
    torch.save([run(c) for c in cases], outputs)


if __name__ == "__main__":
    main(*sys.argv[1:3])
