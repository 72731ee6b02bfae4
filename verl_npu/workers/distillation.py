"""On-policy distillation on the workers (`distillation.enabled`): the teacher role and the actor's loss term.

The teacher (`TeacherWorker`, role "teacher") is a frozen causal LM on every rank, colocated with the actor like
the reference policy (its FSDP2 settings are the reference policy's, `actor_rollout_ref.ref.fsdp_config`; no
optimizer, no checkpoint folder: it is reloaded from its path on resume). After the rollout it scores the
student's own samples with one forward at temperature 1 (as verl's teacher servers compute prompt log-probs):
for `forward_kl_topk` its `topk` most likely tokens and their log-probs at every response position
(`teacher_topk_log_probs`, `teacher_topk_ids` [B, R, K]); for the single-sample estimators the log-prob of the
sampled token (`teacher_log_prob` [B, R]). The teacher reads the student's token ids as they are, so the two
must share one vocabulary: checked when the teacher loads (and refused naming the key). A teacher whose output
layer is wider than the student's (Qwen2.5-7B's 152064 rows against 1.5B's 151936: padding rows past the
tokenizer's tokens) ranks only the student's rows: its top-k is taken over the first `student width` logits, so
it never names a token the student has no logit for.

The actor adds the distillation term to its loss (`add_distillation_term`, called from the actor's PPO loss):
the per-token loss of `distillation_loss.loss_mode` from the student's log-probs or (top-k) temperature-scaled
logits of the same forward, then `verl_npu.algorithms.distillation` (clamp, supervised or policy-gradient form,
the combination with the task-reward loss, the `distillation/*` metrics).
"""

from __future__ import annotations

import torch

from verl_npu.algorithms import distillation as D
from verl_npu.batch import Batch, reads
from verl_npu.errors import UserError
from verl_npu.models.forward import response_log_probs
from verl_npu.models.loading import load_config, load_policy_model, load_tokenizer_and_processor
from verl_npu.registry import ROLES
from verl_npu.workers.engine import TrainingEngine, micro_batching

TEACHER_KEY = "distillation.teacher_models.teacher_model.model_path"
#: the columns the teacher adds to the batch (the actor's update reads those present)
TEACHER_COLUMNS = ("teacher_log_prob", "teacher_topk_log_probs", "teacher_topk_ids")
#: metrics already shares of the mini-batch (added over micro-batches)
SUMMED_METRICS = D.SUMMED_METRICS
#: the forward's inputs (the same as the actor's)
FORWARD_READS = ("input_ids", "attention_mask", "responses", "multi_modal_inputs")


def enabled(cfg) -> bool:
    """Whether the run distils (`cfg`: the typed backend config)."""
    return bool(cfg.distillation.enabled)


def student_logits_needed(cfg) -> bool:
    """Whether the actor's training forward must return its logits: the top-k loss reads the student's whole
    distribution at every response position."""
    return enabled(cfg) and D.uses_topk(cfg.distillation.distillation_loss.loss_mode)


def vocabulary_problem(teacher_tokenizer, student_tokenizer, teacher_path: str, student_path: str) -> str | None:
    """Why the teacher cannot score the student's token ids (another token -> id table), or None."""
    teacher_vocab, student_vocab = teacher_tokenizer.get_vocab(), student_tokenizer.get_vocab()
    if teacher_vocab == student_vocab:
        return None
    differ = sorted(t for t in set(teacher_vocab) | set(student_vocab) if teacher_vocab.get(t) != student_vocab.get(t))
    shown = ", ".join(repr(t) for t in differ[:3])
    return (
        f"{TEACHER_KEY}={teacher_path!r} has another vocabulary than the student ({student_path!r}): "
        f"{len(differ)} tokens differ in id ({shown}, ...). The teacher scores the student's token ids as they "
        "are, so both tokenizers must give every token the same id; pick a teacher of the student's model "
        "family (the same tokenizer)"
    )


def output_width(config) -> int | None:
    """The rows of a model's output layer from its config (`vocab_size`, a vision-language model's in its
    `text_config`), or None when the config does not say."""
    for node in (config, getattr(config, "text_config", None)):
        width = getattr(node, "vocab_size", None)
        if isinstance(width, int) and width > 0:
            return width
    return None


def check_teacher_tokenizer(cfg, student_tokenizer) -> None:
    """Before any worker starts: a UserError when the teacher's tokenizer differs from the student's, or when
    forward_kl_topk's topk exceeds the teacher's vocabulary (nothing happens without distillation)."""
    if not enabled(cfg):
        return
    model_cfg = cfg.actor_rollout_ref.model
    path = cfg.distillation.teacher_models.teacher_model.model_path
    teacher_tokenizer, _ = load_tokenizer_and_processor(path, trust_remote_code=model_cfg.trust_remote_code)
    problem = vocabulary_problem(teacher_tokenizer, student_tokenizer, path, model_cfg.path)
    if problem:
        raise UserError(problem)
    loss_cfg = cfg.distillation.distillation_loss
    if D.uses_topk(loss_cfg.loss_mode) and loss_cfg.topk > len(teacher_tokenizer):
        raise UserError(
            f"distillation.distillation_loss.topk={loss_cfg.topk} is more than the teacher's "
            f"{len(teacher_tokenizer)} tokens; set it to at most {len(teacher_tokenizer)}"
        )


