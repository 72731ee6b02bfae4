"""The SFT role: the policy's log-probs as forward and the masked negative log-likelihood as loss, over the
shared `TrainingEngine` (FSDP2, dtype, offload, LoRA, the guarded optimizer step, checkpoints in verl's layout).

Loss of one optimizer step, over the global batch B of every rank (verl's token-mean SFT loss):

    loss = - sum_{rows in B} sum_t mask[t] * log p(token_t | tokens_<t)  /  sum_{rows in B} sum_t mask[t]

with mask the assistant-token mask (`verl_npu.data.sft_dataset`). Each micro-batch adds its share
(`algorithms.agg_loss` token-mean with the global token count and the data-parallel size), so the gradient is the
same on one worker or several.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from verl_npu.algorithms import agg_loss
from verl_npu.batch import Batch
from verl_npu.models.forward import response_log_probs
from verl_npu.models.loading import load_policy_model, load_tokenizer_and_processor
from verl_npu.workers import parallel
from verl_npu.workers.engine import TrainingEngine, micro_batching

ROLE = "train"  # the metrics' prefix, as verl's SFT trainer names them (train/loss, train/grad_norm, train/lr)


def optim_section(optim) -> SimpleNamespace:
    """The SFT `optim` section in the names `verl_npu.optim` reads (lr_scheduler_type is its warmup_style; verl's
    engine schedules count the first update as step 0)."""
    return SimpleNamespace(
        lr=optim.lr,
        weight_decay=optim.weight_decay,
        betas=optim.betas,
        lr_warmup_steps=optim.lr_warmup_steps,
        lr_warmup_steps_ratio=optim.lr_warmup_steps_ratio,
        warmup_style=optim.lr_scheduler_type,
        min_lr_ratio=optim.min_lr_ratio,
        num_cycles=optim.num_cycles,
        zero_indexed_step=True,
        _path_="backend_config.optim",
    )


class SFTWorker:
    """One rank's model for SFT. `cfg`: the typed SFT backend config (`verl_npu.config.sft.Node`)."""

    def __init__(self, cfg, total_training_steps: int, device, rank: int = 0, world_size: int = 1):
        self.cfg, self.device, self.rank, self.world_size = cfg, device, rank, world_size
        self.total_training_steps = total_training_steps
        self.engine = TrainingEngine(
            ROLE, device, seed=cfg.trainer.seed, checkpoint=cfg.checkpoint, rank=rank, world_size=world_size
        )
        if cfg.engine.dtype == "float32":
            self.engine.compute_dtype = torch.float32

    def init_model(self) -> None:
        model = self.cfg.model
        self.device.manual_seed(self.cfg.engine.seed)
        self.tokenizer, self.processor = load_tokenizer_and_processor(
            model.tokenizer_path or model.path,
            trust_remote_code=model.trust_remote_code,
            custom_chat_template=model.custom_chat_template,
        )
        self.engine.tokenizer, self.engine.processor = self.tokenizer, self.processor
        module = load_policy_model(
            model.path,
            dtype=torch.float32,
            attn_implementation=self.device.attn_implementation(),
            override_config=dict(model.override_config),
            trust_remote_code=model.trust_remote_code,
            external_lib=model.external_lib,
            gradient_checkpointing=model.enable_gradient_checkpointing,
        )
        self.engine.attach(module, self.cfg.engine, model_cfg=model)
        self.engine.add_optimizer(optim_section(self.cfg.optim), self.total_training_steps)

    module = property(lambda self: self.engine.module)

    def _micro(self) -> dict:
        data = self.cfg.data
        return micro_batching(data.use_dynamic_bsz, data.max_token_len_per_gpu, data.micro_batch_size_per_gpu)

    def _forward(self, module, part: Batch) -> torch.Tensor:
        log_probs, _ = response_log_probs(
            module,
            part["input_ids"],
            part["attention_mask"],
            part["responses"].shape[1],
            remove_padding=self.cfg.model.use_remove_padding,
        )
        return log_probs

    @staticmethod
    def _loss(part: Batch, log_probs, mask, agg):
        nll = -log_probs.float()
        loss = agg_loss(nll, mask, "token-mean", global_tokens=agg["global_tokens"], dp_size=agg["dp_size"])
        return loss, {f"{ROLE}/loss_sum": (nll * mask).sum(), f"{ROLE}/tokens": mask.sum()}

    def train_step(self, batch: Batch) -> dict:
        """One optimizer step on this rank's rows of the step's batch; metrics of the whole step: train/loss
        (token-mean over every rank's assistant tokens), train/grad_norm, train/lr, train/global_tokens."""
        result = self.engine.train(
            batch,
            self._forward,
            self._loss,
            mini_rows=max(len(batch), 1),
            epochs=1,
            shuffle=False,
            micro=self._micro(),
            grad_clip=self.cfg.optim.clip_grad,
            summed=(f"{ROLE}/loss_sum", f"{ROLE}/tokens"),
        )
        metrics = dict(result)
        total = parallel.all_reduce_sum(metrics.pop(f"{ROLE}/loss_sum", 0.0), self.world_size, self.engine.torch_device)
        tokens = parallel.all_reduce_sum(metrics.pop(f"{ROLE}/tokens", 0.0), self.world_size, self.engine.torch_device)
        metrics[f"{ROLE}/loss"] = total / max(tokens, 1.0)
        metrics[f"{ROLE}/global_tokens"] = tokens
        return metrics

    def val_loss(self, batch: Batch) -> tuple[float, float]:
        """(sum of the NLL over the assistant tokens, their count) of `batch` over every rank."""
        mask = batch["response_mask"].float()
        log_probs = self.engine.infer(batch, self._forward, self._micro()) if len(batch) else torch.zeros_like(mask)
        total = parallel.all_reduce_sum(
            float((-log_probs.float() * mask).sum()), self.world_size, self.engine.torch_device
        )
        tokens = parallel.all_reduce_sum(float(mask.sum()), self.world_size, self.engine.torch_device)
        return total, tokens

    def save(self, folder: str) -> None:
        self.engine.save(folder)

    def load(self, folder: str) -> None:
        self.engine.load(folder)
