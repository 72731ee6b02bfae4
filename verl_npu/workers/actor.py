"""The actor/rollout/reference worker: everything that touches model weights on one device.

One worker runs per device (rank). The controller never sees weights; it sends batches and
gets back tensors and metrics through a worker group. The worker holds:
- the policy (actor) module with its optimizer and LR schedule,
- the reference module, loaded only when a KL term needs it (actor KL loss or KL in reward),
- the rollout engine, built by name from the registry in `verl_npu.rollout` (`hf` samples from
  the actor module itself; `vllm` holds its own copy of the weights, refreshed in memory after
  every update).
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch

from verl_npu import algorithms
from verl_npu.batch import Batch
from verl_npu.device import detect_device
from verl_npu.errors import UserError
from verl_npu.models import lora
from verl_npu.models.forward import response_log_probs
from verl_npu.models.loading import load_policy_model, load_tokenizer_and_processor
from verl_npu.optim import build_lr_scheduler, build_optimizer
from verl_npu.rollout.base import RolloutEngine, SamplingParams
from verl_npu.workers import parallel
from verl_npu.workers.micro import micro_batch_indices, trim_left_padding

log = logging.getLogger("verl_npu")


def needs_reference(cfg) -> bool:
    """The reference policy is loaded only when some KL term uses it."""
    return bool(cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward)


#: tokens per chunk of the entropy computation with actor.entropy_from_logits_with_chunking (verl uses 2048)
ENTROPY_CHUNK = 2048


def _active_dropout(module) -> list[str]:
    """Dropout that makes a train-mode forward differ from an eval-mode one: `nn.Dropout` modules
    with p > 0 and config fields named `*dropout*` above 0 (attention dropout is a config value in
    transformers, not a module), in the model config and its sub-configs."""
    found = [f"{name} (p={m.p})" for name, m in module.named_modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    configs = [("config", getattr(module, "config", None))]
    while configs:
        prefix, cfg = configs.pop()
        if cfg is None:
            continue
        for key, value in vars(cfg).items():
            if hasattr(value, "to_dict") and hasattr(value, "model_type"):
                configs.append((f"{prefix}.{key}", value))
            elif "dropout" in key and isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                found.append(f"{prefix}.{key}={value}")
    return found


def old_log_prob_pass_needed(cfg, module) -> list[str]:
    """Why the separate old-log-prob forward must run; empty when it is provably redundant.

    It is redundant exactly when the old log-probs equal what the update's own (single) forward
    computes: the responses were sampled from the actor's current module (`hf` rollout: no other
    copy of the weights, no other kernels or dtype), the update is one epoch of one mini-batch (so
    that forward runs on the very weights that sampled), nothing needs the old log-probs before the
    update (KL in the reward), and a train-mode forward equals an eval-mode one (no dropout). Then
    the update uses old = current.detach() (ratio exactly 1), as if the pass had run."""
    rollout = cfg.actor_rollout_ref.rollout
    actor = cfg.actor_rollout_ref.actor
    reasons = []
    if str(rollout.name) != "hf":
        reasons.append(f"rollout.name={rollout.name}: the engine samples from its own copy of the weights")
    if int(actor.ppo_epochs) != 1:
        reasons.append(f"actor.ppo_epochs={actor.ppo_epochs}: later epochs update from changed weights")
    if int(actor.ppo_mini_batch_size) < int(cfg.data.train_batch_size):
        reasons.append(f"actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} < data.train_batch_size="
                       f"{cfg.data.train_batch_size}: later mini-batches update from changed weights")
    if bool(cfg.algorithm.use_kl_in_reward):
        reasons.append("algorithm.use_kl_in_reward: the reward needs the old log-probs before the update")
    dropout = _active_dropout(module)
    if dropout:
        reasons.append(f"dropout is active in training mode ({', '.join(dropout[:3])})")
    return reasons


class ActorRolloutRefWorker:
    def __init__(self, cfg, total_training_steps: int, rank: int = 0, world_size: int = 1):
        self.cfg = cfg  # the backend_config node
        self.rank = rank
        self.world_size = world_size
        self.total_training_steps = total_training_steps
        self.device = detect_device(cfg.trainer.device)
        self.torch_device = self.device.torch_device(int(os.environ.get("LOCAL_RANK", 0)))
        from verl_npu.trainer.profiling import WorkerProfiler

        self.profiler = WorkerProfiler(cfg, rank, self.device)
        # actor.use_torch_compile: the actor's log-prob / entropy formula runs through torch.compile
        self._compile = bool(cfg.actor_rollout_ref.actor.get("use_torch_compile", False))

    # ---- setup ---------------------------------------------------------------------------
    def init_model(self) -> dict:
        cfg = self.cfg
        model_cfg = cfg.actor_rollout_ref.model
        actor_cfg = cfg.actor_rollout_ref.actor
        self.device.manual_seed(int(cfg.data.seed))
        self.tokenizer, self.processor = load_tokenizer_and_processor(
            model_cfg.path,
            trust_remote_code=bool(model_cfg.trust_remote_code),
            custom_chat_template=model_cfg.get("custom_chat_template"),
        )
        # fp32 master weights and optimizer state; forward/backward in the device's compute dtype
        # (bf16 on accelerators that have it): FSDP2 mixed precision with several workers,
        # autocast with one
        compute_dtype = self.device.train_dtype()
        self.compute_dtype = compute_dtype
        load_kwargs = dict(
            attn_implementation=self.device.attn_implementation(),
            override_config=dict(model_cfg.override_config or {}),
            trust_remote_code=bool(model_cfg.trust_remote_code),
            external_lib=model_cfg.external_lib,
        )
        module = load_policy_model(
            model_cfg.path,
            dtype=torch.float32,
            gradient_checkpointing=bool(model_cfg.enable_gradient_checkpointing),
            **load_kwargs,
        )
        # LoRA: peft injects the adapters before sharding (only they require grad); the worker
        # computes with the transformers model inside (FSDP2's root, as without LoRA) and keeps
        # the peft wrapper for disabling the adapters and saving them
        self.peft_model = lora.wrap_lora(module, model_cfg) if lora.lora_enabled(model_cfg) else None
        if self.peft_model is not None:
            module = self.peft_model.get_base_model()
            log.info("LoRA: %s parameters", lora.trainable_summary(module))
        if actor_cfg.get("freeze_vision_tower", False):
            from verl_npu.models.freeze import freeze_vision_tower

            log.info("freeze_vision_tower: %d vision-tower parameters frozen", freeze_vision_tower(module))
        self.module = parallel.shard_module(
            module.to(self.torch_device), actor_cfg.fsdp_config, self.world_size, param_dtype=compute_dtype
        )
        self.ref_module = None
        # a LoRA actor's reference is the actor itself with its adapters off (no second copy)
        self.ref_is_actor = needs_reference(cfg) and self.peft_model is not None
        if needs_reference(cfg) and not self.ref_is_actor:
            ref = load_policy_model(model_cfg.path, dtype=compute_dtype, **load_kwargs).to(self.torch_device)
            ref.requires_grad_(False)
            ref.eval()
            self.ref_module = parallel.shard_module(
                ref, cfg.actor_rollout_ref.ref.fsdp_config, self.world_size, param_dtype=compute_dtype
            )
        sp = int(actor_cfg.ulysses_sequence_parallel_size)
        self.sp_group, self.dp_rank, self.dp_size = parallel.sequence_parallel_group(self.world_size, sp)
        # actor.entropy_from_logits_with_chunking: the actor's entropy, ENTROPY_CHUNK tokens at a time
        self.entropy_chunk = ENTROPY_CHUNK if actor_cfg.get("entropy_from_logits_with_chunking") else 0
        if self.sp_group is not None:
            from verl_npu.models.ulysses import check_heads

            problem = check_heads(self.module.config, sp)
            if problem:
                raise UserError(f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}: {problem}")
        self.optimizer_step = parallel.GuardedOptimizerStep("actor")
        self.optimizer = build_optimizer(
            [p for p in self.module.parameters() if p.requires_grad], actor_cfg.optim
        )
        self.lr_scheduler = build_lr_scheduler(self.optimizer, actor_cfg.optim, self.total_training_steps)
        self.rollout = self._build_rollout()
        self.old_log_prob_reasons = old_log_prob_pass_needed(cfg, self.module)
        return {
            "num_params": sum(p.numel() for p in self.module.parameters()),
            "compute_dtype": str(compute_dtype),
            "data_parallel": self.dp_size,
            "ulysses_sp": self.world_size // self.dp_size if self.sp_group is not None else 1,
        }

    def _autocast(self):
        """Compute-dtype autocast for a worker that is not FSDP2-sharded (FSDP2 casts by itself)."""
        if self.compute_dtype == torch.float32 or parallel.fsdp_enabled(self.world_size):
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.torch_device.type, dtype=self.compute_dtype)

    def _build_rollout(self) -> RolloutEngine:
        from verl_npu.rollout import build_rollout

        return build_rollout(
            str(self.cfg.actor_rollout_ref.rollout.name), self.module, self.tokenizer, self.processor, self.cfg,
            rank=self.rank, world_size=self.world_size,
        )

    # ---- rollout ---------------------------------------------------------------------------
    def generate_sequences(self, prompts: Batch, params: SamplingParams) -> Batch:
        with self._autocast():
            return self.rollout.generate(prompts, params)

    # ---- log-probs --------------------------------------------------------------------------
    def _log_probs(self, module, batch: Batch, *, with_entropy: bool, micro: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        response_length = batch["responses"].shape[1]
        temperature = float(self.cfg.actor_rollout_ref.rollout.temperature)
        remove_padding = bool(self.cfg.actor_rollout_ref.model.use_remove_padding)
        log_probs, entropies = [], []
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad():
                for idx in micro_batch_indices(batch["attention_mask"], **micro):
                    part = trim_left_padding(batch.select(idx)).to(self.torch_device)
                    with self._autocast():
                        lp, ent = response_log_probs(
                            module,
                            part["input_ids"],
                            part["attention_mask"],
                            response_length,
                            multi_modal_inputs=part.get("multi_modal_inputs"),
                            temperature=temperature,
                            with_entropy=with_entropy,
                            remove_padding=remove_padding,
                            sp_group=self.sp_group,
                            entropy_chunk=self.entropy_chunk if module is self.module else 0,
                            fused=bool(self.cfg.actor_rollout_ref.model.get("use_fused_kernels", False)),
                            compile=module is self.module and self._compile,
                        )
                    log_probs.append(lp.cpu())
                    if ent is not None:
                        entropies.append(ent.cpu())
        finally:
            module.train(was_training)
        return torch.cat(log_probs), (torch.cat(entropies) if entropies else None)

    def _log_prob_micro(self, role_cfg) -> dict:
        if role_cfg.log_prob_use_dynamic_bsz:
            return {"max_token_len": int(role_cfg.log_prob_max_token_len_per_gpu)}
        return {"micro_batch_size": int(role_cfg.log_prob_micro_batch_size_per_gpu or 1)}

    def compute_log_prob(self, batch: Batch) -> Batch:
        """Log-probs of the sampled responses under the current actor ("old" log-probs for PPO)."""
        micro = self._log_prob_micro(self.cfg.actor_rollout_ref.rollout)
        log_probs, entropy = self._log_probs(self.module, batch, with_entropy=True, micro=micro)
        return Batch({"old_log_probs": log_probs, "entropys": entropy})

    def old_log_prob_pass_reasons(self) -> list[str]:
        """Why this worker needs the separate old-log-prob pass (empty: `update_actor` computes
        the old log-probs itself; see `old_log_prob_pass_needed`)."""
        return list(self.old_log_prob_reasons)

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        if self.ref_module is None and not self.ref_is_actor:
            raise RuntimeError("reference log-probs asked for, but no KL term needs the reference model")
        micro = self._log_prob_micro(self.cfg.actor_rollout_ref.ref)
        with self._reference() as ref:
            log_probs, _ = self._log_probs(ref, batch, with_entropy=False, micro=micro)
        return Batch({"ref_log_prob": log_probs})

    @contextlib.contextmanager
    def _reference(self):
        """The reference module: the separate one, or (LoRA) the actor with its adapters off."""
        if self.ref_is_actor:
            with lora.adapters_disabled(self.peft_model):
                yield self.module
        else:
            yield self.ref_module

    # ---- update ----------------------------------------------------------------------------
    def update_actor(self, batch: Batch) -> dict[str, float]:
        """`ppo_epochs` passes over mini-batches; one optimizer step per mini-batch; gradients
        accumulated over micro-batches so that the step equals one over the whole mini-batch.

        Without `old_log_probs` in `batch` (the trainer skipped the pass because it is redundant,
        see `old_log_prob_pass_needed`), each micro-batch's own forward gives them (detached), and
        the masked entropy sum and token count of that forward come back as
        `_old/entropy_sum` / `_old/tokens` (for the trainer's `actor/entropy_before_update`)."""
        cfg = self.cfg
        actor_cfg = cfg.actor_rollout_ref.actor
        n = int(cfg.actor_rollout_ref.rollout.n)
        mini_rows = int(actor_cfg.ppo_mini_batch_size) * n // self.dp_size
        reuse = "old_log_probs" not in batch
        if reuse and self.old_log_prob_reasons:
            raise RuntimeError("update_actor without old_log_probs, but the pass is needed: "
                               + "; ".join(self.old_log_prob_reasons))
        reuse_sums = {"_old/entropy_sum": 0.0, "_old/tokens": 0.0}
        if actor_cfg.use_dynamic_bsz:
            micro = {"max_token_len": int(actor_cfg.ppo_max_token_len_per_gpu)}
        else:
            micro = {"micro_batch_size": int(actor_cfg.ppo_micro_batch_size_per_gpu or 1)}
        response_length = batch["responses"].shape[1]

        sums: dict[str, list[float]] = {}
        generator = torch.Generator().manual_seed(int(cfg.data.seed) + int(self.lr_scheduler.last_epoch))
        self.module.train()
        for _ in range(int(actor_cfg.ppo_epochs)):
            order = torch.randperm(len(batch), generator=generator) if actor_cfg.shuffle else torch.arange(len(batch))
            for mini_start in range(0, len(batch), mini_rows):
                mini = batch.select(order[mini_start : mini_start + mini_rows])
                # global counts make micro-batch losses add up to the mini-batch loss (and across ranks)
                # (SP peers hold the same rows: each shard is counted sp times by the world sum)
                sp = self.world_size // self.dp_size
                global_tokens = parallel.all_reduce_sum(
                    float(mini["response_mask"].sum()), self.world_size, self.torch_device
                ) / sp
                global_seqs = parallel.all_reduce_sum(
                    float((mini["response_mask"].sum(1) > 0).sum()), self.world_size, self.torch_device
                ) / sp
                agg = dict(
                    global_tokens=global_tokens,
                    global_seqs=global_seqs,
                    dp_size=self.dp_size,
                    loss_scale_factor=response_length,
                )
                self.optimizer.zero_grad(set_to_none=True)
                for idx in micro_batch_indices(mini["attention_mask"], **micro):
                    part = trim_left_padding(mini.select(idx)).to(self.torch_device)
                    mask = part["response_mask"].float()
                    loss, stats = self._micro_batch_loss(part, mask, response_length, agg)
                    loss.backward()
                    if reuse:
                        reuse_sums["_old/entropy_sum"] += float(stats.pop("_entropy_sum"))
                        reuse_sums["_old/tokens"] += float(mask.sum())
                    # losses are already scaled to their share of the mini-batch: sum them
                    share = float(mask.sum()) / max(global_tokens / self.dp_size, 1.0)
                    for key, value in stats.items():
                        value = float(value.detach()) if torch.is_tensor(value) else float(value)
                        summed = key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss")
                        sums.setdefault(key, []).append(value if summed else value * share)
                grad_norm = self.optimizer_step(self.module, self.optimizer, float(actor_cfg.grad_clip))
                sums.setdefault("actor/grad_norm", []).append(float(grad_norm))
        self.lr_scheduler.step()
        # the rollout engine samples the next batch from the new weights (a no-op for `hf`, which
        # shares the module; a collective for vLLM, so every rank calls it)
        self.rollout.update_weights(self.module)
        mini_batches = max(1, int(actor_cfg.ppo_epochs) * -(-len(batch) // mini_rows))
        metrics = {}
        for key, values in sums.items():
            # per-mini-batch values were accumulated over micro-batches; average over mini-batches
            metrics[key] = sum(values) / (mini_batches if key != "actor/grad_norm" else len(values))
        metrics["actor/lr"] = float(self.lr_scheduler.get_last_lr()[0])
        metrics.update(self.optimizer_step.metrics())
        if reuse:
            metrics.update(reuse_sums)
        mem = self.device.memory()
        metrics["actor/perf/max_memory_allocated_gb"] = float(mem.get("peak_gb", 0.0))
        return metrics


    def _micro_batch_loss(self, part: Batch, mask: torch.Tensor, response_length: int, agg: dict):
        """The PPO loss of one micro-batch (already scaled to its share of the mini-batch through the
        global counts in `agg`): clipped policy loss - entropy_coeff x entropy + kl_loss_coef x KL."""
        cfg = self.cfg
        actor_cfg = cfg.actor_rollout_ref.actor
        mode = actor_cfg.loss_agg_mode
        use_kl_loss = bool(actor_cfg.use_kl_loss)
        full_kl = use_kl_loss and actor_cfg.kl_loss_type == "full"
        forward = dict(
            multi_modal_inputs=part.get("multi_modal_inputs"),
            temperature=float(cfg.actor_rollout_ref.rollout.temperature),
            remove_padding=bool(cfg.actor_rollout_ref.model.use_remove_padding),
            sp_group=self.sp_group,
            entropy_chunk=self.entropy_chunk,
            fused=bool(cfg.actor_rollout_ref.model.get("use_fused_kernels", False)),
        )
        with self._autocast():
            # entropy is logged as actor/entropy even when it is not in the loss
            out = response_log_probs(
                self.module, part["input_ids"], part["attention_mask"], response_length,
                with_entropy=True, return_logits=full_kl, compile=self._compile, **forward,
            )
            log_prob, entropy = out[0], out[1]
            kl_inputs = {}
            if full_kl:  # the exact KL needs both whole distributions at every position
                with torch.no_grad(), self._reference() as ref:
                    ref_out = response_log_probs(
                        ref, part["input_ids"], part["attention_mask"], response_length,
                        return_logits=True, **forward,
                    )
                kl_inputs = {"logits": out[2], "ref_logits": ref_out[2]}
        clip = actor_cfg.clip_ratio
        reuse = "old_log_probs" not in part
        # the redundant pass skipped: the old log-probs are this forward's own (ratio exactly 1)
        old_log_prob = log_prob.detach() if reuse else part["old_log_probs"]
        policy_loss = algorithms.policy_loss_fn(str(actor_cfg.policy_loss.loss_mode))
        pg = policy_loss(
            log_prob,
            old_log_prob,
            part["advantages"],
            mask,
            clip_ratio_low=float(actor_cfg.clip_ratio_low if actor_cfg.clip_ratio_low is not None else clip),
            clip_ratio_high=float(actor_cfg.clip_ratio_high if actor_cfg.clip_ratio_high is not None else clip),
            clip_ratio_c=float(actor_cfg.clip_ratio_c),
            loss_agg_mode=mode,
            config=actor_cfg,  # each loss mode reads its own settings (policy_loss.*, tau_pos, ...)
            **agg,
        )
        loss = pg["pg_loss"]
        entropy_loss = algorithms.agg_loss(entropy, mask, mode, **agg)
        if actor_cfg.entropy_coeff:
            loss = loss - float(actor_cfg.entropy_coeff) * entropy_loss
        # pg_loss and the metrics the loss mode logs (pg_clipfrac, ppo_kl, pg_clipfrac_lower; fewer for some modes)
        stats = {"actor/entropy": entropy_loss, **{f"actor/{key}": value for key, value in pg.items()}}
        if reuse:
            stats["_entropy_sum"] = (entropy.detach() * mask).sum()
        if use_kl_loss:
            kl = algorithms.kl_penalty(log_prob, part["ref_log_prob"], actor_cfg.kl_loss_type, **kl_inputs)
            kl_loss = algorithms.agg_loss(kl, mask, mode, **agg)
            loss = loss + float(actor_cfg.kl_loss_coef) * kl_loss
            stats["actor/kl_loss"] = kl_loss
            stats["actor/kl_coef"] = float(actor_cfg.kl_loss_coef)
        return loss, stats

    # ---- profiling (verl_npu.trainer.profiling) -------------------------------------------
    def start_profile(self, folder: str) -> None:
        """Start recording this process into folder/rank_<rank> if a role's profiler selects this rank."""
        self.profiler.start(folder)

    def stop_profile(self) -> str | None:
        """Stop recording; returns the trace written (None when this rank was not recording)."""
        return self.profiler.stop()

    # ---- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, actor_dir: str) -> None:
        """This rank's part of `actor_dir` in verl's layout (`verl_npu.workers.actor_ckpt`)."""
        from verl_npu.workers.actor_ckpt import save_actor

        save_actor(self, actor_dir)

    def load_checkpoint(self, actor_dir: str) -> None:
        """Load this rank's files of an actor folder of verl-npu or verl (`actor_ckpt.load_actor`)."""
        from verl_npu.workers.actor_ckpt import load_actor

        load_actor(self, actor_dir)

    def parameter_snapshot(self) -> dict[str, torch.Tensor]:
        """This rank's view of the full parameters, on CPU (a collective: tests compare every
        rank's snapshot, and 1-vs-N worker runs)."""
        return {k: v.detach().cpu().clone() for k, v in parallel.full_state_dict(self.module).items()}

    def training_state_snapshot(self) -> dict:
        """What a resume restores, as whole tensors on the CPU (a collective; tests compare it with
        the saving run's): `params` and AdamW's `exp_avg` / `exp_avg_sq` / `step` by parameter
        name, the scheduler's `last_epoch` and `lr`, and this process's torch CPU RNG state."""
        moments = {}
        for name, param in self.module.named_parameters():
            state = self.optimizer.state.get(param, {})
            moments[name] = {k: parallel._gathered(state[k]).cpu().clone() for k in ("exp_avg", "exp_avg_sq")
                             if k in state}
            if "step" in state:
                moments[name]["step"] = float(state["step"])
        return {
            "params": self.parameter_snapshot(),
            "moments": moments,
            "last_epoch": int(self.lr_scheduler.last_epoch),
            "lr": float(self.lr_scheduler.get_last_lr()[0]),
            "torch_cpu_rng": torch.get_rng_state(),
        }

    def rollout_weights_digest(self) -> dict:
        """The rollout engine's own weights on this rank, summarised (engines with a separate
        copy of the weights only; tests check that every rank's engine got the same update)."""
        digest = getattr(self.rollout, "weights_digest", None)
        return digest() if callable(digest) else {}

    def rollout_engine_stats(self) -> dict:
        """The rollout engine's own scheduler settings and what its last rollout asked of them, on
        this rank (engines that report them; tests check what the engine really ran with)."""
        stats = getattr(self.rollout, "engine_stats", None)
        return stats() if callable(stats) else {}
