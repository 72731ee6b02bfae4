"""On-policy distillation loss modes by name (`distillation.distillation_loss.loss_mode`): what the config may name.

Names and one-line meanings only (nothing heavy is imported), so the config schema takes its choices from here;
the tensor functions are in `verl_npu.algorithms.distillation` under the same names (a test checks the two agree).
"""

from __future__ import annotations

#: loss_mode -> what the teacher sends and what the per-token loss is (formulas: verl_npu/algorithms/distillation.py)
DISTILLATION_LOSS_MODES: dict[str, str] = {
    "forward_kl_topk": "the teacher's top-k tokens and log-probs per position (distillation_loss.topk); the forward "
    "KL restricted to them, sum_k p_teacher (log p_teacher - log p_student), at least 0",
    "kl": "the teacher's log-prob of the sampled token; d = log p_student - log p_teacher (same as k1)",
    "k1": "d = log p_student - log p_teacher of the sampled token (only with use_policy_gradient=true)",
    "abs": "|d|",
    "mse": "d^2 / 2 (same as k2)",
    "k2": "d^2 / 2",
    "low_var_kl": "exp(-d) + d - 1, clamped to [-10, 10] (same as k3)",
    "k3": "exp(-d) + d - 1, clamped to [-10, 10]",
}
#: the modes that read the teacher's top-k (the others read the log-prob of the sampled token)
TOPK_LOSS_MODES = ("forward_kl_topk",)
#: modes whose gradient, backpropagated directly, does not depend on the teacher (verl refuses k1 so)
POLICY_GRADIENT_ONLY = ("k1", "kl")
#: policy losses of the policy-gradient form (distillation_loss.policy_loss_mode; verl 0.9.1: vanilla only)
DISTILLATION_POLICY_LOSSES = ("vanilla",)
