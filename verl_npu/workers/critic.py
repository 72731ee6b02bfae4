"""The critic worker (PPO with GAE): a value model on every rank, colocated with the actor.

The value model is the transformers token-classification model of `critic.model.path` (default:
the actor's model) with one label: the backbone's final hidden state at every position goes
through one Linear (`score`, hidden -> 1), giving one value per token (verl's critic is the same
model class, so the checkpoint's parameter names match verl's). Its own FSDP2 shards
(`critic.model.fsdp_config`), AdamW and LR schedule (`critic.optim`).

The value of response token t is read at the position that predicts it (the hidden state of the
token before it), as the actor's log-prob of token t is.
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch

from verl_npu import algorithms
from verl_npu.batch import Batch
from verl_npu.device import detect_device
from verl_npu.models.loading import apply_override_config, load_config, load_tokenizer_and_processor, resolve_model_path
from verl_npu.optim import build_lr_scheduler, build_optimizer
from verl_npu.workers import parallel
from verl_npu.workers.micro import micro_batch_indices, trim_left_padding

log = logging.getLogger("verl_npu")


#: critic keys whose null means "the actor's value" (verl's defaults interpolate the actor's)
FROM_ACTOR = ("ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu", "ppo_epochs", "loss_agg_mode", "use_dynamic_bsz")


def critic_setting(cfg, key: str):
    """`critic.<key>`; for the keys of FROM_ACTOR a null reads `actor_rollout_ref.actor.<key>`."""
    value = cfg.critic.get(key)
    if value is None and key in FROM_ACTOR:
        value = cfg.actor_rollout_ref.actor.get(key)
    return value


def critic_model_path(cfg) -> str:
    """`critic.model.path`, or the actor's model when it is null."""
    path = (cfg.critic.get("model") or {}).get("path")
    return str(path) if path else str(cfg.actor_rollout_ref.model.path)


def load_value_model(path, *, dtype: torch.dtype, attn_implementation: str, override_config: dict | None,
                     trust_remote_code: bool, gradient_checkpointing: bool) -> torch.nn.Module:
    """The token-classification model of `path` with one label and no classifier dropout (its
    `score` Linear is new, initialised by transformers when `path` holds a causal LM)."""
    from transformers import AutoModelForTokenClassification

    from verl_npu.models.loading import enable_activation_checkpointing

    config = load_config(path, trust_remote_code=trust_remote_code)
    apply_override_config(config, override_config)
    config.num_labels = 1
    config.classifier_dropout = 0.0
    model = AutoModelForTokenClassification.from_pretrained(
        resolve_model_path(path), config=config, dtype=dtype, attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
    )
    if gradient_checkpointing:
        enable_activation_checkpointing(model)
    return model


def response_values(module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int):
    """Values [B, response_length]: the value head's output at the position before each response token."""
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = module(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False)
    values = out.logits.squeeze(-1).float()
    return values[:, -response_length - 1 : -1]


