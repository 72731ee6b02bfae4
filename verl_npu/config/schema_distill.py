"""The schema's keys of on-policy distillation (verl 0.9.1's `distillation.*`; `schema.SCHEMA` holds them with
the rest): a frozen teacher scores the student's own samples and the actor's loss adds a distillation term
(verl_npu/algorithms/distillation.py; docs/distillation.md).

verl-npu runs one teacher, `teacher_models.teacher_model`, colocated with the actor on the training workers
like the reference policy (FSDP2-sharded over every rank, frozen, not checkpointed): it scores the rollout's
token ids with one forward of its transformers model, which is what verl's teacher servers return with
`prompt_logprobs`. verl's teacher-server settings (`inference.*` of vLLM, the separate resource pool, replicas,
multi-teacher routing) are therefore accepted as no-ops; a second teacher is refused by name
(`schema_verl_091`)."""

from __future__ import annotations

from typing import Any

from verl_npu.config.key import BOOL, DICT, FLOAT, INT, INT_LIST, STR, Key
from verl_npu.distillation_losses import DISTILLATION_LOSS_MODES, DISTILLATION_POLICY_LOSSES  # names only

# A table: one call per key, kept one per line so that the keys read as rows (ruff format would put each
# argument on a line of its own).
# fmt: off

DI = "distillation"
DL = f"{DI}.distillation_loss"
TM = f"{DI}.teacher_models.teacher_model"
INF = f"{TM}.inference"
KEYS: list[Key] = []

#: why verl's teacher-server settings change nothing here
_SERVER = ("a setting of verl's teacher inference server; verl-npu's teacher is one forward of its transformers "
           "model on the training workers (FSDP2), which gives the same log-probs")


def _k(path: str, default: Any, type_: str, doc: str, **kw: Any) -> None:
    KEYS.append(Key(f"backend_config.{path}", default, type_, doc, **kw))


_k(f"{DI}.enabled", False, BOOL, "On-policy distillation: a frozen teacher (teacher_models.teacher_model.model_path) "
   "scores every response the student sampled, and the actor's loss adds the distillation term of "
   "distillation_loss.* to (or, without use_task_rewards, in place of) its policy loss. Teacher and student "
   "must share one vocabulary (checked before any worker starts).")
_k(f"{DL}.loss_mode", "k3", STR, "The per-token distillation loss: " + "; ".join(
   f"{name}: {doc}" for name, doc in DISTILLATION_LOSS_MODES.items()) + ". verl recommends forward_kl_topk or "
   "k3 as a supervised loss and k1 with use_policy_gradient=true.", choices=tuple(DISTILLATION_LOSS_MODES))
_k(f"{DL}.topk", 32, INT, "forward_kl_topk: how many of the teacher's most likely tokens per position it sends "
   "(at most the vocabulary size). Read only with loss_mode=forward_kl_topk.", min=1)
_k(f"{DL}.use_task_rewards", True, BOOL, "true: the actor's loss is its whole PPO loss on the task rewards plus "
   "distillation_loss_coef x the distillation term; false: the distillation term alone (the rewards are still "
   "computed and logged, and the advantages with them, but nothing of them reaches the loss).")
_k(f"{DL}.distillation_loss_coef", 1.0, FLOAT, "Weight of the distillation term next to the policy loss (read only "
   "with use_task_rewards=true; without task rewards the weight is 1).", min=0)
_k(f"{DL}.loss_max_clamp", None, FLOAT, "Clamp each token's distillation loss to [-loss_max_clamp, "
   "loss_max_clamp] before it is aggregated (distillation/loss_min and loss_max are logged before the clamp); "
   "null: no clamp.", gt=0)
_k(f"{DL}.log_prob_min_clamp", None, FLOAT, "forward_kl_topk: raise the student's and the teacher's top-k "
   "log-probs to at least this value before the KL (a token either side finds nearly impossible cannot blow up "
   "the loss); null: no clamp.")
_k(f"{DL}.use_policy_gradient", False, BOOL, "false: the clamped per-token loss is aggregated like the policy loss "
   "(actor.loss_agg_mode) and backpropagated directly (a supervised loss). true: it is a per-token reward: the "
   "PPO loss (policy_loss_mode) of the student's log-probs with advantages -loss, clip ratios clip_ratio_low / "
   "clip_ratio_high (and distillation/pg_clipfrac, ppo_kl, pg_clipfrac_lower logged).")
_k(f"{DL}.policy_loss_mode", "vanilla", STR, "The policy loss of use_policy_gradient=true: vanilla (dual-clip PPO, "
   "dual clip 3), the only one verl 0.9.1 allows here.", choices=DISTILLATION_POLICY_LOSSES)