@ROLES.register(
    "teacher",
    needed_when=("distillation.enabled",),
    checkpointed=False,
    model_key="distillation.teacher_models.teacher_model.model_path",
    methods=("compute_teacher_log_probs",),
    doc="frozen teacher that scores the student's samples (distillation.enabled)",
)
class TeacherWorker:
    """The teacher role: a frozen engine and the forward that scores the student's samples. It reads the
    `distillation` section, the actor's model settings (trust_remote_code, override_config, external_lib),
    the reference policy's FSDP and log-prob micro-batch settings, and the actor's padding-free switch."""

    def __init__(self, cfg, total_training_steps: int, device, rank: int = 0, world_size: int = 1):
        self.cfg = cfg
        self.device = device
        self.engine = TrainingEngine("teacher", device, rank=rank, world_size=world_size)
        self.ranked_width: int | None = None  # set by init_model when the teacher's output layer is the wider

    def init_model(self) -> dict:
        cfg = self.cfg
        model_cfg = cfg.actor_rollout_ref.model
        path = cfg.distillation.teacher_models.teacher_model.model_path
        student_tokenizer, _ = load_tokenizer_and_processor(
            model_cfg.path, trust_remote_code=model_cfg.trust_remote_code
        )
        check_teacher_tokenizer(cfg, student_tokenizer)  # again here: a worker may see other files than the driver
        module = load_policy_model(
            path,
            dtype=self.engine.compute_dtype,
            attn_implementation=self.device.attn_implementation(),
            override_config=dict(model_cfg.override_config),
            trust_remote_code=model_cfg.trust_remote_code,
            external_lib=model_cfg.external_lib,
        )
        module.requires_grad_(False)
        teacher_width = module.get_output_embeddings().weight.shape[0]
        student_width = output_width(load_config(model_cfg.path, trust_remote_code=model_cfg.trust_remote_code))
        # the top-k ranks the rows both models have (a wider teacher's extra rows are padding past the tokenizer)
        self.ranked_width = student_width if student_width and teacher_width > student_width else None
        module = self.engine.attach(module.eval(), cfg.actor_rollout_ref.ref.fsdp_config)
        return {
            "num_params": sum(p.numel() for p in module.parameters()),
            "loss_mode": cfg.distillation.distillation_loss.loss_mode,
        }

    @reads(*FORWARD_READS)
    def compute_teacher_log_probs(self, batch: Batch) -> Batch:
        """The teacher's view of the responses of `batch` (module docstring): top-k log-probs and ids, or the
        log-prob of each sampled token, at temperature 1."""
        loss_cfg = self.cfg.distillation.distillation_loss
        topk = loss_cfg.topk if D.uses_topk(loss_cfg.loss_mode) else None
        ref = self.cfg.actor_rollout_ref.ref
        micro = micro_batching(
            ref.log_prob_use_dynamic_bsz, ref.log_prob_max_token_len_per_gpu, ref.log_prob_micro_batch_size_per_gpu or 1
        )
        response_length = batch["responses"].shape[1]
        remove_padding = self.cfg.actor_rollout_ref.model.use_remove_padding

        def forward(module, part):
            out = response_log_probs(
                module,
                part["input_ids"],
                part["attention_mask"],
                response_length,
                multi_modal_inputs=part.get("multi_modal_inputs"),
                temperature=1.0,
                remove_padding=remove_padding,
                return_logits=topk is not None,
            )
            if topk is None:
                return out[0].float()
            logits = out[2] if self.ranked_width is None else out[2][..., : self.ranked_width]
            return D.response_topk(logits, topk)  # only [.., K] per micro-batch is kept, never [.., V]

        if topk is None:
            return Batch({"teacher_log_prob": self.engine.infer(batch, forward, micro)})
        top_log_probs, top_ids = self.engine.infer(batch, forward, micro)
        return Batch({"teacher_topk_log_probs": top_log_probs, "teacher_topk_ids": top_ids})


def add_distillation_term(
    cfg,
    part: Batch,
    policy_loss: torch.Tensor,
    stats: dict,
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    student_logits: torch.Tensor | None,
    mask: torch.Tensor,
    agg: dict,
) -> tuple[torch.Tensor, dict]:
    """The actor's loss with the distillation term of one micro-batch, and `stats` with the `distillation/*`
    metrics (verl's `distillation_ppo_loss`): the per-token loss of the loss mode (top-k from `student_logits`,
    the temperature-scaled logits of the training forward; an estimator from `log_prob`), then
    `distillation_term` (clamp; supervised, or the policy-gradient form against `old_log_prob`) and
    `combine_with_policy_loss` (with or without the task rewards' `policy_loss`)."""
    loss_cfg = cfg.distillation.distillation_loss
    mode = loss_cfg.loss_mode
    if D.uses_topk(mode):
        out = D.forward_kl_topk_per_token(
            student_logits,
            part["teacher_topk_log_probs"].to(student_logits.device),
            part["teacher_topk_ids"].to(student_logits.device),
            loss_cfg.log_prob_min_clamp,
        )
        per_token, metrics = D.topk_losses(out), D.topk_metrics(out, mask, loss_cfg.topk)
    else:
        per_token, metrics = D.estimator_per_token(log_prob, part["teacher_log_prob"].to(log_prob.dtype), mode, mask)
    distill, term_metrics = D.distillation_term(
        per_token,
        mask,
        loss_cfg,
        cfg.actor_rollout_ref.actor.loss_agg_mode,
        log_prob=log_prob,
        old_log_prob=old_log_prob,
        rollout_is_weights=part.get("rollout_is_weights"),
        **agg,
    )
    stats = {**stats, **metrics, **term_metrics, "distillation/loss": distill.detach()}
    return D.combine_with_policy_loss(policy_loss, distill, loss_cfg), stats
