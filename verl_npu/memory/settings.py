"""The recipe's numbers the memory plan reads: `settings_from_recipe(rc)` turns a resolved recipe into
`Settings` (plain numbers, per device unless said), for `verl_npu.memory.recipe.build_plan`. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from verl_npu.registry import ROLLOUT_ENGINES

if TYPE_CHECKING:
    from verl_npu.config import RecipeConfig
    from verl_npu.config.sft import SFTRecipe

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class Settings:
    """The recipe's numbers the plan reads (per device unless said)."""

    world: int
    gpus_per_node: int
    compute_bytes: int  # 2: bf16 on an accelerator, 4: float32 on CPU
    master_bytes: int  # the actor's weights, gradients and AdamW moments: 4 (fp32) or 2 (model_dtype bf16)
    prompt: int
    response: int
    n: int
    train_batch: int
    fsdp: bool  # FSDP2 shards (several workers, or any param_offload)
    # actor
    micro_rows: int | None
    dynamic: bool
    token_budget: int
    checkpointing: bool
    remove_padding: bool
    fused: bool
    sp: int
    actor_offload: bool
    optimizer_offload: bool
    lora_rank: int
    freeze_vision: bool
    max_pixels: int
    # old / ref log-probs
    lp_micro_rows: int | None
    lp_budget: int
    use_ref: bool
    ref_micro_rows: int | None
    ref_offload: bool
    # rollout
    rollout: str
    kv_pool: bool  # the engine reserves gpu_memory_utilization for weights and KV cache (RolloutSpec.memory)
    tp: int
    gpu_memory_utilization: float
    rollout_bytes: int
    max_model_len: int
    max_num_seqs: int
    max_batched_tokens: int
    free_cache: bool
    kv_cache_bytes: int | None
    # critic, reward model
    critic: bool
    critic_micro_rows: int | None
    critic_dynamic: bool
    critic_budget: int
    critic_checkpointing: bool
    critic_offload: bool
    reward_model: bool
    rm_micro_rows: int | None
    rm_offload: bool
    teacher: bool  # distillation.enabled: a frozen teacher, sharded and micro-batched like the reference policy
    saves: bool
    kl: bool = False  # a KL term needs reference log-probs (LoRA: the actor with its adapters off)
    cpu: bool = False  # planned for the CPU: the device's memory is the host's
    balance: bool = True  # trainer.balance_batch: rows spread over the data-parallel ranks
    mini_batch: int = 0  # actor.ppo_mini_batch_size (prompts); 0: unknown
    rollout_processes: int = 0  # separate_async: the standalone rollout pool's processes (0: sync, colocated)
    sft: bool = False  # an SFT recipe: the model's update and checkpoint only (no rollout, no log-prob passes)

    @property
    def seq(self) -> int:
        return self.prompt + self.response

    @property
    def rows_per_device(self) -> int:
        """Responses of one step on one device: train_batch * n / (world / sp)."""
        return max(1, self.train_batch * self.n * self.sp // self.world)


def settings_from_recipe(rc: RecipeConfig, accelerator: bool | None = None) -> Settings:
    """The `Settings` of a resolved recipe (`verl_npu.config.load_recipe`); `accelerator`: plan for an
    accelerator (bf16 compute) or the CPU (float32); None: the recipe's trainer.device (auto: an accelerator)."""
    from verl_npu.registry import ROLES

    b = rc.backend
    arr, data, tr = b.actor_rollout_ref, b.data, b.trainer
    actor, ro, ref, model = arr.actor, arr.rollout, arr.ref, arr.model
    if accelerator is None:
        accelerator = plans_accelerator(tr.device)
    critic, rm = b.critic, b.reward_model
    engine = dict(ro.get("engine_kwargs", {}).get("vllm", {}) or {})
    fsdp_sections = [actor.fsdp_config, ref.fsdp_config, critic.model.fsdp_config, rm.model.fsdp_config]
    offload_any = any(bool(f.get("param_offload", False)) for f in fsdp_sections)
    critic_dyn = actor.use_dynamic_bsz if critic.get("use_dynamic_bsz") is None else critic.use_dynamic_bsz
    lora = int(model.get("lora_rank", 0) or 0)
    return Settings(
        world=int(rc.world_size),
        gpus_per_node=int(tr.n_gpus_per_node),
        compute_bytes=2 if accelerator else 4,
        master_bytes=2 if str(actor.fsdp_config.get("model_dtype", "fp32")) in ("bf16", "bfloat16") else 4,
        prompt=int(data.max_prompt_length),
        response=int(data.max_response_length),
        n=int(ro.n),
        train_batch=int(data.train_batch_size),
        fsdp=rc.world_size > 1 or offload_any,
        micro_rows=_opt_int(actor.ppo_micro_batch_size_per_gpu),
        dynamic=bool(actor.use_dynamic_bsz),
        token_budget=int(actor.ppo_max_token_len_per_gpu),
        checkpointing=bool(model.enable_gradient_checkpointing),
        remove_padding=bool(model.use_remove_padding),
        fused=bool(model.get("use_fused_kernels", False)),
        sp=int(actor.ulysses_sequence_parallel_size),
        actor_offload=bool(actor.fsdp_config.param_offload),
        optimizer_offload=bool(actor.fsdp_config.optimizer_offload),
        lora_rank=lora,
        freeze_vision=bool(actor.get("freeze_vision_tower", False)),
        max_pixels=int(data.get("max_pixels", 0) or 0),
        lp_micro_rows=_opt_int(ro.log_prob_micro_batch_size_per_gpu),
        lp_budget=int(ro.log_prob_max_token_len_per_gpu),
        use_ref=(bool(actor.use_kl_loss) or bool(b.algorithm.use_kl_in_reward)) and lora <= 0,
        ref_micro_rows=_opt_int(ref.log_prob_micro_batch_size_per_gpu),
        ref_offload=bool(ref.fsdp_config.param_offload),
        rollout=str(ro.name),
        kv_pool=ROLLOUT_ENGINES.spec(str(ro.name)).memory == "kv_cache_pool",
        tp=int(ro.tensor_model_parallel_size),
        gpu_memory_utilization=float(ro.gpu_memory_utilization),
        rollout_bytes=_DTYPE_BYTES.get(str(ro.dtype), 2),
        max_model_len=int(ro.max_model_len or data.max_prompt_length + data.max_response_length),
        max_num_seqs=int(engine.get("max_num_seqs") or ro.max_num_seqs),
        max_batched_tokens=int(engine.get("max_num_batched_tokens") or ro.max_num_batched_tokens),
        free_cache=bool(engine.get("enable_sleep_mode", ro.free_cache_engine)),
        kv_cache_bytes=_opt_int(engine.get("kv_cache_memory_bytes")),
        critic=ROLES.spec("critic").needed(b),
        critic_micro_rows=_opt_int(critic.ppo_micro_batch_size_per_gpu),
        critic_dynamic=bool(critic_dyn),
        critic_budget=int(critic.ppo_max_token_len_per_gpu),
        critic_checkpointing=bool(critic.model.enable_gradient_checkpointing),
        critic_offload=bool(critic.model.fsdp_config.param_offload),
        reward_model=bool(rm.enable),
        rm_micro_rows=_opt_int(rm.micro_batch_size_per_gpu),
        rm_offload=bool(rm.model.fsdp_config.param_offload),
        teacher=ROLES.spec("teacher").needed(b),
        saves=int(tr.save_freq or 0) > 0,
        kl=bool(actor.use_kl_loss) or bool(b.algorithm.use_kl_in_reward),
        cpu=not accelerator,
        balance=bool(tr.get("balance_batch", True)),
        mini_batch=int(actor.ppo_mini_batch_size),
        rollout_processes=(
            int(ro.nnodes or 0) * int(ro.n_gpus_per_node or 1) if tr.v1.trainer_mode == "separate_async" else 0
        ),
    )


def settings_from_sft(rc: SFTRecipe, accelerator: bool | None = None) -> Settings:
    """The `Settings` of a loaded SFT recipe (`verl_npu.config.sft.load_sft_recipe`), in the RL plan's terms: one
    sequence per row (prompt 0, response data.max_length: every position has logits), n 1, the step's rows as one
    mini-batch (data.train_batch_size conversations, the micro-batches accumulating gradients); no rollout, no
    reference policy, no critic. `accelerator` as `settings_from_recipe`."""
    b = rc.typed
    data, model, engine, tr = b.data, b.model, b.engine, b.trainer
    if accelerator is None:
        accelerator = plans_accelerator(tr.device)
    offload = bool(engine.param_offload)
    micro = int(data.micro_batch_size_per_gpu)
    budget = int(data.max_token_len_per_gpu)
    save_freq = tr.save_freq
    return Settings(
        world=int(rc.world_size),
        gpus_per_node=int(tr.n_gpus_per_node),
        compute_bytes=2 if accelerator and str(engine.dtype) != "float32" else 4,
        master_bytes=4,  # engine.model_dtype is fp32 only (bf16 master weights are refused)
        prompt=0,
        response=int(data.max_length),
        n=1,
        train_batch=int(data.train_batch_size),
        fsdp=rc.world_size > 1 or offload,
        micro_rows=micro,
        dynamic=bool(data.use_dynamic_bsz),
        token_budget=budget,
        checkpointing=bool(model.enable_gradient_checkpointing),
        remove_padding=bool(model.use_remove_padding),
        fused=False,  # refused in SFT
        sp=1,  # Ulysses is refused in SFT
        actor_offload=offload,
        optimizer_offload=offload or bool(engine.optimizer_offload),
        lora_rank=int(model.lora_rank or 0),
        freeze_vision=False,
        max_pixels=0,
        lp_micro_rows=micro,  # the validation loss's no-grad forward: the training micro-batches
        lp_budget=budget,
        use_ref=False,
        ref_micro_rows=None,
        ref_offload=False,
        rollout="hf",
        kv_pool=False,
        tp=1,
        gpu_memory_utilization=0.0,
        rollout_bytes=2,
        max_model_len=int(data.max_length),
        max_num_seqs=1,
        max_batched_tokens=1,
        free_cache=True,
        kv_cache_bytes=None,
        critic=False,
        critic_micro_rows=None,
        critic_dynamic=False,
        critic_budget=0,
        critic_checkpointing=False,
        critic_offload=False,
        reward_model=False,
        rm_micro_rows=None,
        rm_offload=False,
        teacher=False,
        saves=save_freq not in (None, -1, 0),
        cpu=not accelerator,
        balance=bool(tr.balance_batch),
        mini_batch=int(data.train_batch_size),
        sft=True,
    )


def _opt_int(value: Any) -> int | None:
    return int(value) if value is not None else None


def plans_accelerator(requested) -> bool:
    """trainer.device names an accelerator, or is auto (the plan is for the accelerator the recipe is
    written for, even on a machine without one)."""
    from verl_npu.device import configured_device

    if requested in (None, "", "auto"):
        return True
    device = configured_device(requested)
    return device is not None and device.kind != "cpu"
