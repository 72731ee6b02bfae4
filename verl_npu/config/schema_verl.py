"""verl keys that verl-npu does not implement, each with what happens to it here.

`schema.SCHEMA` holds the keys verl-npu reads. Everything else in upstream verl's `ppo_trainer`
config (every leaf key of verl 0.9.1's generated schema, tests/fixtures/verl_ppo_trainer_keys.txt, is
checked by tests/config/test_verl_key_table.py; the keys verl 0.9.1 added live in `schema_verl_091`) is
one of:
- `VERL_ONLY[path]`, a `Key` that is either a no-op (`noop`: any valid value is accepted and
  changes nothing here, the text says why) or refused unless at its no-op value (`off_only`:
  the default is accepted, anything else is an error naming the missing feature and `instead`);
- `ALIASES[path]`: a verl spelling of a key verl-npu reads under another name (verl renamed it,
  or keeps an engine copy of it); the value goes to that key;
- under `REFUSED_SUBTREES[prefix]`: a whole verl feature (critic, reward model, megatron, ...);
  a value other than null / false / {} / [] is an error naming the feature and what to do instead;
- `_target_` anywhere: verl's Hydra class selector, a no-op (verl-npu builds its own objects).
A user key that is none of these (and not in SCHEMA) is "unknown": not a verl key at all.

Every key verl-npu calls a verl key is one of verl 0.9.1's, except those marked: schema keys whose
text starts with "verl-npu:" (verl-npu's own extensions), `OLDER_VERL` (spellings of verl before
0.9.1 that verl-npu still reads or names in its refusal) and `READ_WITH_PLUS` (keys verl 0.9.1 reads
although its schema does not declare them: set with `+`).
"""

from __future__ import annotations

from typing import Any

from verl_npu.config.schema import BOOL, DICT, FLOAT, INT, STR, STR_LIST, Key

# A table: one call per key, kept one per line so that the keys read as rows (ruff format would put each
# argument on a line of its own).
# fmt: off

#: top-level verl sections besides schema.VERL_SECTIONS (all of their keys are in this module).
EXTRA_VERL_SECTIONS = ("reward_manager", "transfer_queue", "ray_kwargs", "reward", "distillation", "skip",
                       "sandbox_fusion")

VERL_ONLY: dict[str, Key] = {}
BC = "backend_config."


def _full(path: str) -> str:
    return BC + path


def _noop(path: str, default: Any, type_: str, why: str, **kw: Any) -> None:
    VERL_ONLY[_full(path)] = Key(_full(path), default, type_, why, noop=why, **kw)


def _off(path: str, default: Any, type_: str, what: str, instead: str, **kw: Any) -> None:
    VERL_ONLY[_full(path)] = Key(_full(path), default, type_, f"verl: {what}.", off_only=what, instead=instead,
                                 nullable=True, **kw)


A, AC, R, RO, M = ("actor_rollout_ref", "actor_rollout_ref.actor", "actor_rollout_ref.ref",
                   "actor_rollout_ref.rollout", "actor_rollout_ref.model")
LEAVE = "leave it at its default"

# ---------------------------------------------------------------- actor_rollout_ref (common)
_noop(f"{A}.nccl_timeout", 600, INT, "verl's timeout in seconds for its NCCL weight-sync groups; verl-npu "
      "syncs weights inside its own process group (torch.distributed's default timeout).", min=1)

