"""A recipe's memory plan: what each phase holds on one device, the host figure, the knobs.

`settings_from_recipe(rc)` reads the resolved recipe into `Settings` (plain numbers); `build_plan`
puts the parts of `verl_npu.memory.plan` together per phase; `plan_recipe(rc, device_bytes, models)` does
both and adds the knobs: each is a change of one or two keys, planned again, with the bytes it saves
at the peak. Imports no torch (validate stays instant); see docs/memory.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from verl_npu.memory import plan as mp
from verl_npu.memory.plan import ModelSize, Part, Phase, Plan
from verl_npu.registry import ROLLOUT_ENGINES

if TYPE_CHECKING:
    from verl_npu.config import RecipeConfig

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class Settings:
    """The recipe's numbers the plan reads (per device unless said)."""

    world: int
    gpus_per_node: int
    compute_bytes: int            # 2: bf16 on an accelerator, 4: float32 on CPU
    master_bytes: int             # the actor's weights, gradients and AdamW moments: 4 (fp32) or 2 (model_dtype bf16)
    prompt: int
    response: int
    n: int
    train_batch: int
    fsdp: bool                    # FSDP2 shards (several workers, or any param_offload)
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
    kv_pool: bool   # the engine reserves gpu_memory_utilization for weights and KV cache (RolloutSpec.memory)
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
    saves: bool
    kl: bool = False              # a KL term needs reference log-probs (LoRA: the actor with its adapters off)
    cpu: bool = False             # planned for the CPU: the device's memory is the host's
    balance: bool = True          # trainer.balance_batch: rows spread over the data-parallel ranks
    mini_batch: int = 0           # actor.ppo_mini_batch_size (prompts); 0: unknown

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
        accelerator = _plans_accelerator(tr.device)
    critic, rm = b.critic, b.reward_model
    engine = dict(ro.get("engine_kwargs", {}).get("vllm", {}) or {})
    fsdp_sections = [actor.fsdp_config, ref.fsdp_config, critic.model.fsdp_config, rm.model.fsdp_config]
    offload_any = any(bool(f.get("param_offload", False)) for f in fsdp_sections)
    critic_dyn = actor.use_dynamic_bsz if critic.get("use_dynamic_bsz") is None else critic.use_dynamic_bsz
    lora = int(model.get("lora_rank", 0) or 0)
    return Settings(
        world=int(rc.world_size), gpus_per_node=int(tr.n_gpus_per_node), compute_bytes=2 if accelerator else 4,
        master_bytes=2 if str(actor.fsdp_config.get("model_dtype", "fp32")) in ("bf16", "bfloat16") else 4,
        prompt=int(data.max_prompt_length), response=int(data.max_response_length), n=int(ro.n),
        train_batch=int(data.train_batch_size), fsdp=rc.world_size > 1 or offload_any,
        micro_rows=_opt_int(actor.ppo_micro_batch_size_per_gpu), dynamic=bool(actor.use_dynamic_bsz),
        token_budget=int(actor.ppo_max_token_len_per_gpu), checkpointing=bool(model.enable_gradient_checkpointing),
        remove_padding=bool(model.use_remove_padding), fused=bool(model.get("use_fused_kernels", False)),
        sp=int(actor.ulysses_sequence_parallel_size), actor_offload=bool(actor.fsdp_config.param_offload),
        optimizer_offload=bool(actor.fsdp_config.optimizer_offload), lora_rank=lora,
        freeze_vision=bool(actor.get("freeze_vision_tower", False)), max_pixels=int(data.get("max_pixels", 0) or 0),
        lp_micro_rows=_opt_int(ro.log_prob_micro_batch_size_per_gpu), lp_budget=int(ro.log_prob_max_token_len_per_gpu),
        use_ref=(bool(actor.use_kl_loss) or bool(b.algorithm.use_kl_in_reward)) and lora <= 0,
        ref_micro_rows=_opt_int(ref.log_prob_micro_batch_size_per_gpu), ref_offload=bool(ref.fsdp_config.param_offload),
        rollout=str(ro.name), kv_pool=ROLLOUT_ENGINES.spec(str(ro.name)).memory == "kv_cache_pool",
        tp=int(ro.tensor_model_parallel_size), gpu_memory_utilization=float(ro.gpu_memory_utilization),
        rollout_bytes=_DTYPE_BYTES.get(str(ro.dtype), 2), max_model_len=int(ro.max_model_len or data.max_prompt_length
                                                                           + data.max_response_length),
        max_num_seqs=int(engine.get("max_num_seqs") or ro.max_num_seqs),
        max_batched_tokens=int(engine.get("max_num_batched_tokens") or ro.max_num_batched_tokens),
        free_cache=bool(engine.get("enable_sleep_mode", ro.free_cache_engine)),
        kv_cache_bytes=_opt_int(engine.get("kv_cache_memory_bytes")),
        critic=ROLES.spec("critic").needed(b), critic_micro_rows=_opt_int(critic.ppo_micro_batch_size_per_gpu),
        critic_dynamic=bool(critic_dyn), critic_budget=int(critic.ppo_max_token_len_per_gpu),
        critic_checkpointing=bool(critic.model.enable_gradient_checkpointing),
        critic_offload=bool(critic.model.fsdp_config.param_offload), reward_model=bool(rm.enable),
        rm_micro_rows=_opt_int(rm.micro_batch_size_per_gpu), rm_offload=bool(rm.model.fsdp_config.param_offload),
        saves=int(tr.save_freq or 0) > 0, kl=bool(actor.use_kl_loss) or bool(b.algorithm.use_kl_in_reward),
        cpu=not accelerator, balance=bool(tr.get("balance_batch", True)), mini_batch=int(actor.ppo_mini_batch_size),
    )


