"""A recipe's memory plan: what each phase holds on one device, the host figure, the knobs.

`build_plan` puts the parts of `verl_npu.memory.plan` together per phase for the recipe's `Settings`
(`verl_npu.memory.settings`); `plan_recipe(rc, device_bytes, models)` does both and adds the knobs: each is a
change of one or two keys, planned again, with the bytes it saves at the peak. `verl_npu.memory.budget` finds
the device memory and the model sizes the CLI plans with. Imports no torch (validate stays instant); see
docs/memory.md.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from verl_npu.memory import plan as mp
from verl_npu.memory.plan import ModelSize, Part, Phase, Plan
from verl_npu.memory.settings import Settings, settings_from_recipe, settings_from_sft

if TYPE_CHECKING:
    from verl_npu.config import RecipeConfig
    from verl_npu.config.sft import SFTRecipe


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
        return (
            math.ceil(rows / _samples_together(s)) * s.prompt + rows * s.response,
            logits,
            how + ", each prompt once",
        )
    return rows * s.seq, logits, how


def _update_grads(resident: list[Part], update: list[Part], s: Settings, m: ModelSize, shards: int) -> list[Part]:
    """The update starts by freeing the gradients (zero_grad): at the backward's peak only the head's
    exist, V * H * 4 / W (all of them only at its end, when the activations are gone): the larger of
    the two moments is kept."""
    role = _role(s)
    full = next((p for p in resident if p.name == f"{role} grads"), None)
    if full is None:
        return resident
    if _micro_batches_per_mini(s) > 1:  # a later micro-batch's backward runs beside the accumulated grads
        part = Part(
            f"{role} grads (accumulated)",
            full.bytes,
            full.formula + f": a mini-batch of {_micro_batches_per_mini(s)} micro-batches accumulates them (measured)",
        )
        return [part if p is full else p for p in resident]
    head = 0 if s.lora_rank > 0 else mp.grad_bytes(m.vocab * m.hidden, shards, False, s.master_bytes)
    if sum(p.bytes for p in update) + head >= full.bytes:
        part = Part(
            f"{role} grads at the peak",
            head,
            f"the head's V x H x {s.master_bytes} B (the others come as activations go)",
        )
    else:
        part = Part(f"{role} grads (end of backward)", full.bytes, full.formula)
        update[:] = [Part("activations left", 0, "freed by then")]
    return [part if p is full else p for p in resident]


def _role(s: Settings) -> str:
    """The trained model's name in the plan's parts: the actor of an RL recipe, the model of an SFT one."""
    return "model" if s.sft else "actor"


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
    return [
        Part(
            "FSDP2 backward: a prefetched layer + two layers' unsharded grads",
            m.layer_params * s.compute_bytes + 2 * grad_bytes * trainable,
            f"{m.layer_params:,} x {s.compute_bytes} B + 2 x {grad_bytes} B x {trainable:,}",
        )
    ]


def _sp_logits(s: Settings, m: ModelSize, tokens: float) -> list[Part]:
    """Ulysses (sp > 1): every rank gathers the logits of all T packed tokens, T * V * b, before
    keeping the response's (the head runs on each rank's T / sp: T / sp * V * b more)."""
    if s.sp <= 1:
        return []
    return [
        Part(
            "Ulysses gathered logits",
            int(tokens * (1 + 1 / s.sp) * m.vocab * s.compute_bytes),
            f"all {tokens:.0f} tokens x V x {s.compute_bytes} B, gathered over sp {s.sp}",
        )
    ]


def _scoring_parts(s: Settings, model: ModelSize, fused: bool, logits_formula: str, ulysses: bool) -> list[Part]:
    """A frozen model's no-grad forward over the reference policy's micro-batch: the forward and its fp32 logits
    twice; `ulysses`: also the logits Ulysses gathers (`_sp_logits`)."""
    tokens, logit_tokens, how = _micro(s, s.ref_micro_rows, s.dynamic, s.lp_budget)
    return [
        Part("forward (no grad)", mp.inference_bytes(model, tokens / s.sp, s.compute_bytes), how),
        Part("logits", mp.logits_bytes(logit_tokens, model.vocab, copies=2, fused=fused), logits_formula),
        *(_sp_logits(s, model, tokens) if ulysses else []),
    ]


def gib_text(x: float) -> str:
    return f"{x / mp.GIB:.2f} GiB"


def _generation_and_scoring(
    s: Settings,
    actor: ModelSize,
    resident: list[Part],
    while_computing: list[Part],
    *,
    device_bytes: int,
    problems: list[str],
    teacher: ModelSize | None,
) -> tuple[list[Phase], list[Part]]:
    """An RL step's phases before the update: the rollout (on the trainer's devices, or separate_async's own), the
    old log-probs, and the reference's and the teacher's log-probs when the recipe has them; and the resident parts
    from then on (a vLLM engine without sleep mode stays). Appends to `problems` what cannot work."""
    phases: list[Phase] = []
    kv_tok = mp.kv_bytes_per_token(actor, s.tp, s.rollout_bytes)
    if s.rollout_processes and not s.kv_pool:  # separate_async: generation on the rollout processes' devices
        phases.append(_rollout_device_phase(s, actor))
    elif s.kv_pool:
        budget = int(s.gpu_memory_utilization * device_bytes)
        weights = math.ceil(actor.params * s.rollout_bytes / s.tp)
        act = s.max_batched_tokens * (8 * actor.hidden + 2 * actor.intermediate) * 2 + s.max_num_seqs * actor.vocab * 4
        kv = s.kv_cache_bytes if s.kv_cache_bytes else budget - weights - act
        engine = weights + act + kv if s.kv_cache_bytes else budget
        seqs = kv // (kv_tok * s.max_model_len) if kv > 0 else 0
        parts = resident + [
            Part(
                "vLLM engine",
                engine,
                f"gpu_memory_utilization {s.gpu_memory_utilization} x device: "
                f"weights {gib_text(weights)} + activations {gib_text(act)} + KV cache {gib_text(max(kv, 0))} "
                f"({seqs} sequences of {s.max_model_len} tokens)",
            )
        ]
        phases.append(Phase("rollout", parts, f"KV cache holds {seqs} sequences of max_model_len {s.max_model_len}"))
        if seqs < 1:
            problems.append(
                f"rollout: the vLLM engine's KV cache ({gib_text(max(kv, 0))}) holds no sequence of "
                f"max_model_len {s.max_model_len} ({gib_text(kv_tok * s.max_model_len)} each)"
            )
        if not s.free_cache:
            resident = resident + [Part("vLLM engine (no sleep mode)", engine, "rollout.free_cache_engine=false")]
    else:
        rows = s.train_batch * s.n // max(1, s.world // s.sp)
        hf_tok = mp.kv_bytes_per_token(actor, 1, s.compute_bytes)
        phases.append(
            Phase(
                "rollout",
                resident
                + while_computing
                + [
                    Part("hf KV cache", hf_tok * rows * s.seq, f"{rows} sequences x {s.seq} tokens x {hf_tok} B"),
                    Part("sampling logits", 4 * rows * actor.vocab * 2, "2 x fp32 [rows x vocab]"),
                ],
            )
        )
    # old log-probs and ref log-probs
    lp_tokens, lp_logits, how = _micro(s, s.lp_micro_rows, s.dynamic, s.lp_budget)
    infer = [
        Part("forward (no grad)", mp.inference_bytes(actor, lp_tokens / s.sp, s.compute_bytes), how),
        Part(
            "logits",
            mp.logits_bytes(lp_logits, actor.vocab, copies=mp.LOGIT_COPIES_INFER, fused=s.fused),
            "fp32 [Rt x V] x 4",
        ),
    ] + _sp_logits(s, actor, lp_tokens)
    phases.append(Phase("old log-probs", resident + while_computing + infer))
    if s.use_ref or s.kl:  # a LoRA actor's reference is itself with the adapters off: no weights of its own
        phases.append(
            Phase(
                "ref log-probs",
                resident + while_computing + _scoring_parts(s, actor, s.fused, "fp32 [Rt x V] x 2", True),
            )
        )
    if s.teacher and teacher is not None:  # the teacher scores the responses with the ref's micro-batches
        parts = _scoring_parts(s, teacher, False, "fp32 [Rt x V] x 2 (log-softmax, then its top-k)", False)
        phases.append(Phase("teacher log-probs", resident + while_computing + parts))
    return phases, resident


def build_plan(
    s: Settings,
    actor: ModelSize,
    *,
    device_bytes: int,
    device_name: str,
    critic: ModelSize | None = None,
    reward: ModelSize | None = None,
    teacher: ModelSize | None = None,
) -> Plan:
    """The phases of one device and the host figure of one node for settings `s`."""
    if s.cpu:  # offloading to the host moves nothing off a CPU device: the same memory (measured)
        s = replace(
            s, actor_offload=False, optimizer_offload=False, ref_offload=False, critic_offload=False, rm_offload=False
        )
    shards = s.world if s.fsdp else 1
    notes: list[str] = []
    problems: list[str] = []
    p_actor = actor.params
    trainable = mp.lora_params(actor, s.lora_rank) if s.lora_rank > 0 else p_actor
    offload = s.actor_offload
    master = "fp32" if s.master_bytes == 4 else "bf16"
    # LoRA adapters stay fp32 over a bf16 base (peft keeps adapter weights in fp32)
    t_bytes, t_dtype = (4, "fp32") if s.lora_rank else (s.master_bytes, master)
    role = _role(s)
    resident = [
        Part(
            f"{role} weights",
            mp.weight_bytes(p_actor, s.master_bytes, shards, offload)
            + mp.weight_bytes(trainable if s.lora_rank else 0, 4, shards, offload),
            f"{master} {p_actor:,} params / {shards}"
            + (" (offloaded)" if offload else "")
            + (f" + LoRA {trainable:,}" if s.lora_rank else ""),
        ),
        Part(
            f"{role} grads",
            mp.grad_bytes(trainable, shards, offload, t_bytes),
            f"{t_dtype} {t_bytes} x {trainable:,} / {shards}",
        ),
        Part(
            f"{role} AdamW",
            mp.adam_bytes(trainable, shards, offload or s.optimizer_offload, t_bytes),
            f"2 {t_dtype} moments {2 * t_bytes} x {trainable:,} / {shards}",
        ),
    ]
    if s.use_ref:
        resident.append(
            Part(
                "ref weights",
                mp.weight_bytes(p_actor, s.compute_bytes, shards, s.ref_offload),
                f"{s.compute_bytes} x {p_actor:,} / {shards}" + (" (offloaded)" if s.ref_offload else ""),
            )
        )
    if s.critic and critic is not None:
        pc = critic.params - (0 if critic.tied else critic.vocab * critic.hidden) + critic.hidden  # value head
        resident += [
            Part(
                "critic weights+grads+AdamW",
                mp.weight_bytes(pc, 4, shards, s.critic_offload)
                + mp.grad_bytes(pc, shards, s.critic_offload)
                + mp.adam_bytes(pc, shards, s.critic_offload),
                f"16 x {pc:,} / {shards}",
            )
        ]
    if s.reward_model and reward is not None:
        rm_bytes = mp.weight_bytes(reward.params, s.compute_bytes, shards, s.rm_offload)
        resident.append(Part("reward model weights", rm_bytes, f"{s.compute_bytes} x {reward.params:,} / {shards}"))
    if s.teacher and teacher is not None:  # frozen, in the compute dtype, sharded like the reference policy
        t_weights = mp.weight_bytes(teacher.params, s.compute_bytes, shards, s.ref_offload)
        resident.append(
            Part(
                "teacher weights",
                t_weights,
                f"{s.compute_bytes} x {teacher.params:,} / {shards}" + (" (offloaded)" if s.ref_offload else ""),
            )
        )
    resident = [p for p in resident if p.bytes]
    # held on the device while any forward runs, beside the resident states: FSDP2's gathered unit, the matmul
    # workspaces, autocast's weight copies
    while_computing = []
    if s.fsdp:
        unit = max(actor.layer_params, actor.vocab * actor.hidden * (1 if actor.tied else 2))
        while_computing = [
            Part(
                "FSDP2 gathered unit",
                unit * s.compute_bytes,
                "the largest unit (the root: embeddings and head, or a layer), unsharded, compute dtype",
            )
        ]
    if not s.cpu:
        while_computing += [
            Part(
                "cuBLAS workspaces",
                mp.ACCELERATOR_WORKSPACE_BYTES,
                "allocated by the first matmul, kept (measured on an H200: bench/results/cuda_check.md)",
            )
        ]
        if not s.fsdp:  # one worker without FSDP2 computes under torch.autocast
            cast = trainable if s.lora_rank else mp.autocast_cast_params(actor)
            while_computing += [
                Part(
                    "autocast weight copies",
                    cast * s.compute_bytes,
                    f"{s.compute_bytes} x {cast:,}: autocast keeps its cast of every trainable weight a matmul reads",
                )
            ]

    phases: list[Phase] = []
    if not s.sft:
        generation, resident = _generation_and_scoring(
            s, actor, resident, while_computing, device_bytes=device_bytes, problems=problems, teacher=teacher
        )
        phases += generation
    # actor update
    tokens, logit_tokens, how = _micro(s, s.micro_rows, s.dynamic, s.token_budget)
    act = mp.activation_bytes(
        actor,
        tokens / s.sp,
        checkpointing=s.checkpointing,
        remove_padding=s.remove_padding,
        compute_bytes=s.compute_bytes,
    )
    patches = 0
    if actor.vision and s.max_pixels:
        rows = max(1, s.token_budget // s.seq) if s.dynamic else (s.micro_rows or s.rows_per_device)
        if _shares_prompts(s):  # each distinct prompt's images are encoded once too
            rows = math.ceil(rows / _samples_together(s))
        patches = rows * min(s.max_pixels / actor.vision["patch"] ** 2, s.prompt * actor.vision["merge"] ** 2)
    vis = mp.vision_activation_bytes(
        actor, patches, checkpointing=s.checkpointing, frozen=s.freeze_vision, compute_bytes=s.compute_bytes
    )
    logits = mp.logits_bytes(logit_tokens, actor.vocab, copies=mp.LOGIT_COPIES_TRAIN, fused=s.fused)
    if s.checkpointing:  # one layer's recompute and the logits' backward do not overlap: the larger counts
        saved, _ = mp.checkpointed_split(
            actor, tokens / s.sp, remove_padding=s.remove_padding, compute_bytes=s.compute_bytes
        )
        # a layer's recompute with shared prompts gathers every row's keys and values (its prompt's
        # and its own): as large as without sharing (measured), so it counts rows x (prompt + response)
        full = tokens if not _shares_prompts(s) else _micro(replace(s, n=1), s.micro_rows, s.dynamic, s.token_budget)[0]
        _, recompute = mp.checkpointed_split(
            actor, full / s.sp, remove_padding=s.remove_padding, compute_bytes=s.compute_bytes
        )
        act = saved + max(0, recompute - logits)
    update = [
        Part(
            "activations",
            act,
            f"{how}{' / sp ' + str(s.sp) if s.sp > 1 else ''}, "
            f"checkpointing {'on (layer inputs + a recompute beyond the logits)' if s.checkpointing else 'off'}, "
            f"{'padding-free' if s.remove_padding else 'padded'}",
        ),
        Part("logits + grads", logits, "fp32 [Rt x V] x 3" + (" (fused: 64 MiB chunks)" if s.fused else "")),
    ]
    update += _sp_logits(s, actor, tokens)
    if vis:
        update.append(Part("vision tower activations", vis, f"{patches:.0f} patches at max_pixels"))
    update += _fsdp_backward(s, actor, s.lora_rank, 4 if s.lora_rank else s.master_bytes)
    phases.append(Phase(f"{role} update", _update_grads(resident, update, s, actor, shards) + while_computing + update))
    if s.critic and critic is not None:
        c_tokens, _, how = _micro(s, s.critic_micro_rows or s.micro_rows, s.critic_dynamic, s.critic_budget)
        critic_parts = [
            Part(
                "activations",
                mp.activation_bytes(
                    critic,
                    c_tokens,
                    checkpointing=s.critic_checkpointing,
                    remove_padding=False,
                    compute_bytes=s.compute_bytes,
                ),
                how,
            ),
            *_fsdp_backward(s, critic, 0),
        ]
        if not (s.cpu or s.fsdp):  # its own autocast copies: every critic weight a matmul reads (not the embeddings)
            casts = pc - critic.vocab * critic.hidden
            critic_parts.insert(
                0, Part("critic autocast weight copies", s.compute_bytes * casts, f"{s.compute_bytes} x {casts:,}")
            )
        phases.append(Phase("critic update", resident + while_computing + critic_parts))
    if s.reward_model and reward is not None:
        rows = s.rm_micro_rows or s.rows_per_device
        phases.append(
            Phase(
                "reward model",
                resident
                + while_computing
                + [
                    Part(
                        "forward (no grad)",
                        mp.inference_bytes(reward, rows * s.seq, s.compute_bytes),
                        f"{rows} rows x {s.seq} tokens",
                    )
                ],
            )
        )
    if s.cpu and shards > 1:  # the huggingface/ export gathers the full model into rank 0's memory: the CPU's
        gather = Part(
            "the full model gathered on rank 0",
            4 * p_actor,
            f"fp32 4 x {p_actor:,} for huggingface/ (the CPU is the host: measured on two workers)",
        )
    else:
        gather = Part("one gathered tensor", actor.vocab * actor.hidden * 4, "the largest parameter, unsharded, fp32")
    phases.append(
        Phase(
            "checkpoint save",
            resident + [gather],
            "" if s.saves else "trainer.save_freq <= 0: only at the end if asked",
        )
    )

    # host figure of one node
    local = min(s.gpus_per_node, s.world)
    cpu = s.compute_bytes == 4
    base = mp.CPU_WORKER_BASE_BYTES if cpu else mp.WORKER_BASE_BYTES
    what = (
        f"{base / mp.GIB:.2f} GiB: Python, torch, transformers, the data (fitted on CPU runs)"
        if cpu
        else "1 GiB: Python, torch, transformers, the device runtime (not measured)"
    )
    host = [Part("worker processes", local * base, f"{local} x {what}")]
    if local > 1:
        host.append(Part("driver process", base, "the controller: Python, torch, the data, as a worker's base"))
        if not s.sft:  # SFT's ranks are processes spawned by the launching one, no Ray
            host.append(Part("Ray's processes", mp.RAY_BYTES, "an estimate (not measured)"))
    if s.rollout_processes:
        host += _rollout_host_parts(s, actor, phases, base)
    if cpu:
        peak = max(p.total for p in phases if p.name != ROLLOUT_DEVICE)
        host.append(Part("the workers' tensors (the CPU is the device)", local * peak, f"{local} x the peak phase"))
        host.append(
            Part(
                "C allocator's retained blocks",
                local * mp.cpu_allocator_retained_bytes(peak),
                f"{local} x {mp.CPU_ALLOCATOR_RETAINED} x the peak phase: freed heap blocks glibc's malloc "
                "keeps between live ones",
            )
        )
    if offload:
        host.append(
            Part(
                "offloaded actor",
                local * math.ceil(4 * t_bytes * trainable / shards),
                f"{4 * t_bytes} x P / W per worker (weights, grads, 2 moments)",
            )
        )
    if s.use_ref and s.ref_offload:
        host.append(
            Part("offloaded ref", local * math.ceil(s.compute_bytes * p_actor / shards), "b x P / W per worker")
        )
    if s.teacher and teacher is not None and s.ref_offload:
        host.append(
            Part(
                "offloaded teacher",
                local * math.ceil(s.compute_bytes * teacher.params / shards),
                "b x P_teacher / W per worker",
            )
        )
    if s.kv_pool and s.free_cache:
        host.append(
            Part(
                "vLLM weights while asleep",
                local * math.ceil(actor.params * s.rollout_bytes / s.tp),
                "sleep level 1 keeps the weights in host memory",
            )
        )
    if s.saves:
        host.append(Part("checkpoint export (rank 0)", 4 * actor.params, "the full fp32 model for huggingface/"))
    rows = s.train_batch * s.n
    if s.sft:
        host.append(Part("a step's conversations", rows * s.seq * 8 * 3, "token ids, loss masks, positions (int64)"))
    else:
        host.append(
            Part("batch in the driver", rows * s.seq * 8 * 6, "token ids, masks, log-probs, advantages (int64/fp32)")
        )
    if s.compute_bytes == 4:
        notes.append("CPU: float32 compute; the device is this machine's memory, shared by the node's workers")
    else:
        notes.append("accelerator: bf16 compute; activation coefficients measured on CPU (float32), halved")
    return Plan(device_name, device_bytes, phases, host, notes, [], problems)


ROLLOUT_DEVICE = "rollout device (separate_async)"


def _rollout_device_phase(s: Settings, actor: ModelSize) -> Phase:
    """What one separate_async rollout process holds on its device while it generates: its own fp32 copy of the
    policy (weights only: no gradients, no optimizer), autocast's casts on an accelerator, the hf engine's KV cache
    and sampling logits for its share of a step's responses. The trainer's devices then hold no rollout phase."""
    rows = math.ceil(s.train_batch * s.n / s.rollout_processes)
    hf_tok = mp.kv_bytes_per_token(actor, 1, s.compute_bytes)
    parts = [Part("rollout model copy", 4 * actor.params, f"fp32 4 x {actor.params:,} (weights only)")]
    if not s.cpu:
        cast = mp.autocast_cast_params(actor)
        parts += [
            Part("autocast weight copies", cast * s.compute_bytes, f"{s.compute_bytes} x {cast:,}"),
            Part("cuBLAS workspaces", mp.ACCELERATOR_WORKSPACE_BYTES, "as a trainer worker's"),
        ]
    parts += [
        Part(
            "hf KV cache",
            hf_tok * rows * s.seq,
            f"{rows} sequences x {s.seq} tokens x {hf_tok} B (train_batch x n / {s.rollout_processes} processes)",
        ),
        Part("sampling logits", 4 * rows * actor.vocab * 2, "2 x fp32 [rows x vocab]"),
    ]
    return Phase(
        ROLLOUT_DEVICE,
        parts,
        f"each of the {s.rollout_processes} rollout process(es), on a device of its "
        f"own when the node has {s.gpus_per_node} + {s.rollout_processes} devices; with fewer they share the "
        "trainer's: add this phase to the trainer's peak",
    )


def _rollout_host_parts(s: Settings, actor: ModelSize, phases: list[Phase], base: int) -> list[Part]:
    """separate_async's host memory beside the trainer's: the rollout processes themselves (and, on the CPU, their
    tensors) and the controller's CPU copy of the gathered weights being pushed to them."""
    parts = [
        Part("rollout processes", s.rollout_processes * base, f"{s.rollout_processes} x a worker's base"),
        Part("weights being pushed", 4 * actor.params, "the gathered fp32 weights, one copy in the controller"),
    ]
    if s.cpu:
        rollout = next(p for p in phases if p.name == ROLLOUT_DEVICE)
        parts.append(
            Part(
                "the rollout processes' tensors",
                s.rollout_processes * rollout.total,
                f"{s.rollout_processes} x the rollout device phase",
            )
        )
    return parts