# ---------------------------------------------------------------- actor / ref: shared engine keys
_ENTROPY_CKPT = {
    "actor": "a memory saving only: verl recomputes the entropy's activations in backward instead of keeping "
             "them; verl-npu keeps them (same values; the entropy is differentiated only with entropy_coeff > 0, "
             "and actor.entropy_from_logits_with_chunking bounds its memory).",
    "ref": "the reference model computes no entropy (only log-probs).",
}
for role in ("actor", "ref"):
    base = f"{A}.{role}"
    fc = f"{base}.fsdp_config"
    _noop(f"{base}.rollout_n", None, INT, "verl's internal copy of rollout.n; verl-npu reads rollout.n.")
    _noop(f"{base}.entropy_checkpointing", False, BOOL, _ENTROPY_CKPT[role])
    _off(f"{base}.router_replay.mode", "disabled", STR, "MoE router replay", LEAVE + " ('disabled')")
    _off(f"{base}.router_replay.record_file", None, STR, "MoE router replay", "remove it")
    _off(f"{base}.router_replay.replay_file", None, STR, "MoE router replay", "remove it")
    _off(f"{fc}.offload_policy", False, BOOL, "FSDP2's CPU offload policy as a separate switch",
         f"use {role}.fsdp_config.param_offload=true (FSDP2 CPU offload)")
    if role == "ref":   # the actor's is a schema key (schema.py); the reference model is loaded in the compute dtype
        _off(f"{fc}.model_dtype", "fp32", STR, "the reference model's weights in a dtype of their own",
             "leave it at its default (verl-npu loads the reference model in the device's compute dtype)")
    _off(f"{fc}.dtype", "bfloat16", STR, "choosing the compute dtype", "leave it at bfloat16 (verl-npu computes "
         "in bf16 on NPU/CUDA, fp32 on CPU)")
    _noop(f"{fc}.use_orig_params", False, BOOL, "an FSDP1 flag; FSDP2 always keeps the original parameters.")
    _off(f"{fc}.seed", 42, INT, "a separate seed for the training engine", LEAVE + " (42)")
    _off(f"{fc}.full_determinism", False, BOOL, "fully deterministic kernels", LEAVE + " (false)")
    _noop(f"{fc}.entropy_checkpointing", False, BOOL, _ENTROPY_CKPT[role])
    _noop(f"{fc}.forward_only", role == "ref", BOOL, "verl's engine flag for roles that never train; verl-npu "
          "knows the reference model does not train.")
    _noop(f"{fc}.strategy", "fsdp", STR, "verl's engine copy of actor.strategy; verl-npu reads actor.strategy.",
          choices=("fsdp", "fsdp2"), unsupported=("megatron",), instead="use actor.strategy=fsdp2")
for leaf in ("entropy_from_logits_with_chunking", "fsdp_config.entropy_from_logits_with_chunking"):
    _noop(f"{R}.{leaf}", False, BOOL, "the reference model computes no entropy (only log-probs).")
_off(f"{AC}.fsdp_config.grad_offload", False, BOOL, "gradient offload (removed from verl)",
     "use actor.fsdp_config.param_offload=true")
_off(f"{R}.fsdp_config.wrap_policy.min_num_params", 0, INT, "a wrap policy for the reference model of its own",
     "leave it at 0 (the reference model is wrapped like the actor, by decoder layers)")
_noop(f"{R}.fsdp_config.optimizer_offload", False, BOOL, "the reference model has no optimizer.")
_off(f"{R}.fsdp_config.reshard_after_forward", True, BOOL, "keeping the reference model gathered after forward",
     LEAVE + " (true)")
_off(f"{R}.fsdp_config.fsdp_size", -1, INT, "hybrid sharding of the reference model",
     "leave it at -1 (shard over all workers)")
_noop(f"{R}.strategy", "fsdp", STR, "the reference model uses the actor's backend (actor.strategy).",
      choices=("fsdp", "fsdp2"), unsupported=("megatron",), instead="use actor.strategy=fsdp2")
for leaf in ("use_torch_compile", "fsdp_config.use_torch_compile"):
    _noop(f"{R}.{leaf}", False, BOOL, "verl compiles only the entropy computation with it (dp_actor), and the "
          "reference model computes no entropy, in verl as here.")

# ---------------------------------------------------------------- actor
_off(f"{AC}.optim.optimizer", "AdamW", STR, "optimizers other than AdamW", "use AdamW (optim.lr, betas, weight_decay)")
_off(f"{AC}.optim.optimizer_impl", "torch.optim", STR, "optimizer implementations other than torch.optim",
     LEAVE + " (torch.optim)")
_off(f"{AC}.optim.override_optimizer_config", None, DICT, "extra optimizer constructor arguments",
     "use optim.lr / betas / weight_decay")
_off(f"{AC}.loss_scale_factor", None, FLOAT, "a fixed loss scale factor", "remove it (loss_agg_mode decides "
     "the normalisation)")
_off(f"{AC}.calculate_entropy", False, BOOL, "computing the entropy when entropy_coeff is 0", LEAVE + " (false)")
_off(f"{AC}.use_prefix_grouper", False, BOOL, "prefix-grouped forward passes", LEAVE + " (false)")
_off(f"{AC}.data_loader_seed", 42, INT, "a separate seed for the PPO mini-batch shuffle", LEAVE + " (42)")
_off(f"{AC}.checkpoint.async_save", False, BOOL, "asynchronous checkpoint saving",
     "leave it false (checkpoints are written aside and renamed into place)")
