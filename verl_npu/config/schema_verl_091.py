"""The keys verl 0.9.1 added to its `ppo_trainer` schema that verl-npu does not read under their own
name, each with what happens to it here (the same categories as `schema_verl`: no-op, refused
unless off, a verl spelling of a key verl-npu reads, or a whole refused feature).

`register` is called once by `schema_verl` with its helpers and tables; nothing here is imported by
anything else. The leaf keys themselves are in tests/fixtures/verl_ppo_trainer_keys.txt (from verl
0.9.1's `_generated_ppo_trainer.yaml`; tests/helpers/verl_keys_from_yaml.py regenerates it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verl_npu.config import schema_distill
from verl_npu.config.schema import BOOL, DICT, FLOAT, INT, INT_LIST, STR, STR_LIST

# A table: one call per key, kept one per line so that the keys read as rows (ruff format would put each
# argument on a line of its own).
# fmt: off

A, AC, R, RO, M = ("actor_rollout_ref", "actor_rollout_ref.actor", "actor_rollout_ref.ref",
                   "actor_rollout_ref.rollout", "actor_rollout_ref.model")
LEAVE = "leave it at its default"
ROLES_WITH_PROFILER = (AC, R, RO)

_QAT = ("quantization-aware training (QAT)", "leave it false (verl-npu trains in bf16 on NPU/CUDA, fp32 on CPU)")
_TURBO = ("verl's FSDP-turbo engine settings", "remove them: verl-npu's FSDP2 shards over all workers "
          "(fsdp_config.fsdp_size) with Ulysses sequence parallelism (ulysses_sequence_parallel_size)")
_SWITCH = ("lending idle trainer devices to the rollout side (separate_async's hybrid_rollout step switching)",
           "remove the hybrid_rollout keys: the trainer and the rollout side keep their own devices (docs/async.md)")
_CUSTOM_SAMPLER = ("custom off-policy samplers", "remove it: the sampler is max_off_policy_threshold with "
                   "max_off_policy_strategy drop or wait (docs/async.md)")
_DISTILL = ("several teacher models (verl's multi-teacher routing by distillation.teacher_key)",
            "keep one teacher, under distillation.teacher_models.teacher_model (its keys are read)")
_SKIP = ("replaying dumped rollouts instead of generating (verl's skip manager)", "remove the skip keys")
_RM_ENGINE = ("generative reward models (a rollout engine serving the reward model)",
              "use a sequence-classification reward model (reward.reward_model.model_path or reward_model.model.path)")
_SANDBOX = ("sandbox rewards", "score code with custom_reward_function.path")


def register(noop: Callable[..., None], off: Callable[..., None], aliases: dict[str, str],
             refused: dict[str, tuple[str, str]]) -> None:
    """Add verl 0.9.1's keys to `schema_verl`'s tables: `noop(path, default, type, why, **kw)`,
    `off(path, default, type, what, instead, **kw)`, `aliases[verl path] = schema path` and
    `refused[prefix] = (what, instead)`, all with short (verl) paths."""
    _engine(noop, off, aliases, refused)
    _rollout_and_model(noop, off, refused)
    _data_trainer_profiler(noop, off, refused)
    _reward(noop, off, aliases, refused)
    aliases.update(CRITIC_FSDP)


def _engine(noop, off, aliases, refused) -> None:
    """verl's FSDP engine keys of the actor and the reference model (fsdp_config.*), and their role copies."""
    for base in (AC, R):
        fc = f"{base}.fsdp_config"
        trains = base == AC
        for spot in (f"{fc}.pad_to_length", f"{base}.pad_to_length"):
            off(spot, False, BOOL, "padding packed micro batches up to fixed length buckets",
                "leave it false (verl-npu packs each micro batch to its own length)")
        noop(f"{fc}.pad_to_length_bucket", 1024, INT, "read only with pad_to_length, which verl-npu refuses.", min=1)
        for spot in (f"{fc}.qat", f"{base}.qat") if trains else (f"{fc}.qat",):
            off(f"{spot}.enable", False, BOOL, *_QAT)
            for leaf, default, type_ in (("mode", "w4a16", STR), ("group_size", 16, INT),
                                         ("ignore_patterns", ["lm_head", "embed_tokens", "re:.*mlp.gate$"], STR_LIST),
                                         ("activation_observer", "static_minmax", STR),
                                         ("quantization_config_path", None, STR)):
                noop(f"{spot}.{leaf}", default, type_, "read only with qat.enable, which verl-npu refuses.")
        refused[f"{fc}.turbo_config"] = _TURBO
        if trains:
            aliases[f"{fc}.entropy_from_logits_chunk_size"] = f"{AC}.entropy_from_logits_chunk_size"
            off(f"{fc}.use_no_sync_for_gradient_accumulation", False, BOOL,
                "skipping the gradient reduce-scatter between micro batches (FSDP no_sync)",
                "leave it false (gradients are reduced every micro batch)")
        else:
            for spot in (f"{fc}.entropy_from_logits_chunk_size", f"{base}.entropy_from_logits_chunk_size"):
                noop(spot, 2048, INT, "the reference model computes no entropy (only log-probs).", min=1)
            noop(f"{fc}.use_no_sync_for_gradient_accumulation", False, BOOL,
                 "the reference model computes no gradients.")
    noop(f"{AC}.checkpoint.strict", True, BOOL, "verl's strict check of the weights it exports; verl-npu's "
         "huggingface/ export always holds every weight of the model (docs/checkpoints.md).")