def _opt_int(value: Any) -> int | None:
    return int(value) if value is not None else None


def _samples_together(s: Settings) -> int:
    """How many samples of one prompt a rank's micro-batch holds side by side: n; with
    trainer.balance_batch over several data-parallel ranks, rows of equal length are dealt to the
    ranks in turn (verl_npu/workers/balance.py), so n // ranks (at least 1)."""
    dp = max(1, s.world // s.sp)
    return s.n if dp == 1 or not s.balance else max(1, s.n // dp)


def _shares_prompts(s: Settings) -> bool:
    """Padding-free without Ulysses, a prompt's samples together: a micro-batch runs each distinct
    prompt once (measured: two balanced workers with n = 2 share nothing)."""
    return s.remove_padding and s.sp == 1 and _samples_together(s) > 1


def _micro(s: Settings, rows: int | None, dynamic: bool, budget: int) -> tuple[float, float, str]:
    """(tokens, logit tokens, how) of one micro-batch on one device, before Ulysses' split. Its rows:
    `rows` (null: all of the device's rows), or with a token budget as many whole sequences as fit,
    max(1, budget // (prompt + response)) (rows are taken in order up to the budget). Tokens: rows x
    (prompt + response), with rows x (response + 1) logits (rows x response padding-free). Padding-free
    without Ulysses and with rollout.n > 1, each distinct prompt of the micro-batch runs once
    (verl_npu.models.shared_prompt; a prompt's responses are adjacent rows): ceil(rows / k) x prompt
    + rows x response tokens, k = `_samples_together`."""
    if dynamic:
        rows = max(1, budget // s.seq)
        how = f"a token budget of {budget} ({rows} rows)"
    else:
        rows = rows or s.rows_per_device
        how = f"{rows} rows x {s.seq} tokens"
    logits = rows * (s.response + (0 if s.remove_padding else 1))
    if _shares_prompts(s):
        return (math.ceil(rows / _samples_together(s)) * s.prompt + rows * s.response, logits,
                how + ", each prompt once")
    return rows * s.seq, logits, how


def _update_grads(resident: list[Part], update: list[Part], s: Settings, m: ModelSize, shards: int) -> list[Part]:
    """The update starts by freeing the gradients (zero_grad): at the backward's peak only the head's
    exist, V * H * 4 / W (all of them only at its end, when the activations are gone): the larger of
    the two moments is kept."""
    full = next((p for p in resident if p.name == "actor grads"), None)
    if full is None:
        return resident
    if _micro_batches_per_mini(s) > 1:  # a later micro-batch's backward runs beside the accumulated grads
        part = Part("actor grads (accumulated)", full.bytes, full.formula + ": a mini-batch of "
                    f"{_micro_batches_per_mini(s)} micro-batches accumulates them (measured)")
        return [part if p is full else p for p in resident]
    head = 0 if s.lora_rank > 0 else mp.grad_bytes(m.vocab * m.hidden, shards, False, s.master_bytes)
    if sum(p.bytes for p in update) + head >= full.bytes:
        part = Part("actor grads at the peak", head, f"the head's V x H x {s.master_bytes} B (the others come as "
                    "activations go)")
    else:
        part = Part("actor grads (end of backward)", full.bytes, full.formula)
        update[:] = [Part("activations left", 0, "freed by then")]
    return [part if p is full else p for p in resident]


def _micro_batches_per_mini(s: Settings) -> int:
    """Micro-batches of one mini-batch on one device: its rows, ppo_mini_batch_size x n / (world / sp),
    over the micro-batch's rows (ppo_micro_batch_size_per_gpu, or as many whole sequences as the token
    budget holds)."""
    rows = max(1, s.mini_batch * s.n * s.sp // s.world) if s.mini_batch else s.rows_per_device
    micro = max(1, s.token_budget // s.seq) if s.dynamic else (s.micro_rows or rows)
    return math.ceil(rows / micro)


def _fsdp_backward(s: Settings, m: ModelSize, lora_rank: int, grad_bytes: int = 4) -> list[Part]:
    """FSDP2's backward holds more than the one gathered unit of the forward: the next layer's
    parameters, gathered ahead (backward prefetch), L_p * b, and the unsharded fp32 gradients of two
    layers, the one just computed and the one whose reduce-scatter input is kept until the next,
    2 * g * L_t (L_p, L_t: a layer's parameters, its trainable ones; g: the gradients' bytes, 4 for fp32). Measured on CPU with gloo
    (bench/memory_grid.py): without it two workers' updates came 12-20% under."""
    if not s.fsdp:
        return []
    trainable = mp.lora_params(m, lora_rank) // m.layers if lora_rank > 0 else m.layer_params
    return [Part("FSDP2 backward: a prefetched layer + two layers' unsharded grads",
                 m.layer_params * s.compute_bytes + 2 * grad_bytes * trainable,
                 f"{m.layer_params:,} x {s.compute_bytes} B + 2 x {grad_bytes} B x {trainable:,}")]


def _sp_logits(s: Settings, m: ModelSize, tokens: float) -> list[Part]:
    """Ulysses (sp > 1): every rank gathers the logits of all T packed tokens, T * V * b, before
    keeping the response's (the head runs on each rank's T / sp: T / sp * V * b more)."""
    if s.sp <= 1:
        return []
    return [Part("Ulysses gathered logits", int(tokens * (1 + 1 / s.sp) * m.vocab * s.compute_bytes),
                 f"all {tokens:.0f} tokens x V x {s.compute_bytes} B, gathered over sp {s.sp}")]


def _gib(x: float) -> str:
    return f"{x / mp.GIB:.2f} GiB"


def build_plan(s: Settings, actor: ModelSize, *, device_bytes: int, device_name: str,
               critic: ModelSize | None = None, reward: ModelSize | None = None) -> Plan:
    """The phases of one device and the host figure of one node for settings `s`."""
    if s.cpu:  # offloading to the host moves nothing off a CPU device: the same memory (measured)
        s = replace(s, actor_offload=False, optimizer_offload=False, ref_offload=False, critic_offload=False,
                    rm_offload=False)
    shards = s.world if s.fsdp else 1
    notes: list[str] = []
    problems: list[str] = []
    p_actor = actor.params
    trainable = mp.lora_params(actor, s.lora_rank) if s.lora_rank > 0 else p_actor
    offload = s.actor_offload
    master = "fp32" if s.master_bytes == 4 else "bf16"
    # LoRA adapters stay fp32 over a bf16 base (peft keeps adapter weights in fp32)
    t_bytes, t_dtype = (4, "fp32") if s.lora_rank else (s.master_bytes, master)
    resident = [
        Part("actor weights", mp.weight_bytes(p_actor, s.master_bytes, shards, offload) + mp.weight_bytes(
             trainable if s.lora_rank else 0, 4, shards, offload), f"{master} {p_actor:,} params / {shards}"
             + (" (offloaded)" if offload else "") + (f" + LoRA {trainable:,}" if s.lora_rank else "")),
        Part("actor grads", mp.grad_bytes(trainable, shards, offload, t_bytes),
             f"{t_dtype} {t_bytes} x {trainable:,} / {shards}"),
        Part("actor AdamW", mp.adam_bytes(trainable, shards, offload or s.optimizer_offload, t_bytes),
             f"2 {t_dtype} moments {2 * t_bytes} x {trainable:,} / {shards}"),
    ]
    if s.use_ref:
        resident.append(Part("ref weights", mp.weight_bytes(p_actor, s.compute_bytes, shards, s.ref_offload),
                             f"{s.compute_bytes} x {p_actor:,} / {shards}" + (" (offloaded)" if s.ref_offload else "")))
    if s.critic and critic is not None:
        pc = critic.params - (0 if critic.tied else critic.vocab * critic.hidden) + critic.hidden  # value head
        resident += [Part("critic weights+grads+AdamW", mp.weight_bytes(pc, 4, shards, s.critic_offload)
                          + mp.grad_bytes(pc, shards, s.critic_offload) + mp.adam_bytes(pc, shards, s.critic_offload),
                          f"16 x {pc:,} / {shards}")]
    if s.reward_model and reward is not None:
        rm_bytes = mp.weight_bytes(reward.params, s.compute_bytes, shards, s.rm_offload)
        resident.append(Part("reward model weights", rm_bytes, f"{s.compute_bytes} x {reward.params:,} / {shards}"))
    resident = [p for p in resident if p.bytes]
    # held on the device while any forward runs, beside the resident states: FSDP2's gathered unit, the matmul
    # workspaces, autocast's weight copies
    while_computing = []
    if s.fsdp:
        unit = max(actor.layer_params, actor.vocab * actor.hidden * (1 if actor.tied else 2))
        while_computing = [Part("FSDP2 gathered unit", unit * s.compute_bytes,
                         "the largest unit (the root: embeddings and head, or a layer), unsharded, compute dtype")]
    if not s.cpu:
        while_computing += [Part("cuBLAS workspaces", mp.ACCELERATOR_WORKSPACE_BYTES, "allocated by the first "
                                    "matmul, kept (measured on an H200: bench/results/cuda_check.md)")]
        if not s.fsdp:  # one worker without FSDP2 computes under torch.autocast
            cast = trainable if s.lora_rank else mp.autocast_cast_params(actor)
            while_computing += [Part("autocast weight copies", cast * s.compute_bytes, f"{s.compute_bytes} x "
                                        f"{cast:,}: autocast keeps its cast of every trainable weight a matmul reads")]

    phases: list[Phase] = []
    # rollout
    kv_tok = mp.kv_bytes_per_token(actor, s.tp, s.rollout_bytes)
    if s.kv_pool:
        budget = int(s.gpu_memory_utilization * device_bytes)
        weights = math.ceil(actor.params * s.rollout_bytes / s.tp)
        act = s.max_batched_tokens * (8 * actor.hidden + 2 * actor.intermediate) * 2 + s.max_num_seqs * actor.vocab * 4
        kv = s.kv_cache_bytes if s.kv_cache_bytes else budget - weights - act
        engine = weights + act + kv if s.kv_cache_bytes else budget
        seqs = kv // (kv_tok * s.max_model_len) if kv > 0 else 0
        parts = resident + [Part("vLLM engine", engine, f"gpu_memory_utilization {s.gpu_memory_utilization} x device: "
                                 f"weights {_gib(weights)} + activations {_gib(act)} + KV cache {_gib(max(kv, 0))} "
                                 f"({seqs} sequences of {s.max_model_len} tokens)")]
        phases.append(Phase("rollout", parts, f"KV cache holds {seqs} sequences of max_model_len {s.max_model_len}"))
        if seqs < 1:
            problems.append(f"rollout: the vLLM engine's KV cache ({_gib(max(kv, 0))}) holds no sequence of "
                            f"max_model_len {s.max_model_len} ({_gib(kv_tok * s.max_model_len)} each)")
        if not s.free_cache:
            resident = resident + [Part("vLLM engine (no sleep mode)", engine, "rollout.free_cache_engine=false")]
    else:
        rows = s.train_batch * s.n // max(1, s.world // s.sp)
        hf_tok = mp.kv_bytes_per_token(actor, 1, s.compute_bytes)
        phases.append(Phase("rollout", resident + while_computing + [
            Part("hf KV cache", hf_tok * rows * s.seq, f"{rows} sequences x {s.seq} tokens x {hf_tok} B"),
            Part("sampling logits", 4 * rows * actor.vocab * 2, "2 x fp32 [rows x vocab]")]))
    # old log-probs and ref log-probs
    lp_tokens, lp_logits, how = _micro(s, s.lp_micro_rows, s.dynamic, s.lp_budget)
    infer = [Part("forward (no grad)", mp.inference_bytes(actor, lp_tokens / s.sp, s.compute_bytes), how),
             Part("logits", mp.logits_bytes(lp_logits, actor.vocab, copies=mp.LOGIT_COPIES_INFER, fused=s.fused),
                  "fp32 [Rt x V] x 4")] + _sp_logits(s, actor, lp_tokens)
    phases.append(Phase("old log-probs", resident + while_computing + infer))
    if s.use_ref or s.kl:  # a LoRA actor's reference is itself with the adapters off: no weights of its own
        r_tokens, r_logits, how = _micro(s, s.ref_micro_rows, s.dynamic, s.lp_budget)
        phases.append(Phase("ref log-probs", resident + while_computing + [
            Part("forward (no grad)", mp.inference_bytes(actor, r_tokens / s.sp, s.compute_bytes), how),
            Part("logits", mp.logits_bytes(r_logits, actor.vocab, copies=2, fused=s.fused), "fp32 [Rt x V] x 2"),
            *_sp_logits(s, actor, r_tokens)]))
    # actor update
    tokens, logit_tokens, how = _micro(s, s.micro_rows, s.dynamic, s.token_budget)
    act = mp.activation_bytes(actor, tokens / s.sp, checkpointing=s.checkpointing, remove_padding=s.remove_padding,
                              compute_bytes=s.compute_bytes)
    patches = 0
    if actor.vision and s.max_pixels:
        rows = max(1, s.token_budget // s.seq) if s.dynamic else (s.micro_rows or s.rows_per_device)
        if _shares_prompts(s):  # each distinct prompt's images are encoded once too
            rows = math.ceil(rows / _samples_together(s))
        patches = rows * min(s.max_pixels / actor.vision["patch"] ** 2, s.prompt * actor.vision["merge"] ** 2)
    vis = mp.vision_activation_bytes(actor, patches, checkpointing=s.checkpointing, frozen=s.freeze_vision,
                                     compute_bytes=s.compute_bytes)
    logits = mp.logits_bytes(logit_tokens, actor.vocab, copies=mp.LOGIT_COPIES_TRAIN, fused=s.fused)
    if s.checkpointing:  # one layer's recompute and the logits' backward do not overlap: the larger counts
        saved, _ = mp.checkpointed_split(actor, tokens / s.sp, remove_padding=s.remove_padding,
                                         compute_bytes=s.compute_bytes)
        # a layer's recompute with shared prompts gathers every row's keys and values (its prompt's
        # and its own): as large as without sharing (measured), so it counts rows x (prompt + response)
        full = tokens if not _shares_prompts(s) else _micro(replace(s, n=1), s.micro_rows, s.dynamic,
                                                             s.token_budget)[0]
        _, recompute = mp.checkpointed_split(actor, full / s.sp, remove_padding=s.remove_padding,
                                             compute_bytes=s.compute_bytes)
        act = saved + max(0, recompute - logits)
    update = [Part("activations", act, f"{how}{' / sp ' + str(s.sp) if s.sp > 1 else ''}, "
                   f"checkpointing {'on (layer inputs + a recompute beyond the logits)' if s.checkpointing else 'off'}, "
                   f"{'padding-free' if s.remove_padding else 'padded'}"),
              Part("logits + grads", logits, "fp32 [Rt x V] x 3" + (" (fused: 64 MiB chunks)" if s.fused else ""))]
    update += _sp_logits(s, actor, tokens)
    if vis:
        update.append(Part("vision tower activations", vis, f"{patches:.0f} patches at max_pixels"))
    update += _fsdp_backward(s, actor, s.lora_rank, 4 if s.lora_rank else s.master_bytes)
    phases.append(Phase("actor update", _update_grads(resident, update, s, actor, shards) + while_computing + update))
    if s.critic and critic is not None:
        c_tokens, _, how = _micro(s, s.critic_micro_rows or s.micro_rows, s.critic_dynamic, s.critic_budget)
        critic_parts = [Part("activations", mp.activation_bytes(
            critic, c_tokens, checkpointing=s.critic_checkpointing, remove_padding=False,
            compute_bytes=s.compute_bytes), how), *_fsdp_backward(s, critic, 0)]
        if not (s.cpu or s.fsdp):  # its own autocast copies: every critic weight a matmul reads (not the embeddings)
            casts = pc - critic.vocab * critic.hidden
            critic_parts.insert(0, Part("critic autocast weight copies", s.compute_bytes * casts,
                                        f"{s.compute_bytes} x {casts:,}"))
        phases.append(Phase("critic update", resident + while_computing + critic_parts))
    if s.reward_model and reward is not None:
        rows = s.rm_micro_rows or s.rows_per_device
        phases.append(Phase("reward model", resident + while_computing + [Part("forward (no grad)",
            mp.inference_bytes(reward, rows * s.seq, s.compute_bytes), f"{rows} rows x {s.seq} tokens")]))
    if s.cpu and shards > 1:  # the huggingface/ export gathers the full model into rank 0's memory: the CPU's
        gather = Part("the full model gathered on rank 0", 4 * p_actor, f"fp32 4 x {p_actor:,} for huggingface/ "
                      "(the CPU is the host: measured on two workers)")
    else:
        gather = Part("one gathered tensor", actor.vocab * actor.hidden * 4, "the largest parameter, unsharded, fp32")
    phases.append(Phase("checkpoint save", resident + [gather],
                        "" if s.saves else "trainer.save_freq <= 0: only at the end if asked"))

    # host figure of one node
    local = min(s.gpus_per_node, s.world)
    cpu = s.compute_bytes == 4
    base = mp.CPU_WORKER_BASE_BYTES if cpu else mp.WORKER_BASE_BYTES
    what = (f"{base / mp.GIB:.2f} GiB: Python, torch, transformers, the data (fitted on CPU runs)" if cpu
            else "1 GiB: Python, torch, transformers, the device runtime (not measured)")
    host = [Part("worker processes", local * base, f"{local} x {what}")]
    if local > 1:
        host.append(Part("driver process", base, "the controller: Python, torch, the data, as a worker's base"))
        host.append(Part("Ray's processes", mp.RAY_BYTES, "an estimate (not measured)"))
    if cpu:
        peak = max(p.total for p in phases)
        host.append(Part("the workers' tensors (the CPU is the device)", local * peak, f"{local} x the peak phase"))
        host.append(Part("C allocator's retained blocks", local * mp.cpu_allocator_retained_bytes(peak),
                         f"{local} x {mp.CPU_ALLOCATOR_RETAINED} x the peak phase: freed heap blocks glibc's malloc "
                         "keeps between live ones"))
    if offload:
        host.append(Part("offloaded actor", local * math.ceil(4 * t_bytes * trainable / shards),
                         f"{4 * t_bytes} x P / W per worker (weights, grads, 2 moments)"))
    if s.use_ref and s.ref_offload:
        host.append(Part("offloaded ref", local * math.ceil(s.compute_bytes * p_actor / shards), "b x P / W per worker"))
    if s.kv_pool and s.free_cache:
        host.append(Part("vLLM weights while asleep", local * math.ceil(actor.params * s.rollout_bytes / s.tp),
                         "sleep level 1 keeps the weights in host memory"))
    if s.saves:
        host.append(Part("checkpoint export (rank 0)", 4 * actor.params, "the full fp32 model for huggingface/"))
    rows = s.train_batch * s.n
    host.append(Part("batch in the driver", rows * s.seq * 8 * 6, "token ids, masks, log-probs, advantages (int64/fp32)"))
    if s.compute_bytes == 4:
        notes.append("CPU: float32 compute; the device is this machine's memory, shared by the node's workers")
    else:
        notes.append("accelerator: bf16 compute; activation coefficients measured on CPU (float32), halved")
    return Plan(device_name, device_bytes, phases, host, notes, [], problems)


KNOBS = [  # (override, change of Settings, applies when)
    ("actor_rollout_ref.model.enable_gradient_checkpointing=true", {"checkpointing": True}, lambda s: not s.checkpointing),
    ("actor_rollout_ref.model.use_fused_kernels=true", {"fused": True}, lambda s: not s.fused),
    ("actor_rollout_ref.actor.fsdp_config.param_offload=true optimizer_offload=true",
     {"actor_offload": True, "optimizer_offload": True, "fsdp": True}, lambda s: not s.actor_offload),
    ("actor_rollout_ref.ref.fsdp_config.param_offload=true", {"ref_offload": True, "fsdp": True},
     lambda s: s.use_ref and not s.ref_offload),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=half", "micro", lambda s: not s.dynamic
     and (s.micro_rows or s.rows_per_device) > 1),
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=half", "budget", lambda s: s.dynamic and s.token_budget > s.seq),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=half", "lp_micro",
     lambda s: not s.dynamic and (s.lp_micro_rows or s.rows_per_device) > 1),
    ("actor_rollout_ref.rollout.gpu_memory_utilization=-0.1", "gmu", lambda s: s.kv_pool
     and s.gpu_memory_utilization > 0.15),
    ("actor_rollout_ref.rollout.free_cache_engine=true", {"free_cache": True}, lambda s: s.kv_pool
     and not s.free_cache),
    ("trainer.nnodes=double (twice the devices)", "devices", lambda s: True),
]


def _knob_settings(s: Settings, change) -> tuple[Settings, str]:
    if isinstance(change, dict):
        return replace(s, **change), ""
    if change == "micro":
        rows = max(1, (s.micro_rows or s.rows_per_device) // 2)
        return replace(s, micro_rows=rows), str(rows)
    if change == "budget":
        budget = max(s.seq, s.token_budget // 2)
        return replace(s, token_budget=budget, lp_budget=min(s.lp_budget, budget)), str(budget)
    if change == "lp_micro":
        rows = max(1, (s.lp_micro_rows or s.rows_per_device) // 2)
        return replace(s, lp_micro_rows=rows, ref_micro_rows=rows), str(rows)
    if change == "gmu":
        value = round(s.gpu_memory_utilization - 0.1, 2)
        return replace(s, gpu_memory_utilization=value), str(value)
    nodes = max(1, s.world // max(1, s.gpus_per_node))
    return replace(s, world=s.world * 2, fsdp=True), str(nodes * 2)


def add_knobs(plan: Plan, s: Settings, actor: ModelSize, **models) -> Plan:
    """The knobs that lower the peak, each re-planned: (override, bytes saved at the peak), largest first."""
    found = []
    for override, change, applies in KNOBS:
        if not applies(s):
            continue
        changed, value = _knob_settings(s, change)
        other = build_plan(changed, actor, device_bytes=plan.device_bytes, device_name=plan.device_name, **models)
        saved = plan.peak.total - other.peak.total
        if saved > 0 and not (other.problems and not plan.problems):
            text = override.replace("=half", f"={value}").replace("=-0.1", f"={value}").replace("=double", f"={value}")
            found.append((text, saved))
    plan.knobs = sorted(found, key=lambda k: -k[1])
    return plan


def plan_recipe(rc: RecipeConfig, device_bytes: int, device_name: str, models: dict[str, ModelSize | None],
                accelerator: bool | None = None) -> Plan:
    """The plan of a resolved recipe; `models`: "actor" (required), "critic", "reward" ModelSizes."""
    s = settings_from_recipe(rc, accelerator)
    actor = models["actor"]
    extra = {"critic": models.get("critic") or (actor if s.critic else None), "reward": models.get("reward")}
    plan = build_plan(s, actor, device_bytes=device_bytes, device_name=device_name, **extra)
    if s.reward_model and extra["reward"] is None:
        plan.notes.append("reward model: its config.json is not readable here; not counted")
    return add_knobs(plan, s, actor, **extra)


# ------------------------------------------------------------------------------------------------ inputs
def model_numbers(path: Any) -> ModelSize | None:
    """The ModelSize of a model path: a local folder or a hub id in the local cache (config.json,
    nothing downloaded), a tiny:// model already built in the verl-npu cache, or else a path naming
    a model of the known-shapes table (verl_npu.config.known_models); None otherwise."""
    import json
    import os
    from pathlib import Path

    from verl_npu.config.known_models import known_config
    from verl_npu.config.modelinfo import model_config

    if isinstance(path, str) and path.startswith("tiny://"):
        name, _, query = path[len("tiny://"):].partition("?")
        root = Path(os.environ.get("VERL_NPU_CACHE") or Path.home() / ".cache" / "verl_npu").expanduser() / "tiny"
        builds = []
        for marker in root.glob(f"{name.strip('/')}-*/verl_npu_tiny.json"):
            try:
                # any seed's build will do: a seed changes the weights, never the shapes the plan reads
                if str(json.loads(marker.read_text()).get("uri", "")).partition("?")[0] == path.partition("?")[0]:
                    builds.append(marker.parent)
            except (OSError, ValueError):
                continue
        if not builds:
            return None
        path = str(max(builds, key=lambda p: p.stat().st_mtime))
    conf = model_config(path)
    if conf is None:
        known = known_config(path)
        conf = known[1] if known else None
    return mp.model_size(conf)


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 1 << 10, "m": 10**6, "mb": 10**6, "mib": 1 << 20,
          "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tb": 10**12, "tib": 1 << 40}


def parse_device_memory(text: str) -> tuple[int, str, bool | None]:
    """(bytes, name, an accelerator? (None: unknown)) of --device-memory: an amount ("64GiB", "80GB",
    "65536MiB"; a bare number is GiB) or a known accelerator ("910B", "H100", "A100-40": verl_npu.device.DEVICE_MEMORY_GIB)."""
    import re

    from verl_npu.device import DEVICE_MEMORY_GIB
    from verl_npu.errors import UserError

    known = {k.lower(): (k, v) for k, v in DEVICE_MEMORY_GIB.items()}
    key = text.strip().lower().removeprefix("ascend")
    if key in known:
        name, gib = known[key]
        return gib << 30, f"{name} ({gib} GiB)", True
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", key)
    if not m or m.group(2) not in _UNITS:
        raise UserError(f"--device-memory {text!r} is not an amount or a known device; write e.g. 64GiB, 80GB, "
                        f"or one of {', '.join(DEVICE_MEMORY_GIB)}")
    scale = _UNITS[m.group(2)] if m.group(2) else 1 << 30
    value = int(float(m.group(1)) * scale)
    return value, f"{value / mp.GIB:.1f} GiB (--device-memory)", None


def _plans_accelerator(requested) -> bool:
    """trainer.device names an accelerator, or is auto (the plan is for the accelerator the recipe is
    written for, even on a machine without one)."""
    from verl_npu.device import configured_device

    if requested in (None, "", "auto"):
        return True
    device = configured_device(requested)
    return device is not None and device.kind != "cpu"


def device_memory(rc: RecipeConfig, spec: str | None = None) -> tuple[int, str, bool]:
    """(bytes, name, an accelerator?) of the device the plan is for: --device-memory when given; on CPU this machine's
    memory shared by the node's workers; on an accelerator the kind's usual card (device layer table)."""
    from verl_npu.device import DEFAULT_ACCELERATOR, DEVICE_MEMORY_GIB, configured_device, host_memory_bytes

    if spec:
        size, name, card = parse_device_memory(spec)
        return size, name, _plans_accelerator(rc.backend.trainer.device) if card is None else card
    requested = rc.backend.trainer.device
    device = configured_device(requested)
    kind = device.kind if device is not None else "cpu"
    if kind == "cpu" and requested in (None, "", "auto"):
        name = DEFAULT_ACCELERATOR["npu"]  # no accelerator here: plan for the one the recipe is written for
        return DEVICE_MEMORY_GIB[name] << 30, (f"{name} ({DEVICE_MEMORY_GIB[name]} GiB, assumed: trainer.device is "
                                               "auto and this machine has no accelerator; --device-memory to change)"), True
    if kind == "cpu":
        workers = max(1, min(int(rc.backend.trainer.n_gpus_per_node), rc.world_size))
        total = host_memory_bytes()
        return total // workers, f"CPU: this machine's {total / mp.GIB:.1f} GiB / {workers} worker(s)", False
    name = DEFAULT_ACCELERATOR[kind]
    return DEVICE_MEMORY_GIB[name] << 30, f"{name} ({DEVICE_MEMORY_GIB[name]} GiB, assumed for {kind}; " \
        "--device-memory to change)", True


def plan_for(rc: RecipeConfig, spec: str | None = None) -> tuple[Plan | None, str]:
    """The plan of a resolved recipe on its device, or (None, why not) when the model's numbers are unknown."""
    b = rc.backend
    actor = model_numbers(b.actor_rollout_ref.model.path)
    if actor is None:
        return None, (f"model numbers unknown: actor_rollout_ref.model.path={b.actor_rollout_ref.model.path} has no "
                      "readable config.json here (a local folder, a hub id in the local cache, or a built tiny model)")
    critic_path = b.critic.model.get("path")
    models = {"actor": actor, "critic": model_numbers(critic_path) if critic_path else None,
              "reward": model_numbers(b.reward_model.model.path) if b.reward_model.enable else None}
    size, name, accelerator = device_memory(rc, spec)
    plan = plan_recipe(rc, size, name, models, accelerator)
    plan.device_assumed = not spec and accelerator
    plan.notes += _known_shape_notes(b)
    return plan, ""


def _known_shape_notes(b) -> list[str]:
    """A note for every role whose numbers came from the known-shapes table, not a config.json."""
    from verl_npu.config.known_models import known_config
    from verl_npu.config.modelinfo import model_config

    notes = []
    for role, path in (("actor", b.actor_rollout_ref.model.path), ("critic", b.critic.model.get("path"))):
        if isinstance(path, str) and not path.startswith("tiny://") and model_config(path) is None:
            known = known_config(path)
            if known:
                notes.append(f"{role} model: no config.json readable at {path}; planned with the known shapes of "
                             f"{known[0]} (verl_npu/config/known_models.py)")
    return notes


def summary_line(plan: Plan) -> str:
    """One line: the peak phase, its total against the device, the verdict."""
    peak = plan.peak
    head = f"memory plan: {_gib(peak.total)} of {_gib(plan.device_bytes)} per device at the {peak.name}"
    if plan.verdict == "will not fit":
        worst = max(peak.parts, key=lambda p: p.bytes)
        why = plan.problems[0] if plan.problems else f"largest part: {worst.name} {_gib(worst.bytes)}"
        return f"{head}: will not fit ({why}); see verl-npu plan"
    return f"{head}: {plan.verdict}"