_off(f"{AC}.sum_pi_squared_checkpointing", False, BOOL, "the sum-of-squared-probabilities metric",
     LEAVE + " (false)")

# ---------------------------------------------------------------- rollout
_off(f"{RO}.cudagraph_capture_sizes", None, STR_LIST, "choosing CUDA-graph capture sizes here",
     "pass it to vLLM as engine_kwargs.vllm.cudagraph_capture_sizes")
_off(f"{RO}.data_parallel_size", 1, INT, "data parallelism inside one rollout engine",
     "leave it at 1: the number of engines is the device count / tensor_model_parallel_size")
_off(f"{RO}.expert_parallel_size", 1, INT, "expert parallelism in the rollout engine", LEAVE + " (1)")
_off(f"{RO}.pipeline_model_parallel_size", 1, INT, "pipeline parallelism in the rollout engine", LEAVE + " (1)")
_off(f"{RO}.enable_prefix_caching", True, BOOL, "switching prefix caching here",
     "pass it to vLLM as engine_kwargs.vllm.enable_prefix_caching")
_off(f"{RO}.logprobs_mode", "processed_logprobs", STR, "other rollout log-prob modes", LEAVE)
_off(f"{RO}.scheduling_policy", "fcfs", STR, "other vLLM scheduling policies", LEAVE + " (fcfs)")
_off(f"{RO}.over_sample_rate", 0, FLOAT, "over-sampling and aborting the slowest rollouts", LEAVE + " (0)")
_off(f"{RO}.engine_kwargs.trtllm", {}, DICT, "the TRT-LLM rollout", "use rollout.name=vllm (or hf)")
_noop(f"{RO}.agent.num_workers", 8, INT, "verl's agent-loop worker count; verl-npu's rollout runs inside its "
      "training workers, one engine per TP group.", min=1)
_off(f"{RO}.agent.custom_async_server.path", None, STR, "custom async rollout servers", "remove it")
_off(f"{RO}.agent.custom_async_server.name", None, STR, "custom async rollout servers", "remove it")
MT = f"{RO}.multi_turn"
_off(f"{MT}.max_turns", None, INT, "verl's older turn limit", "use multi_turn.max_assistant_turns")
_noop(f"{MT}.num_repeat_rollouts", None, INT, "verl 0.9.1 declares it but no rollout reads it.")
_off(f"{RO}.checkpoint_engine.backend", "naive", STR, "weight-sync backends other than in-memory",
     LEAVE + " (naive)")
_off(f"{RO}.checkpoint_engine.engine_kwargs", {}, DICT, "weight-sync backend options", "remove it")
_off(f"{RO}.trace.backend", None, STR, "rollout tracing (weave, mlflow)", "remove it")
_noop(f"{RO}.trace.token2text", False, BOOL, "read only with rollout.trace.backend, which verl-npu refuses.")
_noop(f"{RO}.trace.max_samples_per_step_per_worker", None, INT, "read only with rollout.trace.backend, which "
      "verl-npu refuses.")
_off(f"{RO}.skip_rollout", False, BOOL, "replaying dumped rollouts instead of generating", LEAVE + " (false)")
_noop(f"{RO}.skip_dump_dir", "/tmp/rollout_dump", STR, "read only with rollout.skip_rollout, which verl-npu refuses.")
_off(f"{RO}.skip_tokenizer_init", True, BOOL, "an engine that loads its own tokenizer", LEAVE + " (true)")
_off(f"{RO}.enable_rollout_routing_replay", False, BOOL, "MoE routing replay", LEAVE + " (false)")
_off(f"{RO}.prometheus.enable", False, BOOL, "the Prometheus rollout metrics server", "remove it")
default: Any
for leaf, default, type_ in (("port", 9090, INT), ("file", None, STR), ("served_model_name", None, STR)):
    _noop(f"{RO}.prometheus.{leaf}", default, type_, "read only with rollout.prometheus.enable, which verl-npu "
          "refuses.")
_off(f"{RO}.quantization", None, STR, "quantized rollout", "remove it")
_off(f"{RO}.quantization_config_file", None, STR, "quantized rollout", "remove it")
_off(f"{RO}.mtp", None, DICT, "multi-token-prediction speculative decoding", "remove it")
_noop(f"{RO}.layered_summon", False, BOOL, "verl gathers LoRA weights layer by layer with it; verl-npu's weight "
      "sync already streams the merged LoRA weights one bucket at a time.")

