"""The training engine: one model on one worker, trainable or frozen.

Every role is a forward function (and, when it trains, a loss) over an engine; the engine owns
what all of them share:
- the device and the rank, the compute dtype and its autocast;
- the module: loaded by the role, then LoRA adapters (peft), the vision tower frozen when asked,
  moved to the device and FSDP2-sharded (parameter offloading: `parallel.shard_module`);
- the optimizer, its LR schedule and the guarded step (clipping, the non-finite-gradient skip);
- `infer`: a forward over micro-batches, in eval mode, without gradients;
- `train`: epochs of mini-batches, one optimizer step each, gradients accumulated over
  micro-batches (rows or a token budget) with losses scaled by the mini-batch's global counts;
  optionally keeping per-row outputs of its forward as columns (`keep`: the skipped old-log-prob pass);
- checkpoints in verl's layout (`actor_ckpt`), the full weights (also as a rollout engine takes
  them: `rollout_weights`), and snapshots for tests.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import torch

from verl_npu.algorithms.distillation import MAX_METRICS, MIN_METRICS
from verl_npu.batch import Batch, trim_left_padding
from verl_npu.models import lora
from verl_npu.optim import build_lr_scheduler, build_optimizer
from verl_npu.workers import actor_ckpt, parallel
from verl_npu.workers.micro import micro_batch_indices

log = logging.getLogger("verl_npu")
#: metrics that are a minimum or a maximum over tokens: reduced with min / max over micro-batches and ranks
EXTREMES: dict[str, Callable] = {**{key: min for key in MIN_METRICS}, **{key: max for key in MAX_METRICS}}


def micro_batching(dynamic: bool, max_token_len, rows: int | None, sp: int = 1) -> dict:
    """The keywords of `micro_batch_indices`: a budget of `max_token_len` tokens per micro-batch
    when `dynamic` (use_dynamic_bsz), else `rows` rows (None: the whole batch at once). `max_token_len`
    is per device: with Ulysses sequence parallelism over `sp` ranks each rank holds 1/sp of every
    sequence, so a micro-batch packs `max_token_len * sp` tokens, as in verl."""
    return {"max_token_len": int(max_token_len) * int(sp)} if dynamic else {"micro_batch_size": rows}


class TrainResult(dict):
    """What an update returns: its metrics (this dict) and `columns`, a `Batch` of per-row outputs of the
    update's own forward that the role asked to keep (`TrainingEngine.train(keep=...)`; usually empty),
    in the row order of the batch it was given. A dict, so callers that read metrics read it as before."""

    def __init__(self, metrics: dict[str, float], columns: Batch | None = None):
        super().__init__(metrics)
        self.columns = columns if columns is not None else Batch()


class TrainingEngine:
    """One model of role `role` on this rank, on `device` (the run's `DeviceInfo`). `seed` is
    data.seed (the mini-batch shuffle's; None for a frozen engine); `checkpoint` the
    `actor_rollout_ref.actor.checkpoint` section (what a checkpoint saves and loads; None for an engine
    that is never saved); `tokenizer` /
    `processor`, set by the role, go into a checkpoint's huggingface/ folder. `dp_size` is the
    data-parallel size (world size / Ulysses size)."""

    @classmethod
    def for_trained_role(cls, role: str, cfg, device, rank: int, world_size: int) -> TrainingEngine:
        """The engine of a PPO role that trains (actor, critic) from the typed backend config `cfg`: data.seed
        shuffles its mini-batches, and its checkpoints hold what actor.checkpoint.* says (a critic's in the
        actor's layout)."""
        return cls(
            role,
            device,
            seed=cfg.data.seed,
            checkpoint=cfg.actor_rollout_ref.actor.checkpoint,
            rank=rank,
            world_size=world_size,
        )

    def __init__(
        self, role: str, device, *, seed: int | None = None, checkpoint=None, rank: int = 0, world_size: int = 1
    ):
        self.role, self.device, self.seed, self.checkpoint = role, device, seed, checkpoint
        self.rank, self.world_size, self.dp_size = rank, world_size, world_size
        self.offload_activations = False  # model.enable_activation_offload (set by the role)
        self.torch_device = device.worker_device()
        # master weights and optimizer state in the dtype the role loads (fp32 unless the actor's
        # fsdp_config.model_dtype says bf16); forward/backward in the device's compute dtype
        # (bf16 on accelerators that have it): FSDP2 mixed precision with several workers, autocast with one
        self.compute_dtype = device.train_dtype()
        self.module = self.peft_model = self.optimizer = self.lr_scheduler = None
        self.tokenizer = self.processor = None

    # ---- set-up ------------------------------------------------------------------------------
    def attach(self, module: torch.nn.Module, fsdp_cfg, *, model_cfg=None, freeze_vision_tower: bool = False):
        """Make the role's freshly loaded `module` this engine's: LoRA adapters when `model_cfg` asks
        for them (peft injects them before sharding; the engine computes with the transformers model
        inside and keeps the peft wrapper for disabling and saving the adapters), the vision tower
        frozen when asked, then moved to this rank's device and FSDP2-sharded with `fsdp_cfg`; returns
        that module."""
        if model_cfg is not None and lora.lora_enabled(model_cfg):
            self.peft_model = lora.wrap_lora(module, model_cfg)
            module = self.peft_model.get_base_model()
            log.info("LoRA: %s parameters", lora.trainable_summary(module))
        if freeze_vision_tower:
            from verl_npu.models.freeze import freeze_vision_tower as freeze

            log.info("freeze_vision_tower: %d vision-tower parameters frozen", freeze(module))
        self.module = parallel.shard_module(
            module.to(self.torch_device), fsdp_cfg, self.world_size, param_dtype=self.compute_dtype
        )
        return self.module

    def add_optimizer(self, optim_cfg, total_training_steps: int) -> None:
        """AdamW over the trainable parameters, its LR schedule over `total_training_steps`, and the
        guarded step whose metrics are named `<role>/skipped_updates...`."""
        self.optimizer_step = parallel.GuardedOptimizerStep(self.role)
        self.optimizer = build_optimizer([p for p in self.module.parameters() if p.requires_grad], optim_cfg)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, optim_cfg, total_training_steps)

    def autocast(self):
        """Compute-dtype autocast for a module that is not FSDP2-sharded (FSDP2 casts by itself)."""
        if self.compute_dtype == torch.float32 or parallel.fsdp_enabled(self.world_size):
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.torch_device.type, dtype=self.compute_dtype)

    def _parts(self, batch: Batch, micro: dict) -> Iterator[tuple[list[int], Batch]]:
        """(row indices, micro-batch) of `batch`'s micro-batches (split by its attention mask, `micro`: the
        keywords of `micro_batch_indices`), each without the left padding all its rows share, on this device."""
        for idx in micro_batch_indices(batch["attention_mask"], **micro):
            yield idx, trim_left_padding(batch.select(idx)).to(self.torch_device)

    # ---- forward and update ------------------------------------------------------------------
    def infer(self, batch: Batch, fn: Callable, micro: dict):
        """`fn(module, part)` on every micro-batch `part` of `batch` (see `_parts`) under `autocast`,
        in eval mode and without gradients. `fn` gives a tensor, or a tuple of tensors or Nones, with
        one row per row of `part`; the result is the same, concatenated over the micro-batches in
        row order, on the CPU."""
        outs = []
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                for _, part in self._parts(batch, micro):
                    with self.autocast():
                        out = fn(self.module, part)
                    outs.append(
                        tuple(t.cpu() if t is not None else None for t in out) if isinstance(out, tuple) else out.cpu()
                    )
        finally:
            self.module.train(was_training)
        if not isinstance(outs[0], tuple):
            return torch.cat(outs)
        return tuple(torch.cat(column) if column[0] is not None else None for column in zip(*outs))

    def train(
        self,
        batch: Batch,
        forward: Callable,
        loss_fn: Callable,
        *,
        mini_rows: int,
        epochs: int,
        shuffle: bool,
        micro: dict,
        grad_clip: float,
        summed: tuple[str, ...] = (),
        keep: Callable | None = None,
    ) -> TrainResult:
        """`epochs` passes over mini-batches of `mini_rows` rows (in a seeded random order with
        `shuffle`); one optimizer step per mini-batch, gradients accumulated over its micro-batches.

        Per micro-batch `part` (see `_parts`): `out = forward(module, part)` under `autocast`, then
        `loss, stats = loss_fn(part, out, mask, agg)` with `mask` the float response mask and `agg`
        the mini-batch's global token and sequence counts (over every rank; Ulysses peers hold the
        same rows and count once), so that the micro-batch losses add up to the mini-batch's loss
        on any number of ranks. Metrics: each stat per mini-batch (the keys in `summed` are already
        shares of the mini-batch and are added; the others are micro-batch means, weighted by their
        share of the tokens), averaged over mini-batches (the minima and maxima of `EXTREMES`: their min / max);
        `<role>/grad_norm` (before clipping,
        averaged over optimizer steps), `<role>/lr` and the guarded step's counts.

        `keep(out)`, when given, names per-row tensors of each forward's output ({column: [rows, ...]});
        they come back detached, on the CPU, as the result's `columns` in `batch`'s row order (the last
        epoch's: with one epoch of one mini-batch, what a separate forward before the update would give,
        which is how the actor skips its old-log-prob pass)."""
        response_length = batch["responses"].shape[1]
        sp = self.world_size // self.dp_size
        generator = torch.Generator().manual_seed(self.seed + int(self.lr_scheduler.last_epoch))
        grad_key = f"{self.role}/grad_norm"
        sums: dict[str, list[float]] = {}
        kept: dict[str, torch.Tensor] = {}
        self.module.train()
        for _ in range(epochs):
            order = torch.randperm(len(batch), generator=generator) if shuffle else torch.arange(len(batch))
            for start in range(0, len(batch), mini_rows):
                mini = batch.select(order[start : start + mini_rows])
                tokens = (
                    parallel.all_reduce_sum(float(mini["response_mask"].sum()), self.world_size, self.torch_device) / sp
                )
                seqs = (
                    parallel.all_reduce_sum(
                        float((mini["response_mask"].sum(1) > 0).sum()), self.world_size, self.torch_device
                    )
                    / sp
                )
                # at least 1: a mini-batch whose every token was rejected (rollout correction) has a zero loss
                agg = dict(
                    global_tokens=max(tokens, 1.0),
                    global_seqs=max(seqs, 1.0),
                    dp_size=self.dp_size,
                    loss_scale_factor=response_length,
                )
                self.optimizer.zero_grad(set_to_none=True)
                rows_of_mini = order[start : start + mini_rows]
                for idx, part in self._parts(mini, micro):
                    mask = part["response_mask"].float()
                    offload = (
                        self.device.offload_activations() if self.offload_activations else contextlib.nullcontext()
                    )
                    with self.autocast(), offload:
                        out = forward(self.module, part)
                    if keep is not None:
                        for name, value in keep(out).items():
                            column = kept.setdefault(
                                name, value.new_zeros((len(batch), *value.shape[1:]), device="cpu")
                            )
                            column[rows_of_mini[idx]] = value.detach().cpu()
                    loss, stats = loss_fn(part, out, mask, agg)
                    loss.backward()
                    share = float(mask.sum()) / max(tokens / self.dp_size, 1.0)
                    for key, value in stats.items():
                        value = float(value.detach()) if torch.is_tensor(value) else float(value)
                        whole = key in summed or key in EXTREMES  # a share already, or a min / max
                        sums.setdefault(key, []).append(value if whole else value * share)
                grad_norm = self.optimizer_step(self.module, self.optimizer, grad_clip)
                sums.setdefault(grad_key, []).append(float(grad_norm))
        self.lr_scheduler.step()
        mini_batches = max(1, epochs * -(-len(batch) // mini_rows))
        metrics = {
            key: EXTREMES[key](values)
            if key in EXTREMES
            else sum(values) / (len(values) if key == grad_key else mini_batches)
            for key, values in sums.items()
        }
        metrics[f"{self.role}/lr"] = float(self.lr_scheduler.get_last_lr()[0])
        metrics.update(self.optimizer_step.metrics())
        return TrainResult(metrics, Batch(kept))

    # ---- checkpoints and weights -------------------------------------------------------------
    def save(self, folder: str) -> None:
        """This rank's part of `folder` in verl's layout (`actor_ckpt.save_actor`); a collective."""
        actor_ckpt.save_actor(self, folder)

    def load(self, folder: str) -> None:
        """This rank's files of a folder of verl-npu or verl (`actor_ckpt.load_actor`)."""
        actor_ckpt.load_actor(self, folder)

    def full_weights(self, *, dtype: torch.dtype | None = None, device=None) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, whole tensor) of every state-dict entry, on every rank (a collective:
        `parallel.iter_full_tensors`, one bucket gathered at a time)."""
        return parallel.iter_full_tensors(self.module, dtype=dtype, device=device)

    def rollout_weights(self, *, dtype: torch.dtype | None, bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
        """What a rollout engine's `update_weights` takes: (Hugging Face name, whole tensor) of the
        base model, floating tensors in `dtype` (None: as they are), gathered `bucket_bytes` at a
        time; a LoRA module's layers come merged (W + B @ A * scaling, `lora.merged_tensors`). Lazy:
        nothing is gathered before the engine reads it, and then on every rank (a collective)."""
        if lora.is_lora(self.module):
            full = parallel.iter_full_tensors(self.module, bucket_bytes=bucket_bytes)
            yield from lora.merged_tensors(self.module, full, dtype=dtype)
        else:
            yield from parallel.iter_full_tensors(self.module, dtype=dtype, bucket_bytes=bucket_bytes)

    def parameter_snapshot(self) -> dict[str, torch.Tensor]:
        """This rank's view of the full weights, cloned on the CPU (a collective)."""
        return {name: tensor.detach().cpu().clone() for name, tensor in self.full_weights(device="cpu")}

    def training_state_snapshot(self) -> dict:
        """What a resume restores, as whole tensors on the CPU (a collective): `params` and AdamW's
        `exp_avg` / `exp_avg_sq` / `step` by parameter name, the scheduler's `last_epoch` and `lr`,
        and this process's torch CPU RNG state."""
        moments = {}
        for name, param in self.module.named_parameters():
            state = self.optimizer.state.get(param, {})
            moments[name] = {
                k: parallel._gathered(state[k]).cpu().clone() for k in ("exp_avg", "exp_avg_sq") if k in state
            }
            if "step" in state:
                moments[name]["step"] = float(state["step"])
        return {
            "params": self.parameter_snapshot(),
            "moments": moments,
            "last_epoch": int(self.lr_scheduler.last_epoch),
            "lr": float(self.lr_scheduler.get_last_lr()[0]),
            "torch_cpu_rng": torch.get_rng_state(),
        }