def _rollout_and_model(noop, off, refused) -> None:
    off(f"{RO}.full_determinism", False, BOOL, "deterministic rollout kernels", LEAVE + " (false)")
    off(f"{RO}.seed", 42, INT, "a rollout seed of its own", "leave it at 42: verl-npu seeds sampling from "
        "data.seed and each prompt's uid (set data.seed)")
    off(f"{RO}.router_config_path", None, STR, "external request routers for the rollout engines", "remove it")
    off(f"{RO}.checkpoint_engine.custom_backend_module", None, STR, "custom weight-sync backends", "remove it")
    for leaf in ("project_name", "experiment_name"):
        noop(f"{RO}.trace.{leaf}", None, STR, "read only with rollout.trace.backend, which verl-npu refuses.")
    off(f"{RO}.moe_load_balance_metrics_interval", 0, INT, "MoE load-balance metrics from routing replay",
        LEAVE + " (0)")
    noop(f"{RO}.qat", None, DICT, "verl's engine copy of the actor's fsdp_config.qat; QAT is refused there.")
    off(f"{RO}.disaggregation.enabled", False, BOOL, "prefill-decode disaggregation (an SGLang feature)",
        LEAVE + " (false)")
    default: Any
    for leaf, default, type_ in (("prefill_replicas", 1, INT), ("decode_replicas", 1, INT),
                                 ("decode_tensor_model_parallel_size", None, INT), ("transfer_backend", "nixl", STR),
                                 ("bootstrap_port", None, INT), ("ib_device", None, STR)):
        noop(f"{RO}.disaggregation.{leaf}", default, type_, "read only with rollout.disaggregation.enabled, which "
             "verl-npu refuses.")
    # model.lora: the LoRA settings of verl's Megatron engine (fused module names like linear_qkv)
    off(f"{M}.lora.rank", 0, INT, "LoRA configured through model.lora (verl's Megatron LoRA)",
        "use model.lora_rank / lora_alpha / target_modules (FSDP LoRA through peft)")
    off(f"{M}.lora.adapter_path", None, STR, "LoRA configured through model.lora (verl's Megatron LoRA)",
        "use model.lora_adapter_path")
    noop(f"{M}.lora.merge", False, BOOL, "verl-npu always sends the merged weights (base + adapter) to the rollout "
         "engine.")
    for leaf, default, type_ in (("type", "lora", STR), ("alpha", 32, INT), ("dropout", 0.0, FLOAT),
                                 ("target_modules", ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
                                  STR_LIST), ("exclude_modules", [], STR_LIST), ("dropout_position", "pre", STR),
                                 ("lora_A_init_method", "xavier", STR), ("lora_B_init_method", "zero", STR),
                                 ("a2a_experimental", False, BOOL), ("dtype", None, STR),
                                 ("freeze_vision_model", True, BOOL), ("freeze_vision_projection", True, BOOL),
                                 ("freeze_language_model", True, BOOL)):
        noop(f"{M}.lora.{leaf}", default, type_, "read only with model.lora.rank (verl's Megatron LoRA), which "
             "verl-npu refuses; its FSDP LoRA keys are model.lora_rank / lora_alpha / target_modules.")