# ---------------------------------------------------------------- model
_off(f"{M}.hf_config_path", None, STR, "a model config outside model.path", "put config.json in model.path")
_off(f"{M}.tiled_mlp.enabled", False, BOOL, "tiled MLP", LEAVE + " (false)")
_noop(f"{M}.tiled_mlp.num_shards", 4, INT, "read only with model.tiled_mlp.enabled, which verl-npu refuses.")
_off(f"{M}.mtp.enable", False, BOOL, "multi-token prediction", "remove the mtp keys")
for leaf, default, type_ in (("enable_train", False, BOOL), ("enable_rollout", False, BOOL),
                             ("detach_encoder", False, BOOL), ("mtp_loss_scaling_factor", 0.1, FLOAT),
                             ("speculative_algorithm", "EAGLE", STR), ("speculative_num_steps", 2, INT),
                             ("speculative_eagle_topk", 2, INT), ("speculative_num_draft_tokens", 4, INT),
                             ("method", "mtp", STR), ("num_speculative_tokens", 1, INT)):
    _noop(f"{M}.mtp.{leaf}", default, type_, "read only with model.mtp.enable, which verl-npu refuses.")

# ---------------------------------------------------------------- data
_off("data.train_max_samples", -1, INT, "training on the first N rows only", "cut the parquet file")
_off("data.val_max_samples", -1, INT, "validating on the first N rows only", "cut the parquet file")
_noop("data.image_patch_size", 14, INT, "the image patch size comes from the model's own processor.")
_off("data.return_multi_modal_inputs", True, BOOL, "dropping the processor outputs of multimodal rows",
     LEAVE + " (true)")
_off("data.sampler.class_path", None, STR, "custom samplers", "use data.shuffle / data.seed")
_off("data.sampler.class_name", None, STR, "custom samplers", "use data.shuffle / data.seed")
_off("data.datagen.path", None, STR, "dynamic data generation", "write the data to parquet first")
_off("data.datagen.name", None, STR, "dynamic data generation", "write the data to parquet first")
_off("data.apply_chat_template_kwargs", {}, DICT, "extra chat-template arguments",
     "set model.custom_chat_template to a template that renders what you need")

# ---------------------------------------------------------------- reward manager, algorithm, trainer
_noop("reward_manager.source", "register", STR, "how verl finds its reward manager class; verl-npu's reward "
      "manager is reward_model.reward_manager.")
_off("reward_manager.module.path", None, STR, "custom reward-manager classes",
     "use custom_reward_function.path for your own scoring")
_off("reward_manager.module.name", "custom_reward_manager", STR, "custom reward-manager classes",
     "use custom_reward_function.name")
_noop("trainer.esi_redundant_time", 0, FLOAT, "verl saves early before an ESI instance expires; verl-npu saves "
      "when the scheduler sends SIGTERM (trainer.save_on_preempt).", min=0)
_noop("trainer.ray_wait_register_center_timeout", 300, INT, "verl's wait for its Ray register center; verl-npu "
      "has none (its workers report to the launcher directly).", min=1)
_noop("trainer.use_legacy_worker_impl", "auto", STR, "verl's choice between its two worker implementations; "
      "verl-npu has one.", choices=("auto", "enable", "disable"))
_off("transfer_queue.enable", False, BOOL, "TransferQueue data transfer", LEAVE + " (false)")

#: verl keys that verl-npu reads under another name: verl path -> schema path (both full).
ALIASES: dict[str, str] = {_full(k): _full(v) for k, v in {
    f"{AC}.optim.lr_scheduler_type": f"{AC}.optim.warmup_style",
    "critic.optim.lr_scheduler_type": "critic.optim.warmup_style",
    f"{AC}.optim.clip_grad": f"{AC}.grad_clip",
    f"{AC}.use_remove_padding": f"{M}.use_remove_padding",
    f"{AC}.use_fused_kernels": f"{M}.use_fused_kernels",
    f"{AC}.fsdp_config.ulysses_sequence_parallel_size": f"{AC}.ulysses_sequence_parallel_size",
    f"{R}.fsdp_config.ulysses_sequence_parallel_size": f"{R}.ulysses_sequence_parallel_size",
    f"{AC}.fsdp_config.use_torch_compile": f"{AC}.use_torch_compile",
    f"{AC}.fsdp_config.entropy_from_logits_with_chunking": f"{AC}.entropy_from_logits_with_chunking",
    f"{RO}.checkpoint_engine.update_weights_bucket_megabytes": f"{RO}.update_weights_bucket_megabytes",
    f"{M}.tokenizer_path": "data.tokenizer",
    "data.tool_config_path": f"{RO}.multi_turn.tool_config_path",
    "data.function_tool_path": f"{RO}.multi_turn.function_tool_path",
    "reward_manager.name": "reward_model.reward_manager",
    "ray_kwargs.ray_init.num_cpus": "ray_init.num_cpus",
    "ray_kwargs.timeline_json_file": "ray_init.timeline_json_file",
    **{f"reward_model.overlong_buffer.{k}": f"reward_model.reward_kwargs.overlong_buffer_cfg.{k}"
       for k in ("enable", "len", "penalty_factor", "log")},
}.items()}
#: aliases that also warn (the DAPO recipe's older spelling): one warning naming both keys.
WARN_ALIASES = frozenset(k for k in ALIASES if k.startswith(_full("reward_model.overlong_buffer.")))

