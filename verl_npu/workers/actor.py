"""The actor/rollout/reference worker: the policy's forward and the PPO loss over training engines.

One worker runs per device (rank). The controller never sees weights; it sends batches and
gets back tensors and metrics through a worker group. The worker holds:
- the policy's engine (`TrainingEngine`: module, optimizer, LR schedule, the update loop),
- the reference policy's frozen engine, built only when a KL term needs it (actor KL loss or KL
  in reward); a LoRA actor's reference is its own engine with the adapters off,
- the rollout engine, built by name from the registry in `verl_npu.rollout` (`hf` samples from
  the actor module itself; `vllm` holds its own copy of the weights, refreshed in memory after
  every update).
"""

from __future__ import annotations

import contextlib
import functools
from enum import Enum
from typing import TYPE_CHECKING

import torch

from verl_npu import algorithms
from verl_npu.batch import Batch, reads
from verl_npu.errors import UserError
from verl_npu.models import lora
from verl_npu.models.forward import response_log_probs
from verl_npu.models.loading import load_policy_model, load_tokenizer_and_processor, master_dtype
from verl_npu.registry import POLICY_LOSSES, ROLES, ROLLOUT_ENGINES
from verl_npu.rollout.base import ROLLOUT_DTYPES, RolloutEngine, SamplingParams
from verl_npu.workers import distillation, parallel
from verl_npu.workers.engine import TrainingEngine, TrainResult, micro_batching

if TYPE_CHECKING:
    from verl_npu.config.sections import BackendConfigSection

#: the columns every forward of the policy reads (the micro-batch split and trim read the attention mask)
FORWARD_READS = ("input_ids", "attention_mask", "responses", "multi_modal_inputs")


def needs_reference(cfg: BackendConfigSection) -> bool:
    """The reference policy is loaded only when some KL term uses it (`cfg`: the typed backend config)."""
    return cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


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


class OldLogProbs(str, Enum):
    """Where the actor's update takes the old policy's log-probs from: the trainer decides, and says so
    in the update request (`update_actor(batch, old_log_probs)`)."""

    PASS = "pass"  # the old-log-prob pass ran: the batch's old_log_probs column
    ROLLOUT = "rollout"  # bypass mode: the rollout engine's log-probs, as old_log_probs
    UPDATE_FORWARD = "update_forward"  # the pass skipped as redundant: each micro-batch's own forward


def old_log_prob_pass_needed(cfg: BackendConfigSection, module) -> list[str]:
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
    if not ROLLOUT_ENGINES.spec(rollout.name).on_actor_module:
        reasons.append(f"rollout.name={rollout.name}: the engine samples from its own copy of the weights")
    if actor.ppo_epochs != 1:
        reasons.append(f"actor.ppo_epochs={actor.ppo_epochs}: later epochs update from changed weights")
    if actor.ppo_mini_batch_size < cfg.data.train_batch_size:
        reasons.append(
            f"actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} < data.train_batch_size="
            f"{cfg.data.train_batch_size}: later mini-batches update from changed weights"
        )
    if cfg.algorithm.use_kl_in_reward:
        reasons.append("algorithm.use_kl_in_reward: the reward needs the old log-probs before the update")
    if actor.calculate_sum_pi_squared:
        reasons.append(
            "actor.calculate_sum_pi_squared: the advantages need the sum of squared probabilities "
            "and old log-probs before the update"
        )
    if rollout.calculate_log_probs and not cfg.algorithm.rollout_correction.bypass_mode:
        reasons.append(
            "rollout.calculate_log_probs: rollout correction weighs the rollout's log-probs against the "
            "old ones before the update"
        )
    dropout = _active_dropout(module)
    if dropout:
        reasons.append(f"dropout is active in training mode ({', '.join(dropout[:3])})")
    return reasons