KNOBS = [  # (override, change of Settings, applies when)
    (
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        {"checkpointing": True},
        lambda s: not s.checkpointing,
    ),
    ("actor_rollout_ref.model.use_fused_kernels=true", {"fused": True}, lambda s: not s.fused),
    (
        "actor_rollout_ref.actor.fsdp_config.param_offload=true optimizer_offload=true",
        {"actor_offload": True, "optimizer_offload": True, "fsdp": True},
        lambda s: not s.actor_offload,
    ),
    (
        "actor_rollout_ref.ref.fsdp_config.param_offload=true",
        {"ref_offload": True, "fsdp": True},
        lambda s: s.use_ref and not s.ref_offload,
    ),
    (
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=half",
        "micro",
        lambda s: not s.dynamic and (s.micro_rows or s.rows_per_device) > 1,
    ),
    (
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=half",
        "budget",
        lambda s: s.dynamic and s.token_budget > s.seq,
    ),
    (
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=half",
        "lp_micro",
        lambda s: not s.dynamic and (s.lp_micro_rows or s.rows_per_device) > 1,
    ),
    (
        "actor_rollout_ref.rollout.gpu_memory_utilization=-0.1",
        "gmu",
        lambda s: s.kv_pool and s.gpu_memory_utilization > 0.15,
    ),
    (
        "actor_rollout_ref.rollout.free_cache_engine=true",
        {"free_cache": True},
        lambda s: s.kv_pool and not s.free_cache,
    ),
    ("trainer.nnodes=double (twice the devices)", "devices", lambda s: True),
]