_MEGATRON = ("Megatron (tensor/pipeline/expert-parallel training)", "use actor.strategy=fsdp2 (FSDP2 shards "
             "over all devices; Ulysses sequence parallelism for long responses)")
_CRITIC = ("this critic option", "remove it; the critic keys verl-npu reads are listed under critic.* in "
           "docs/config_reference.md")
_RM = ("this reward-model option", "remove it; the reward_model keys verl-npu reads are listed under "
       "reward_model.* in docs/config_reference.md")
_RM_POOL = ("a separate resource pool for the reward model", "remove it: the reward model shares the actor's "
            "devices (colocated)")
_RM_LOOP = ("verl's reward loop (asynchronous reward workers)", "remove it: rewards are computed in the trainer "
            "(reward_model.enable for a model reward, custom_reward_function for rule rewards)")
#: whole verl features verl-npu refuses: full prefix -> (what is missing, what to do instead).
REFUSED_SUBTREES: dict[str, tuple[str, str]] = {_full(k): v for k, v in {
    f"{AC}.megatron": _MEGATRON,
    f"{R}.megatron": _MEGATRON,
    "critic": _CRITIC,
    "reward_model": _RM,
    "reward_model.rollout": ("generative reward models (a rollout engine serving the reward model)",
                             "use a sequence-classification reward model (reward_model.model.path)"),
    "reward_model.sandbox_fusion": ("sandbox rewards", "score code with custom_reward_function.path"),
    "reward_model.profiler": ("profiling the reward model", "profile the actor (global_profiler)"),
    "reward_model.enable_resource_pool": _RM_POOL,
    "reward_model.nnodes": _RM_POOL,
    "reward_model.n_gpus_per_node": _RM_POOL,
    "reward_model.use_reward_loop": _RM_LOOP,
    "reward_model.num_workers": _RM_LOOP,
    "reward_model.reward_loop_source": _RM_LOOP,
    "reward_model.reward_loop_module_path": _RM_LOOP,
    "reward_model.reward_loop_class_name": _RM_LOOP,
    f"{RO}.agent": ("agent loops", "remove the agent keys (single-turn rollout)"),
    "algorithm.pf_ppo": ("pf-ppo", "remove it"),
    "ray_kwargs": ("Ray options other than ray_init.num_cpus and timeline_json_file",
                   "set ray_init.num_cpus, or configure the Ray cluster you start (RAY_ADDRESS)"),
    "transfer_queue": ("TransferQueue data transfer", "remove it"),
}.items()}


def _register_091() -> None:
    """verl 0.9.1's added keys (schema_verl_091), into the tables above."""
    from verl_npu.config import schema_verl_091

    aliases: dict[str, str] = {}
    refused: dict[str, tuple[str, str]] = {}
    schema_verl_091.register(_noop, _off, aliases, refused)
    ALIASES.update({_full(k): _full(v) for k, v in aliases.items()})
    REFUSED_SUBTREES.update({_full(k): v for k, v in refused.items()})


_register_091()

