"""The critic worker (PPO with GAE): a value model on every rank, colocated with the actor.

The value model (`verl_npu.models.value_model.load_value_model`) of `critic.model.path` (default: the
actor's model) gives one value per token:
- a text model: its transformers token-classification model with one label, the backbone's final
  hidden state at every position through one Linear (`score`, hidden -> 1) (verl's critic is the same
  model class, so the checkpoint's parameter names match verl's);
- a vision-language model (Qwen2/2.5-VL; transformers has no token-classification class for it): the
  class the actor loads (vision tower included) under `pretrained_model`, with a value head
  `v_head.summary` (Linear hidden -> 1): verl's names for such a critic (trl's value-head model).
Its own FSDP2 shards (`critic.model.fsdp_config`), AdamW and LR schedule (`critic.optim`).

The value of response token t is read at the position that predicts it (the hidden state of the
token before it), as the actor's log-prob of token t is, by the actor's forward code
(`verl_npu.models.forward.response_values`): the images and 3-D rope positions of a vision-language
row, and with `critic.model.use_remove_padding` the padding-free path (each shared prompt once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from verl_npu import algorithms
from verl_npu.batch import Batch, reads
from verl_npu.config.schema import CRITIC_FROM_ACTOR
from verl_npu.models.forward import response_values
from verl_npu.models.loading import load_tokenizer_and_processor
from verl_npu.models.value_model import load_value_model
from verl_npu.registry import ROLES
from verl_npu.workers.engine import TrainingEngine, micro_batching

if TYPE_CHECKING:
    from verl_npu.config.sections import BackendConfigSection


def critic_setting(cfg: BackendConfigSection, key: str):
    """`critic.<key>` of the typed backend config; for the keys of CRITIC_FROM_ACTOR (the schema's) a null reads
    `actor_rollout_ref.actor.<key>`."""
    value = cfg.critic[key]
    if value is None and key in CRITIC_FROM_ACTOR:
        value = cfg.actor_rollout_ref.actor[key]
    return value


def critic_model_path(cfg: BackendConfigSection) -> str:
    """`critic.model.path`, or the actor's model when it is null."""
    return cfg.critic.model.path or cfg.actor_rollout_ref.model.path


@ROLES.register(
    "critic",
    needed_when=("critic.enable", "estimator.needs_critic"),
    metrics="critic",
    trains=True,
    keep_key="trainer.max_critic_ckpt_to_keep",
    model_key="critic.model.path",
    methods=("compute_values", "update_critic"),
    doc="value model (a value head on a transformers model) for gae",
)
class CriticWorker:
    """The critic role: the value model's engine, trained with the clipped value loss."""

    def __init__(
        self, cfg: BackendConfigSection, total_training_steps: int, device, rank: int = 0, world_size: int = 1
    ):
        """`cfg`: the typed backend config (the critic section, and the actor's values its nulls stand for)."""
        self.cfg = cfg
        self.total_training_steps = total_training_steps
        self.engine = TrainingEngine.for_trained_role("critic", cfg, device, rank, world_size)

    def init_model(self) -> dict:
        cfg, engine = self.cfg, self.engine
        critic_cfg = cfg.critic
        model_cfg = critic_cfg.model
        path = critic_model_path(cfg)
        trust = cfg.actor_rollout_ref.model.trust_remote_code
        engine.device.manual_seed(cfg.data.seed + 1)  # the value head's initialisation
        engine.tokenizer, engine.processor = load_tokenizer_and_processor(path, trust_remote_code=trust)
        module = load_value_model(
            path,
            dtype=torch.float32,
            attn_implementation=engine.device.attn_implementation(),
            override_config=dict(model_cfg.override_config),
            trust_remote_code=trust,
            gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
        )
        engine.attach(module, model_cfg.fsdp_config)
        # the group sends the ranks of an actor Ulysses group the same rows; the critic runs whole
        # sequences on each (no sequence parallelism), so its data-parallel size is the actor's
        engine.dp_size = engine.world_size // cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size
        engine.add_optimizer(critic_cfg.optim, self.total_training_steps)
        return {"num_params": sum(p.numel() for p in engine.module.parameters())}

    def _micro(self, forward: bool) -> dict:
        """Micro-batching of a forward (compute_values) or of the update: by token budget with
        use_dynamic_bsz, else a fixed number of rows; the forward keys fall back to the update's."""
        c = self.cfg.critic
        budget = c.forward_max_token_len_per_gpu if forward else None
        rows = c.forward_micro_batch_size_per_gpu if forward else None
        return micro_batching(
            critic_setting(self.cfg, "use_dynamic_bsz"),
            budget or c.ppo_max_token_len_per_gpu,
            int(rows or critic_setting(self.cfg, "ppo_micro_batch_size_per_gpu") or 1),
        )

    def _values(self, module, part: Batch) -> torch.Tensor:
        """The critic's forward: values [B, T] of a micro-batch's response tokens."""
        return response_values(
            module,
            part["input_ids"],
            part["attention_mask"],
            part["responses"].shape[1],
            multi_modal_inputs=part.get("multi_modal_inputs"),
            remove_padding=self.cfg.critic.model.use_remove_padding,
        )

    # multi_modal_inputs: a vision-language critic's forward reads the images (main's value_model)
    @reads("input_ids", "attention_mask", "responses", "response_mask", "multi_modal_inputs")
    def compute_values(self, batch: Batch) -> Batch:
        """`values` [B, T] of the response tokens (times the response mask), in eval mode, no grad."""

        def masked_values(module, part):
            return self._values(module, part) * part["response_mask"].float()

        return Batch({"values": self.engine.infer(batch, masked_values, self._micro(forward=True))})

    @reads("input_ids", "attention_mask", "responses", "response_mask", "multi_modal_inputs", "values", "returns")
    def update_critic(self, batch: Batch) -> dict[str, float]:
        """`critic.ppo_epochs` passes over mini-batches of `critic.ppo_mini_batch_size` prompts (x
        rollout.n); one optimizer step per mini-batch, gradients accumulated over micro-batches with
        global token/sequence counts (`TrainingEngine.train`: the step equals one over the whole
        mini-batch, on any number of ranks). The loss is `algorithms.clipped_value_loss` against
        `returns`, clipped around the `values` computed before the update. Metrics: verl's
        critic/vf_loss, vf_clipfrac, vpred_mean (per mini-batch, averaged), grad_norm, lr."""
        c = self.cfg.critic
        loss_agg_mode = critic_setting(self.cfg, "loss_agg_mode")

        def value_loss(part, vpreds, mask, agg):
            out = algorithms.clipped_value_loss(
                vpreds, part["values"], part["returns"], mask, c.cliprange_value, loss_agg_mode, **agg
            )
            return out["vf_loss"], {
                "critic/vf_loss": out["vf_loss"],
                "critic/vf_clipfrac": out["vf_clipfrac"],
                "critic/vpred_mean": algorithms.masked_mean(vpreds.detach(), mask),
            }

        n = self.cfg.actor_rollout_ref.rollout.n
        return self.engine.train(
            batch,
            self._values,
            value_loss,
            mini_rows=max(1, critic_setting(self.cfg, "ppo_mini_batch_size") * n // self.engine.dp_size),
            epochs=critic_setting(self.cfg, "ppo_epochs"),
            shuffle=c.shuffle,
            micro=self._micro(forward=False),
            grad_clip=c.grad_clip,
            summed=("critic/vf_loss",),
        )

    def save_checkpoint(self, critic_dir: str) -> None:
        """This rank's part of `critic_dir`, in the actor's (verl's) layout (`TrainingEngine.save`)."""
        self.engine.save(critic_dir)

    def load_checkpoint(self, critic_dir: str) -> None:
        self.engine.load(critic_dir)