SFT_KNOBS = [  # the same changes in an SFT recipe's keys
    ("model.enable_gradient_checkpointing=true", {"checkpointing": True}, lambda s: not s.checkpointing),
    (
        "engine.param_offload=true",
        {"actor_offload": True, "optimizer_offload": True, "fsdp": True},
        lambda s: not s.actor_offload,
    ),
    ("data.micro_batch_size_per_gpu=half", "micro", lambda s: not s.dynamic and (s.micro_rows or 1) > 1),
    ("data.max_token_len_per_gpu=half", "budget", lambda s: s.dynamic and s.token_budget > s.seq),
    # SFT's token budgets run on one worker only
    ("trainer.n_gpus_per_node=double (twice the devices)", "devices", lambda s: not s.dynamic),
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
    if s.sft:  # one node: twice the node's devices
        return replace(s, world=s.world * 2, gpus_per_node=s.gpus_per_node * 2, fsdp=True), str(s.gpus_per_node * 2)
    nodes = max(1, s.world // max(1, s.gpus_per_node))
    return replace(s, world=s.world * 2, fsdp=True), str(nodes * 2)


def add_knobs(plan: Plan, s: Settings, actor: ModelSize, **models) -> Plan:
    """The knobs that lower the peak, each re-planned: (override, bytes saved at the peak), largest first."""
    found = []
    for override, change, applies in SFT_KNOBS if s.sft else KNOBS:
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


def plan_recipe(
    rc: RecipeConfig,
    device_bytes: int,
    device_name: str,
    models: dict[str, ModelSize | None],
    accelerator: bool | None = None,
) -> Plan:
    """The plan of a resolved recipe; `models`: "actor" (required), "critic", "reward", "teacher" ModelSizes."""
    s = settings_from_recipe(rc, accelerator)
    actor = models["actor"]
    extra = {
        "critic": models.get("critic") or (actor if s.critic else None),
        "reward": models.get("reward"),
        "teacher": models.get("teacher"),
    }
    plan = build_plan(s, actor, device_bytes=device_bytes, device_name=device_name, **extra)
    if s.reward_model and extra["reward"] is None:
        plan.notes.append("reward model: its config.json is not readable here; not counted")
    if s.teacher and extra["teacher"] is None:
        plan.notes.append("distillation teacher: its config.json is not readable here; not counted")
    return add_knobs(plan, s, actor, **extra)


def plan_sft(
    rc: SFTRecipe, device_bytes: int, device_name: str, model: ModelSize, accelerator: bool | None = None
) -> Plan:
    """The plan of a loaded SFT recipe (`settings_from_sft`): the model's update and the checkpoint save, the host
    figure, and the knobs in the SFT recipe's keys."""
    s = settings_from_sft(rc, accelerator)
    plan = build_plan(s, model, device_bytes=device_bytes, device_name=device_name)
    plan.notes.append(
        "SFT: each micro-batch planned at its most tokens (rows x data.max_length, or the token budget); "
        "every position's logits are counted"
    )
    return add_knobs(plan, s, model)