class CriticWorker:
    def __init__(self, cfg, total_training_steps: int, rank: int = 0, world_size: int = 1):
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.total_training_steps = total_training_steps
        self.device = detect_device(cfg.trainer.device)
        self.torch_device = self.device.torch_device(int(os.environ.get("LOCAL_RANK", 0)))

    def init_model(self) -> dict:
        cfg = self.cfg
        critic_cfg = cfg.critic
        model_cfg = critic_cfg.get("model") or {}
        actor_model = cfg.actor_rollout_ref.model
        path = critic_model_path(cfg)
        trust = bool(actor_model.trust_remote_code)
        self.device.manual_seed(int(cfg.data.seed) + 1)  # the value head's initialisation
        self.tokenizer, self.processor = load_tokenizer_and_processor(path, trust_remote_code=trust)
        self.compute_dtype = self.device.train_dtype()
        module = load_value_model(
            path, dtype=torch.float32, attn_implementation=self.device.attn_implementation(),
            override_config=dict(model_cfg.get("override_config") or {}), trust_remote_code=trust,
            gradient_checkpointing=bool(model_cfg.get("enable_gradient_checkpointing", True)),
        )
        self.module = parallel.shard_module(module.to(self.torch_device), critic_cfg.model.fsdp_config, self.world_size,
                                            param_dtype=self.compute_dtype)
        # the group sends the ranks of an actor Ulysses group the same rows; the critic runs whole
        # sequences on each (no sequence parallelism), so its data-parallel size is the actor's
        self.sp = int(cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size)
        self.dp_size = self.world_size // self.sp
        self.optimizer_step = parallel.GuardedOptimizerStep("critic")
        self.optimizer = build_optimizer([p for p in self.module.parameters() if p.requires_grad], critic_cfg.optim)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, critic_cfg.optim, self.total_training_steps)
        return {"num_params": sum(p.numel() for p in self.module.parameters())}

    def _autocast(self):
        if self.compute_dtype == torch.float32 or parallel.fsdp_enabled(self.world_size):
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.torch_device.type, dtype=self.compute_dtype)

    def _micro(self, forward: bool) -> dict:
        """Micro-batching of a forward (compute_values) or of the update: by token budget with
        use_dynamic_bsz, else a fixed number of rows; the forward keys fall back to the update's."""
        c = self.cfg.critic
        if critic_setting(self.cfg, "use_dynamic_bsz"):
            budget = c.get("forward_max_token_len_per_gpu") if forward else None
            return {"max_token_len": int(budget or c.ppo_max_token_len_per_gpu)}
        rows = c.get("forward_micro_batch_size_per_gpu") if forward else None
        return {"micro_batch_size": int(rows or critic_setting(self.cfg, "ppo_micro_batch_size_per_gpu") or 1)}

    # ---- values ---------------------------------------------------------------------------------
    def compute_values(self, batch: Batch) -> Batch:
        """`values` [B, T] of the response tokens (times the response mask), in eval mode, no grad."""
        response_length = batch["responses"].shape[1]
        out = []
        self.module.eval()
        with torch.no_grad():
            for idx in micro_batch_indices(batch["attention_mask"], **self._micro(forward=True)):
                part = trim_left_padding(batch.select(idx)).to(self.torch_device)
                with self._autocast():
                    values = response_values(self.module, part["input_ids"], part["attention_mask"], response_length)
                out.append((values * part["response_mask"].float()).cpu())
        self.module.train()
        return Batch({"values": torch.cat(out)})

    # ---- update ---------------------------------------------------------------------------------
    def update_critic(self, batch: Batch) -> dict[str, float]:
        """`critic.ppo_epochs` passes over mini-batches of `critic.ppo_mini_batch_size` prompts (x
        rollout.n); one optimizer step per mini-batch, gradients accumulated over micro-batches with
        global token/sequence counts (the step equals one over the whole mini-batch, on any number
        of ranks). The loss is `algorithms.clipped_value_loss` against `returns`, clipped around
        the `values` computed before the update. Metrics: verl's critic/vf_loss, vf_clipfrac,
        vpred_mean (per mini-batch, averaged), grad_norm, lr."""
        c = self.cfg.critic
        n = int(self.cfg.actor_rollout_ref.rollout.n)
        mini_rows = max(1, int(critic_setting(self.cfg, "ppo_mini_batch_size")) * n // self.dp_size)
        epochs = int(critic_setting(self.cfg, "ppo_epochs"))
        loss_agg_mode = str(critic_setting(self.cfg, "loss_agg_mode"))
        response_length = batch["responses"].shape[1]
        generator = torch.Generator().manual_seed(int(self.cfg.data.seed) + int(self.lr_scheduler.last_epoch))
        sums: dict[str, list[float]] = {}
        self.module.train()
        for _ in range(epochs):
            order = torch.randperm(len(batch), generator=generator) if c.get("shuffle") else torch.arange(len(batch))
            for start in range(0, len(batch), mini_rows):
                mini = batch.select(order[start : start + mini_rows])
                # each row is held by `sp` ranks: the world sums count it sp times
                tokens = parallel.all_reduce_sum(float(mini["response_mask"].sum()), self.world_size,
                                                 self.torch_device) / self.sp
                seqs = parallel.all_reduce_sum(float((mini["response_mask"].sum(1) > 0).sum()), self.world_size,
                                               self.torch_device) / self.sp
                agg = dict(global_tokens=tokens, global_seqs=seqs, dp_size=self.dp_size,
                           loss_scale_factor=response_length)
                self.optimizer.zero_grad(set_to_none=True)
                for idx in micro_batch_indices(mini["attention_mask"], **self._micro(forward=False)):
                    part = trim_left_padding(mini.select(idx)).to(self.torch_device)
                    mask = part["response_mask"].float()
                    with self._autocast():
                        vpreds = response_values(self.module, part["input_ids"], part["attention_mask"],
                                                 response_length)
                    out = algorithms.clipped_value_loss(
                        vpreds, part["values"], part["returns"], mask, float(c.cliprange_value),
                        loss_agg_mode, **agg,
                    )
                    out["vf_loss"].backward()
                    share = float(mask.sum()) / max(tokens / self.dp_size, 1.0)
                    sums.setdefault("critic/vf_loss", []).append(float(out["vf_loss"].detach()))
                    sums.setdefault("critic/vf_clipfrac", []).append(float(out["vf_clipfrac"]) * share)
                    vpred_mean = algorithms.masked_mean(vpreds.detach(), mask)
                    sums.setdefault("critic/vpred_mean", []).append(float(vpred_mean) * share)
                grad_norm = self.optimizer_step(self.module, self.optimizer, float(c.grad_clip))
                sums.setdefault("critic/grad_norm", []).append(float(grad_norm))
        self.lr_scheduler.step()
        mini_batches = max(1, epochs * -(-len(batch) // mini_rows))
        metrics = {k: sum(v) / (len(v) if k == "critic/grad_norm" else mini_batches) for k, v in sums.items()}
        metrics["critic/lr"] = float(self.lr_scheduler.get_last_lr()[0])
        metrics.update(self.optimizer_step.metrics())
        return metrics

    # ---- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, critic_dir: str) -> None:
        """This rank's part of `critic_dir`, in the actor's (verl's) layout (`actor_ckpt.save_actor`)."""
        from verl_npu.workers.actor_ckpt import save_actor

        save_actor(self, critic_dir)

    def load_checkpoint(self, critic_dir: str) -> None:
        from verl_npu.workers.actor_ckpt import load_actor

        load_actor(self, critic_dir)

    def parameter_snapshot(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in parallel.full_state_dict(self.module).items()}

    def start_profile(self, folder: str) -> None:  # the critic is not profiled (the actor's profiler is)
        return None

    def stop_profile(self) -> None:
        return None
