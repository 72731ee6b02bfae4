"""On-policy distillation's rules (`distillation.*`, config/schema_distill.py), registered in `rules.RULES`.

`paths` (and so `loader`) imports this module, which registers its rules; `paths` also checks the teacher's
model path like the actor's. What needs the teacher's tokenizer (its vocabulary against the student's, topk
against its size) is checked when the run starts, before any worker (verl_npu/trainer/distill.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from verl_npu.config.rules import _LENS, Ctx, _rule
from verl_npu.config.tree import BC
from verl_npu.distillation_losses import POLICY_GRADIENT_ONLY, TOPK_LOSS_MODES
from verl_npu.errors import Problem

DI = BC + "distillation."
DL = DI + "distillation_loss."
TEACHER = DI + "teacher_models.teacher_model."
TEACHER_PATH = TEACHER + "model_path"


@_rule(
    "distillation_teacher",
    (DI + "enabled", TEACHER_PATH),
    "distillation.enabled=true needs distillation.teacher_models.teacher_model.model_path",
)
def _teacher(c: Ctx) -> Iterator[Problem]:
    if c(DI + "enabled") and not c(TEACHER_PATH):
        yield Problem(
            TEACHER_PATH,
            "is required with distillation.enabled=true",
            "set it to the teacher's model folder (a causal LM with the student's vocabulary), or set "
            "distillation.enabled=false",
        )


@_rule(
    "distillation_loss_mode",
    (DI + "enabled", DL + "loss_mode", DL + "use_policy_gradient"),
    "k1 / kl need distillation_loss.use_policy_gradient=true: backpropagated directly, their gradient does not "
    "depend on the teacher (verl refuses k1 so); forward_kl_topk is meant as a supervised loss (a warning)",
)
def _loss_mode(c: Ctx) -> Iterator[Problem]:
    if not c(DI + "enabled"):
        return
    mode, pg = c(DL + "loss_mode"), c(DL + "use_policy_gradient")
    if mode in POLICY_GRADIENT_ONLY and not pg:
        yield Problem(
            DL + "loss_mode",
            f"{mode!r} as a supervised loss (use_policy_gradient=false) has a gradient "
            "that does not depend on the teacher's log-probs (log p_student - log p_teacher differentiates "
            "to the student's term alone)",
            "set distillation.distillation_loss.use_policy_gradient=true, or use k3 (or forward_kl_topk)",
        )
    if mode in TOPK_LOSS_MODES and pg:
        c.warnings.append(
            "distillation.distillation_loss: forward_kl_topk with use_policy_gradient=true uses the "
            "top-k KL only as a per-token reward of the sampled token; the top-k signal for the other "
            "tokens is lost (verl warns the same). use_policy_gradient=false is the usual pairing"
        )


@_rule(
    "distillation_teacher_length",
    (DI + "enabled", TEACHER + "inference.max_model_len") + _LENS,
    "the teacher's inference.max_model_len (when set) holds a whole rollout sequence plus one token "
    "(data.max_prompt_length + data.max_response_length + 1), as verl checks",
)
def _teacher_length(c: Ctx) -> Iterator[Problem]:
    limit = c(TEACHER + "inference.max_model_len")
    if c(DI + "enabled") and limit is not None and c.seq_len + 1 > int(limit):
        yield Problem(
            TEACHER + "inference.max_model_len",
            f"{limit} cannot hold a rollout sequence of {c.seq_len} tokens (max_prompt_length + "
            "max_response_length) plus one",
            f"set it to at least {c.seq_len + 1}, or to null",
        )