_C, _RM_ = "critic.model.fsdp_config", "reward_model"
#: keys verl-npu reads or refuses by name that verl 0.9.1's schema no longer has (verl before 0.9.1
#: spelled them so; scripts written for it still carry them): full path or prefix -> where verl 0.9.1 has it.
OLDER_VERL: dict[str, str] = {_full(k): v for k, v in {
    f"{RO}.update_weights_bucket_megabytes": f"{RO}.checkpoint_engine.update_weights_bucket_megabytes",
    f"{RO}.use_fire_sampling": "removed",
    f"{RO}.multi_turn.interaction_config_path": "removed (verl 0.9.1's multi_turn has no interactions; verl-npu reads "
                                                "the key as verl 0.5-0.8 did)",
    f"{RO}.multi_turn.max_turns": f"{RO}.multi_turn.max_assistant_turns",
    **{f"{_C}.{leaf}": f"critic.fsdp.{leaf}" for leaf in ("param_offload", "optimizer_offload",
                                                           "reshard_after_forward", "wrap_policy.min_num_params",
                                                           "fsdp_size", "forward_prefetch")},
    **{f"{_RM_}.{leaf}": "removed; its reward model runs in a rollout engine (reward.reward_model.rollout)"
       for leaf in ("strategy", "model.input_tokenizer", "model.override_config", "model.use_remove_padding",
                    "model.use_fused_kernels", "model.use_shm", "ulysses_sequence_parallel_size",
                    "model.fsdp_config", "micro_batch_size_per_gpu", "max_length", "use_dynamic_bsz",
                    "forward_max_token_len_per_gpu", "profiler")},
    **{f"{_RM_}.{leaf}": "removed" for leaf in ("use_reward_loop", "launch_reward_fn_async")},
    f"{_RM_}.sandbox_fusion": "reward.sandbox_fusion",
    "trainer.profile_steps": "global_profiler.steps",
    "trainer.controller_nsight_options": "global_profiler.global_tool_config.nsys.controller_nsight_options",
    "trainer.worker_nsight_options": "global_profiler.global_tool_config.nsys.worker_nsight_options",
    "trainer.use_legacy_worker_impl": "removed (verl 0.9.1 has one worker implementation)",
    "ray_init.num_cpus": "ray_kwargs.ray_init.num_cpus",
    "ray_init.timeline_json_file": "ray_kwargs.timeline_json_file",
    **{f"{A}.{role}.router_replay": f"{A}.{role}.megatron.router_replay (Megatron only)" for role in ("actor", "ref")},
    f"{AC}.fsdp_config.grad_offload": "removed",
    f"{AC}.sum_pi_squared_checkpointing": "removed",
    f"{RO}.skip_rollout": "skip.rollout.enable",
    f"{RO}.skip_dump_dir": "skip.rollout.dump_dir",
    "data.sampler": "removed",
    "data.datagen": "removed",
    "reward_manager": "reward.reward_manager",
    "reward_model.overlong_buffer": "reward.reward_kwargs.overlong_buffer_cfg (the DAPO recipe's older spelling)",
}.items()}
#: keys verl 0.9.1 reads although its generated schema does not declare them (Hydra needs `+` to set them):
#: full path -> where verl 0.9.1 reads it.
READ_WITH_PLUS: dict[str, str] = {_full(k): v for k, v in {
    "reward_model.reward_kwargs": "verl's legacy-reward migration, which moves it to reward.reward_kwargs",
    "reward.custom_reward_function.reward_kwargs": "the reward function loader (extra keyword arguments)",
    "reward.reward_kwargs": "the reward manager (the dapo manager's overlong_buffer_cfg and max_resp_len)",
    "custom_reward_function.reward_kwargs": "the reward function loader, after the legacy-reward migration",
    f"{AC}.optim.grad_clip": "the optimizer config (deprecated, copied to clip_grad)",
    "critic.optim.grad_clip": "the optimizer config (deprecated, copied to clip_grad)",
    "trainer.remove_previous_ckpt_in_save": "the trainer's checkpoint cleanup (deprecated)",
    "algorithm.gdpo_reward_keys": "the algorithm config (gdpo)",
    "algorithm.gdpo_reward_weights": "the algorithm config (gdpo)",
}.items()}
# fmt: on


def refused_subtree(path: str) -> tuple[str, tuple[str, str]] | None:
    """(prefix, (what, instead)) of the refused verl feature that `path` lies under, else None
    (the longest matching prefix wins)."""
    hits = [p for p in REFUSED_SUBTREES if path == p or path.startswith(p + ".")]
    if not hits:
        return None
    best = max(hits, key=len)
    return best, REFUSED_SUBTREES[best]


def is_target(path: str) -> bool:
    """True for verl's Hydra class selector `..._target_` (a no-op here)."""
    return path.rsplit(".", 1)[-1] == "_target_"


TARGET_NOOP = "verl's Hydra class selector (_target_); verl-npu builds its own config objects"