@ROLES.register(
    "actor",
    needed_when=("always",),
    metrics="actor",
    trains=True,
    model_key="actor_rollout_ref.model.path",
    keep_key="trainer.max_actor_ckpt_to_keep",
    methods=(
        "generate_sequences",
        "compute_log_prob",
        "old_log_prob_pass_reasons",
        "compute_ref_log_prob",
        "update_actor",
    ),
    doc="policy, rollout engine and reference policy (always built)",
)
class ActorRolloutRefWorker:
    """The actor role: the policy's engine (trained with the PPO loss), the reference policy's
    frozen engine (or, with LoRA, the policy's with its adapters off) and the rollout engine."""

    def __init__(
        self, cfg: BackendConfigSection, total_training_steps: int, device, rank: int = 0, world_size: int = 1
    ):
        """`cfg`: the typed backend config (the rollout engine it builds reads it whole); `device`: the
        run's `DeviceInfo`, resolved once by the driver."""
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.total_training_steps = total_training_steps
        self.device = device
        self.engine = TrainingEngine.for_trained_role("actor", cfg, device, rank, world_size)
        self.ref = None  # the reference policy's engine, when a KL term needs a separate one
        from verl_npu.workers.profiler import WorkerProfiler

        self.profiler = WorkerProfiler(cfg.actor_rollout_ref, rank, device)
        # actor.use_torch_compile: the actor's log-prob / entropy formula runs through torch.compile
        self._compile = cfg.actor_rollout_ref.actor.use_torch_compile

    # the engine's parts, under the names tests and the rollout engines use
    module = property(lambda self: self.engine.module)
    optimizer = property(lambda self: self.engine.optimizer)
    peft_model = property(lambda self: self.engine.peft_model)
    ref_module = property(lambda self: self.ref.module if self.ref is not None else None)

    def _autocast(self):
        return self.engine.autocast()

    # ---- setup ---------------------------------------------------------------------------
    def init_model(self) -> dict:
        cfg = self.cfg
        model_cfg = cfg.actor_rollout_ref.model
        actor_cfg = cfg.actor_rollout_ref.actor
        engine = self.engine
        self.device.manual_seed(cfg.data.seed)
        model_path = model_cfg.path
        if model_cfg.use_shm:  # one copy per node in shared memory, loaded from there
            from verl_npu.models.shm import shm_folder

            model_path = shm_folder(model_cfg.path)
        self.tokenizer, self.processor = load_tokenizer_and_processor(
            model_path,
            trust_remote_code=model_cfg.trust_remote_code,
            custom_chat_template=model_cfg.custom_chat_template,
        )
        engine.tokenizer, engine.processor = self.tokenizer, self.processor
        load_kwargs = dict(
            attn_implementation=self.device.attn_implementation(),
            override_config=dict(model_cfg.override_config),
            trust_remote_code=model_cfg.trust_remote_code,
            external_lib=model_cfg.external_lib,
        )
        # actor.fsdp_config.model_dtype: the master weights' dtype (and so the gradients' and AdamW's)
        master = master_dtype(actor_cfg.fsdp_config)
        if master == torch.bfloat16 and not self.device.supports_bf16():
            raise UserError(
                f"actor_rollout_ref.actor.fsdp_config.model_dtype={actor_cfg.fsdp_config.model_dtype}: "
                f"{self.device.describe()} has no bfloat16; set it to fp32"
            )
        module = load_policy_model(
            model_path, dtype=master, **load_kwargs, gradient_checkpointing=model_cfg.enable_gradient_checkpointing
        )
        engine.attach(
            module, actor_cfg.fsdp_config, model_cfg=model_cfg, freeze_vision_tower=actor_cfg.freeze_vision_tower
        )
        engine.offload_activations = model_cfg.enable_activation_offload  # the device says how (a no-op on cpu)
        # a LoRA actor's reference is the actor itself with its adapters off (no second copy)
        self.ref_is_actor = needs_reference(cfg) and engine.peft_model is not None
        if needs_reference(cfg) and not self.ref_is_actor:
            ref = load_policy_model(model_path, dtype=engine.compute_dtype, **load_kwargs)
            ref.requires_grad_(False)
            self.ref = TrainingEngine("ref", self.device, rank=self.rank, world_size=self.world_size)
            self.ref.attach(ref.eval(), cfg.actor_rollout_ref.ref.fsdp_config)
        sp = actor_cfg.ulysses_sequence_parallel_size
        self.sp_group, _, engine.dp_size = parallel.sequence_parallel_group(self.world_size, sp)
        # actor.entropy_from_logits_with_chunking: the actor's entropy, entropy_from_logits_chunk_size tokens at a time
        chunked = actor_cfg.entropy_from_logits_with_chunking
        self.entropy_chunk = actor_cfg.entropy_from_logits_chunk_size if chunked else 0
        if self.sp_group is not None:
            from verl_npu.models.ulysses import check_heads

            problem = check_heads(self.module.config, sp)
            if problem:
                raise UserError(f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}: {problem}")
        engine.add_optimizer(actor_cfg.optim, self.total_training_steps)
        self.rollout = self._build_rollout()
        self.old_log_prob_reasons = old_log_prob_pass_needed(cfg, self.module)
        return {
            "num_params": sum(p.numel() for p in self.module.parameters()),
            "compute_dtype": str(engine.compute_dtype),
            "data_parallel": engine.dp_size,
            "ulysses_sp": self.world_size // engine.dp_size if self.sp_group is not None else 1,
        }

    def _build_rollout(self) -> RolloutEngine:
        from verl_npu.rollout import build_rollout

        name = self.cfg.actor_rollout_ref.rollout.name
        if self.cfg.trainer.v1.trainer_mode == "separate_async" and not ROLLOUT_ENGINES.spec(name).on_actor_module:
            # the rollout processes generate for training; this engine only validates, at a sync point: the one
            # that samples on this module (no second copy of the weights, no second vLLM engine, any TP size)
            name = next(n for n in ROLLOUT_ENGINES.names() if ROLLOUT_ENGINES.spec(n).on_actor_module)
        return build_rollout(
            name,
            self.module,
            self.tokenizer,
            self.processor,
            self.cfg,
            rank=self.rank,
            world_size=self.world_size,
            device=self.device,
            weights=self._rollout_weights(),
        )

    def _rollout_weights(self):
        """The actor's full weights for the rollout engine's `update_weights`, lazily gathered (a
        collective) in `rollout.dtype`, `rollout.update_weights_bucket_megabytes` at a time."""
        rollout_cfg = self.cfg.actor_rollout_ref.rollout
        return self.engine.rollout_weights(
            dtype=ROLLOUT_DTYPES.get(rollout_cfg.dtype), bucket_bytes=rollout_cfg.update_weights_bucket_megabytes << 20
        )

    # ---- rollout ---------------------------------------------------------------------------
    # what the engines read of a prompt (`hf`: the tokens and processor inputs; `vllm`: raw_prompt_ids and the
    # images) and, for the multi-turn agent loop, the chat messages, extra_info (tools_kwargs, interaction
    # kwargs), agent_name and data_row (errors name the row)
    @reads(
        "input_ids",
        "attention_mask",
        "raw_prompt_ids",
        "multi_modal_data",
        "multi_modal_inputs",
        "uid",
        "raw_prompt",
        "extra_info",
        "agent_name",
        "data_row",
        trimmed=False,
    )
    def generate_sequences(self, prompts: Batch, params: SamplingParams) -> Batch:
        with self.engine.autocast():
            return self.rollout.generate(prompts, params)

    # ---- log-probs --------------------------------------------------------------------------
    def _forward_settings(self) -> dict:
        """The keywords of `response_log_probs` that every forward of this role shares."""
        arr = self.cfg.actor_rollout_ref
        return dict(
            temperature=arr.rollout.temperature,
            remove_padding=arr.model.use_remove_padding,
            sp_group=self.sp_group,
            fused=arr.model.use_fused_kernels,
        )

    def _log_probs(
        self,
        engine: TrainingEngine,
        batch: Batch,
        *,
        with_entropy: bool,
        micro: dict,
        with_sum_pi_squared: bool = False,
    ):
        """(log-probs, entropies or None[, Σπ² with `with_sum_pi_squared`]) of the responses of `batch` under
        `engine`'s module; the policy's own engine (also as the LoRA reference) chunks the entropy and
        compiles as configured."""
        response_length = batch["responses"].shape[1]
        own = engine is self.engine
        settings = self._forward_settings()

        def forward(module, part):
            return response_log_probs(
                module,
                part["input_ids"],
                part["attention_mask"],
                response_length,
                multi_modal_inputs=part.get("multi_modal_inputs"),
                with_entropy=with_entropy,
                entropy_chunk=self.entropy_chunk if own else 0,
                compile=own and self._compile,
                with_sum_pi_squared=with_sum_pi_squared,
                **settings,
            )

        return engine.infer(batch, forward, micro)

    def _sp_size(self) -> int:
        """Ranks of this worker's Ulysses sequence-parallel group (1 without one)."""
        return self.world_size // self.engine.dp_size if self.sp_group is not None else 1

    def _log_prob_micro(self, role_cfg) -> dict:
        return micro_batching(
            role_cfg.log_prob_use_dynamic_bsz,
            role_cfg.log_prob_max_token_len_per_gpu,
            role_cfg.log_prob_micro_batch_size_per_gpu or 1,
            sp=self._sp_size(),
        )

    @reads(*FORWARD_READS)
    def compute_log_prob(self, batch: Batch) -> Batch:
        """Log-probs of the sampled responses under the current actor ("old" log-probs for PPO), their
        entropies, and with `actor.calculate_sum_pi_squared` each position's Σ_v π_v² (`sum_pi_squared`, for
        the optimal-token-baseline estimators)."""
        micro = self._log_prob_micro(self.cfg.actor_rollout_ref.rollout)
        if not self.cfg.actor_rollout_ref.actor.calculate_sum_pi_squared:
            log_probs, entropy = self._log_probs(self.engine, batch, with_entropy=True, micro=micro)
            return Batch({"old_log_probs": log_probs, "entropys": entropy})
        log_probs, entropy, sum_pi_sq = self._log_probs(
            self.engine, batch, with_entropy=True, micro=micro, with_sum_pi_squared=True
        )
        return Batch({"old_log_probs": log_probs, "entropys": entropy, "sum_pi_squared": sum_pi_sq})

    def old_log_prob_pass_reasons(self) -> list[str]:
        """Why this worker needs the separate old-log-prob pass (empty: `update_actor` computes
        the old log-probs itself; see `old_log_prob_pass_needed`)."""
        return list(self.old_log_prob_reasons)

    @reads(*FORWARD_READS)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        if self.ref is None and not self.ref_is_actor:
            raise RuntimeError("reference log-probs asked for, but no KL term needs the reference model")
        micro = self._log_prob_micro(self.cfg.actor_rollout_ref.ref)
        with self._reference() as ref:
            log_probs, _ = self._log_probs(ref, batch, with_entropy=False, micro=micro)
        return Batch({"ref_log_prob": log_probs})

    @contextlib.contextmanager
    def _reference(self):
        """The reference engine: the separate one, or (LoRA) the actor's with its adapters off."""
        if self.ref_is_actor:
            with lora.adapters_disabled(self.peft_model):
                yield self.engine
        else:
            yield self.ref

    # ---- update ----------------------------------------------------------------------------
    @reads(
        *FORWARD_READS,
        "response_mask",
        "advantages",
        "old_log_probs",
        "ref_log_prob",
        "rollout_is_weights",
        *distillation.TEACHER_COLUMNS,
    )
    def update_actor(self, batch: Batch, old_log_probs: OldLogProbs = OldLogProbs.PASS) -> TrainResult:
        """`ppo_epochs` passes over mini-batches; one optimizer step per mini-batch; gradients
        accumulated over micro-batches so that the step equals one over the whole mini-batch
        (`TrainingEngine.train` with `_train_forward` and `_ppo_loss`).

        With `old_log_probs=UPDATE_FORWARD` (the trainer skipped the pass because it is redundant, see
        `old_log_prob_pass_needed`), each micro-batch's own forward gives them (detached), and
        that forward's entropies come back as the result's `entropys` column (the engine's `keep`:
        what the pass would have returned, for the trainer's `actor/entropy_before_update`); otherwise
        they are the batch's `old_log_probs` column."""
        actor_cfg = self.cfg.actor_rollout_ref.actor
        reuse = OldLogProbs(old_log_probs) is OldLogProbs.UPDATE_FORWARD
        if reuse and self.old_log_prob_reasons:
            raise RuntimeError(
                "update_actor told to take the old log-probs from its own forward, but the pass is "
                "needed: " + "; ".join(self.old_log_prob_reasons)
            )
        if not reuse and "old_log_probs" not in batch:
            raise RuntimeError(
                f"update_actor told the old log-probs come from {OldLogProbs(old_log_probs).value}, "
                "but the batch has no old_log_probs column"
            )
        rows = actor_cfg.ppo_mini_batch_size * self.cfg.actor_rollout_ref.rollout.n // self.engine.dp_size
        metrics = self.engine.train(
            batch,
            self._train_forward,
            functools.partial(self._ppo_loss, own_forward=reuse),
            mini_rows=rows,
            epochs=actor_cfg.ppo_epochs,
            shuffle=actor_cfg.shuffle,
            micro=micro_batching(
                actor_cfg.use_dynamic_bsz,
                actor_cfg.ppo_max_token_len_per_gpu,
                actor_cfg.ppo_micro_batch_size_per_gpu or 1,
                sp=self._sp_size(),
            ),
            grad_clip=actor_cfg.grad_clip,
            summed=("actor/pg_loss", "actor/entropy", "actor/kl_loss", *distillation.SUMMED_METRICS),
            keep=(lambda out: {"entropys": out[1]}) if reuse else None,
        )
        # the rollout engine samples the next batch from the new weights (a no-op for `hf`, which
        # shares the module; a collective for vLLM, so every rank calls it)
        self.rollout.update_weights(self._rollout_weights())
        mem = self.device.memory()
        metrics["actor/perf/max_memory_allocated_gb"] = float(mem.get("peak_gb", 0.0))
        return metrics

    def _train_forward(self, module, part: Batch):
        """(log-probs, entropies, KL inputs, logits or None) of a training micro-batch; the exact (`full`) KL
        also needs both whole distributions, the policy's and the reference's, at every position; the top-k
        distillation loss the policy's (its temperature-scaled logits, else None)."""
        actor_cfg = self.cfg.actor_rollout_ref.actor
        full_kl = actor_cfg.use_kl_loss and actor_cfg.kl_loss_type == "full"
        # the top-k distillation loss reads the student's whole distribution too
        with_logits = full_kl or distillation.student_logits_needed(self.cfg)
        response_length = part["responses"].shape[1]
        forward = dict(
            multi_modal_inputs=part.get("multi_modal_inputs"),
            entropy_chunk=self.entropy_chunk,
            **self._forward_settings(),
        )
        # entropy is logged as actor/entropy even when it is not in the loss
        out = response_log_probs(
            module,
            part["input_ids"],
            part["attention_mask"],
            response_length,
            with_entropy=True,
            return_logits=with_logits,
            compile=self._compile,
            **forward,
        )
        logits = out[2] if with_logits else None
        if not full_kl:
            return out[0], out[1], {}, logits
        with torch.no_grad(), self._reference() as ref:
            ref_out = response_log_probs(
                ref.module, part["input_ids"], part["attention_mask"], response_length, return_logits=True, **forward
            )
        return out[0], out[1], {"logits": out[2], "ref_logits": ref_out[2]}, logits

    def _ppo_loss(self, part: Batch, out, mask: torch.Tensor, agg: dict, own_forward: bool = False):
        """The PPO loss of one micro-batch (already scaled to its share of the mini-batch through the
        global counts in `agg`): clipped policy loss - entropy_coeff x entropy + kl_loss_coef x KL."""
        actor_cfg = self.cfg.actor_rollout_ref.actor
        mode = actor_cfg.loss_agg_mode
        log_prob, entropy, kl_inputs, logits = out
        clip = actor_cfg.clip_ratio
        # the redundant pass skipped: the old log-probs are this forward's own (ratio exactly 1)
        old_log_prob = log_prob.detach() if own_forward else part["old_log_probs"]
        correction = self.cfg.algorithm.rollout_correction
        loss_mode = actor_cfg.policy_loss.loss_mode  # the config names bypass mode's loss when it is on
        # bypass mode: old_log_prob is the rollout's, the loss computes its own weights and rejection
        extra = (
            {"rollout_correction": correction}
            if POLICY_LOSSES.spec(loss_mode).rollout_correction
            else {"rollout_is_weights": part.get("rollout_is_weights")}
        )
        pg = algorithms.policy_loss_fn(loss_mode)(
            log_prob,
            old_log_prob,
            part["advantages"],
            mask,
            clip_ratio_low=actor_cfg.clip_ratio_low if actor_cfg.clip_ratio_low is not None else clip,
            clip_ratio_high=actor_cfg.clip_ratio_high if actor_cfg.clip_ratio_high is not None else clip,
            clip_ratio_c=actor_cfg.clip_ratio_c,
            loss_agg_mode=mode,
            config=actor_cfg,  # each loss mode reads its own settings (policy_loss.*, tau_pos, ...)
            **extra,
            **agg,
        )
        loss = pg["pg_loss"]
        entropy_loss = algorithms.agg_loss(entropy, mask, mode, **agg)
        if actor_cfg.entropy_coeff:
            loss = loss - actor_cfg.entropy_coeff * entropy_loss
        # pg_loss and the metrics the loss mode logs (pg_clipfrac, ppo_kl, pg_clipfrac_lower; fewer for some modes;
        # bypass_mode adds rollout_corr/*, which keep their own prefix as in verl)
        stats = {
            "actor/entropy": entropy_loss,
            **{key if "/" in key else f"actor/{key}": value for key, value in pg.items()},
        }
        if actor_cfg.use_kl_loss:
            kl = algorithms.kl_penalty(log_prob, part["ref_log_prob"], actor_cfg.kl_loss_type, **kl_inputs)
            kl_loss = algorithms.agg_loss(kl, mask, mode, **agg)
            loss = loss + actor_cfg.kl_loss_coef * kl_loss
            stats["actor/kl_loss"] = kl_loss
            stats["actor/kl_coef"] = actor_cfg.kl_loss_coef
        if distillation.enabled(self.cfg):
            loss, stats = distillation.add_distillation_term(
                self.cfg,
                part,
                loss,
                stats,
                log_prob=log_prob,
                old_log_prob=old_log_prob,
                student_logits=logits,
                mask=mask,
                agg=agg,
            )
        return loss, stats

    # ---- profiling (verl_npu.workers.profiler) ---------------------------------------------
    def start_profile(self, folder: str, tool: str = "torch", options: dict | None = None) -> None:
        """Start recording this process with `tool` into folder/rank_<rank> if a role's profiler selects this rank."""
        self.profiler.start(folder, tool, options)

    def stop_profile(self) -> str | None:
        """Stop recording; returns the trace written (None when this rank was not recording)."""
        return self.profiler.stop()

    # ---- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, actor_dir: str) -> None:
        """This rank's part of `actor_dir` in verl's layout (`TrainingEngine.save`)."""
        self.engine.save(actor_dir)

    def load_checkpoint(self, actor_dir: str) -> None:
        """Load this rank's files of an actor folder of verl-npu or verl, and hand the loaded weights
        to the rollout engine (a collective for vLLM)."""
        self.engine.load(actor_dir)
        self.rollout.update_weights(self._rollout_weights())

    def parameter_snapshot(self) -> dict[str, torch.Tensor]:
        """This rank's view of the full parameters, on CPU (a collective: tests compare every
        rank's snapshot, and 1-vs-N worker runs)."""
        return self.engine.parameter_snapshot()

    def training_state_snapshot(self) -> dict:
        """What a resume restores (`TrainingEngine.training_state_snapshot`; a collective)."""
        return self.engine.training_state_snapshot()

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