def _data_trainer_profiler(noop, off, refused) -> None:
    off("data.audio_key", "audios", STR, "audio inputs", "leave it at 'audios': verl-npu reads text and images "
        "(data.image_key) only")
    off("data.mm_processor_kwargs", {}, DICT, "extra multimodal processor arguments",
        "set data.min_pixels / data.max_pixels for the image sizes")
    noop("trainer.use_v1", True, BOOL, "verl's choice between its two trainer loops; verl-npu has one.")
    # trainer.v1.trainer_mode, separate_async.*, sampler.max_off_policy_*: schema_async (read by trainer/async_ppo)
    noop("trainer.v1.sync", {}, DICT, "verl's settings of its V1 sync mode (none); trainer_mode=sync is the sync loop.")
    noop("trainer.v1.colocate_async.num_warmup_batches", 1, INT, "read only with trainer_mode=colocate_async, which "
         "verl-npu refuses (docs/async.md).", min=1)
    refused["trainer.v1.separate_async.hybrid_rollout"] = _SWITCH
    off("trainer.v1.sampler.sync_refill_failed_groups", False, BOOL, "refilling failed groups in sync mode",
        "leave it false")
    off("trainer.v1.sampler.custom_sampler.path", None, STR, *_CUSTOM_SAMPLER)
    off("trainer.v1.sampler.custom_sampler.name", None, STR, *_CUSTOM_SAMPLER)
    off("trainer.v1.sampler.sampler_kwargs", None, DICT, *_CUSTOM_SAMPLER)
    off("trainer.checkpoint_callback_class", None, STR, "a callback class run after each checkpoint",
        "remove it (checkpoints are complete when latest_checkpointed_iteration.txt moves)")
    refused["distillation.teacher_models"] = _DISTILL   # teacher_model's own keys are schema keys (schema_distill)
    for path, default, type_, why, kw in schema_distill.NOOPS:   # verl's teacher-server settings
        noop(path, default, type_, why, **kw)
    for part in ("rollout", "rollout_tq", "async_rollout"):
        off(f"skip.{part}.enable", False, BOOL, *_SKIP)
    refused["skip"] = _SKIP
    for prefix in ("global_profiler", *(f"{role}.profiler" for role in ROLES_WITH_PROFILER)):
        noop(f"{prefix}.relocate_results", False, BOOL, "verl moves traces a backend wrote elsewhere (nsys, rollout "
             "engines) into save_path; verl-npu writes every trace under save_path already.")
        off(f"{prefix}.finish_hook_cmd", None, STR, "running a shell command after the last profiled step",
            "run it yourself after the run: the traces are in global_profiler.save_path")
        noop(f"{prefix}.finish_hook_all_ranks", False, BOOL, "read only with finish_hook_cmd, which verl-npu refuses.")
        noop(f"{prefix}.finish_hook_ranks", [], INT_LIST, "read only with finish_hook_cmd, which verl-npu refuses.")


def _reward(noop, off, aliases, refused) -> None:
    """verl 0.9.1's `reward` section (the new home of the reward settings; verl maps the legacy
    `reward_model.*` / `custom_reward_function.*` keys onto it) and the legacy top-level sandbox_fusion."""
    rw = "reward"
    noop(f"{rw}.num_workers", 8, INT, "verl's reward-loop worker count; verl-npu computes rewards in the trainer.",
         min=1)
    for leaf in ("path", "name"):
        aliases[f"{rw}.custom_reward_function.{leaf}"] = f"custom_reward_function.{leaf}"
    aliases[f"{rw}.custom_reward_function.reward_kwargs"] = "custom_reward_function.reward_kwargs"
    # verl moves reward_model.reward_kwargs to reward.reward_kwargs (the dapo reward manager's settings; set with +)
    for leaf in ("max_resp_len", *(f"overlong_buffer_cfg.{k}" for k in ("enable", "len", "penalty_factor", "log"))):
        aliases[f"{rw}.reward_kwargs.{leaf}"] = f"reward_model.reward_kwargs.{leaf}"
    noop(f"{rw}.reward_manager.source", "register", STR, "how verl finds its reward manager class; verl-npu's "
         "reward manager is reward.reward_manager.name (reward_model.reward_manager).")
    aliases[f"{rw}.reward_manager.name"] = "reward_model.reward_manager"
    off(f"{rw}.reward_manager.module.path", None, STR, "custom reward-manager classes",
        "use custom_reward_function.path for your own scoring")
    off(f"{rw}.reward_manager.module.name", "custom_reward_manager", STR, "custom reward-manager classes",
        "use custom_reward_function.name")
    aliases[f"{rw}.reward_model.enable"] = "reward_model.enable"
    aliases[f"{rw}.reward_model.model_path"] = "reward_model.model.path"
    off(f"{rw}.reward_model.enable_resource_pool", False, BOOL, "a separate resource pool for the reward model",
        "leave it false: the reward model shares the actor's devices (colocated)")
    noop(f"{rw}.reward_model.n_gpus_per_node", 8, INT, "read only with reward.reward_model.enable_resource_pool, "
         "which verl-npu refuses.", min=1)
    noop(f"{rw}.reward_model.nnodes", 0, INT, "read only with reward.reward_model.enable_resource_pool, which "
         "verl-npu refuses.", min=0)
    refused[f"{rw}.reward_model.rollout"] = _RM_ENGINE
    for base in (rw, ""):
        sb = f"{base}.sandbox_fusion" if base else "sandbox_fusion"
        off(f"{sb}.url", None, STR, *_SANDBOX)
        noop(f"{sb}.max_concurrent", 64 if base else None, INT, "read only with sandbox_fusion.url, which verl-npu "
             "refuses.", min=1)
        noop(f"{sb}.memory_limit_mb", 1024 if base else None, INT, "read only with sandbox_fusion.url, which "
             "verl-npu refuses.", min=1)


#: verl 0.9.1's spelling of the critic's FSDP settings (critic.fsdp.*) -> the key verl-npu reads.
CRITIC_FSDP = {f"critic.fsdp.{leaf}": f"critic.model.fsdp_config.{leaf}"
               for leaf in ("param_offload", "optimizer_offload", "reshard_after_forward", "wrap_policy.min_num_params",
                            "fsdp_size", "forward_prefetch")}
CRITIC_FSDP["critic.fsdp.ulysses_sequence_parallel_size"] = "critic.ulysses_sequence_parallel_size"