_k(f"{DL}.clip_ratio", 0.2, FLOAT, "use_policy_gradient: PPO clip ratio of the distillation policy loss (used for "
   "clip_ratio_low / clip_ratio_high when they are null).", min=0)
_k(f"{DL}.clip_ratio_low", 0.2, FLOAT, "use_policy_gradient: lower clip ratio (ratio >= 1 - clip_ratio_low); null: "
   "clip_ratio.", min=0, nullable=True)
_k(f"{DL}.clip_ratio_high", 0.2, FLOAT, "use_policy_gradient: upper clip ratio (ratio <= 1 + clip_ratio_high); "
   "null: clip_ratio.", min=0, nullable=True)
_k(f"{TM}.model_path", None, STR, "The teacher: a transformers causal LM folder, hub id or tiny:// model with the "
   "student's vocabulary (actor_rollout_ref.model.path's tokenizer). Required with distillation.enabled. Loaded "
   "frozen in the actor's compute dtype; trust_remote_code and override_config follow actor_rollout_ref.model.")
_k(f"{INF}.max_model_len", None, INT, "The longest sequence the teacher holds: at least data.max_prompt_length + "
   "data.max_response_length + 1 (checked before any worker starts, as verl checks it); null: no limit.", min=1)


#: verl's distillation keys that change nothing here: (short path, default, type, meaning and why, limits);
#: `schema_verl_091` declares them as no-ops (listed when set, like every verl key without effect here)
NOOPS: list[tuple[str, Any, str, str, dict]] = []


def _noop(path: str, default: Any, type_: str, meaning: str, why: str, **kw: Any) -> None:
    NOOPS.append((path, default, type_, f"{meaning} No effect in verl-npu: {why}.", kw))


_noop(f"{DI}.teacher_key", "data_source", STR, "Multi-teacher routing: the data column whose value picks a row's "
      "teacher.", "verl-npu runs one teacher (teacher_models.teacher_model), to which verl too sends every row "
      "whatever its teacher_key value")
_noop(f"{DI}.n_gpus_per_node", 8, INT, "Devices per node of verl's separate teacher resource pool.",
      "the teacher runs on the training workers, sharded like the reference policy (no pool of its own)", min=0)
_noop(f"{DI}.nnodes", 0, INT, "Nodes of verl's separate teacher resource pool.",
      "the teacher runs on the training workers, sharded like the reference policy (no pool of its own)", min=0)
_noop(f"{TM}.key", None, STR, "The teacher's routing value (multi-teacher).", "one teacher: every row goes to it "
      "(verl names a single teacher 'default')")
_noop(f"{TM}.num_replicas", 0, INT, "Inference replicas of the teacher in verl's teacher pool.", _SERVER, min=0)
_noop(f"{INF}.name", None, STR, "The teacher's inference engine (verl: the rollout's, vllm or sglang).",
      "the teacher's log-probs come from a forward on the training workers, whichever engine is named (the same "
      "numbers as vLLM's prompt_logprobs)")
_noop(f"{INF}.dtype", None, STR, "The teacher's inference dtype (verl: the rollout's).",
      "the teacher computes in the training engine's dtype (bf16 on NPU/CUDA, fp32 on CPU), like the reference "
      "policy")
_noop(f"{INF}.temperature", None, FLOAT, "Sampling temperature of the teacher server.", "the teacher's log-probs "
      "are always those of temperature 1, as in verl (which ignores this with a warning)")
for _leaf in ("prompt_length", "response_length"):
    _noop(f"{INF}.{_leaf}", None, INT, f"verl's copy of the rollout's {_leaf} for the teacher server.",
          "the teacher reads the rollout's sequences as they are (data.max_prompt_length / max_response_length)")
for _leaf, _default, _type in (("gpu_memory_utilization", 0.5, FLOAT), ("enforce_eager", True, BOOL),
                               ("cudagraph_capture_sizes", None, INT_LIST), ("free_cache_engine", True, BOOL),
                               ("data_parallel_size", 1, INT), ("expert_parallel_size", 1, INT),
                               ("tensor_model_parallel_size", 2, INT), ("max_num_batched_tokens", 8192, INT),
                               ("max_num_seqs", 1024, INT), ("load_format", "auto", STR), ("engine_kwargs", {}, DICT),
                               ("limit_images", None, INT), ("enable_chunked_prefill", True, BOOL),
                               ("enable_prefix_caching", True, BOOL), ("disable_log_stats", True, BOOL),
                               ("skip_tokenizer_init", True, BOOL)):
    _noop(f"{INF}.{_leaf}", _default, _type, f"verl's teacher server: {_leaf.replace('_', ' ')}.", _SERVER)
