"""The SFT run: data checked and tokenized, workers started, the step loop, validation, checkpoints, resume.

SPMD, as verl's `torchrun -m verl.trainer.sft_trainer`: every rank runs this loop on its own process (one
worker: this process; several: processes spawned here, joined by torch.distributed on the device's backend,
gloo on CPU). Step s reads the rows `StepSampler.rows(s)` of the training set; rank r trains on every
world_size-th of them, starting at r. Rank 0 writes what the RL runs write: the run log, metrics.jsonl, the
console line, TensorBoard, training_curves.png, and the checkpoint folders in verl's SFT layout:

    <trainer.default_local_dir>/global_step_N/   model/optim/extra_state_world_size_W_rank_R.pt, fsdp_config.json,
                                                 huggingface/ (config, tokenizer; weights with hf_model),
                                                 data_R.pt (the sampler's position), lora_train_meta.json (LoRA)
    <trainer.default_local_dir>/latest_checkpointed_iteration.txt

(no `actor/` level, unlike an RL checkpoint), written atomically by `CheckpointManager`.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from pathlib import Path

from verl_npu.errors import UserError

log = logging.getLogger("verl_npu")

SFT_CURVES = (
    ("loss", (("train/loss", "train/loss"), ("val/loss", "val/loss"))),
    ("grad norm", (("train/grad_norm", "train/grad_norm"),)),
    ("learning rate", (("train/lr", "train/lr"),)),
    ("assistant tokens per step", (("train/global_tokens", "train/global_tokens"),)),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def total_steps(cfg, steps_per_epoch: int) -> int:
    """trainer.total_training_steps, else steps per epoch x trainer.total_epochs."""
    if cfg.trainer.total_training_steps is not None:
        return int(cfg.trainer.total_training_steps)
    return int(steps_per_epoch) * int(cfg.trainer.total_epochs)


def prepare(rc):
    """Everything checked before any worker starts: the tokenizer, every training and validation row (tokenized),
    the step count. Returns (train set, val set or None, sampler, total steps)."""
    from verl_npu.data.sft_dataset import SFTDataset, StepSampler
    from verl_npu.models.loading import load_tokenizer_and_processor

    cfg = rc.typed
    tokenizer, _ = load_tokenizer_and_processor(
        cfg.model.tokenizer_path or cfg.model.path,
        trust_remote_code=cfg.model.trust_remote_code,
        custom_chat_template=cfg.model.custom_chat_template,
    )
    train = SFTDataset(cfg.data.train_files, tokenizer, cfg.data, cfg.data.train_max_samples)
    val = SFTDataset(cfg.data.val_files, tokenizer, cfg.data, cfg.data.val_max_samples) if cfg.data.val_files else None
    sampler = StepSampler(len(train), cfg.data.train_batch_size, cfg.data.shuffle, cfg.trainer.seed)
    if sampler.steps_per_epoch == 0:
        raise UserError(
            f"data.train_files has {len(train)} conversations, fewer than data.train_batch_size="
            f"{cfg.data.train_batch_size}: lower it or add data"
        )
    return train, val, sampler, total_steps(cfg, sampler.steps_per_epoch)


def run_sft(rc, *, after_fit=None) -> int:
    """Train as the SFT recipe `rc` (`verl_npu.config.sft.SFTRecipe`) says; the exit code. `after_fit(worker)`, a
    picklable function, is called on every rank once training has finished (tests read each rank's state)."""
    from verl_npu.device import detect_device
    from verl_npu.trainer.runlock import RunLock
    from verl_npu.trainer.tracking import setup_run_logging

    out_dir = rc.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    with RunLock(out_dir):
        setup_run_logging(out_dir)
        for warning in rc.warnings:
            log.warning("%s", warning)
        (out_dir / "exp-config.yaml").write_text(rc.to_yaml(), encoding="utf-8")
        device = detect_device(rc.typed.trainer.device)
        train, val, sampler, steps = prepare(rc)
        log.info(
            "SFT: %d conversations (%d steps per epoch, %d steps); device %s; %d worker(s); output %s",
            len(train),
            sampler.steps_per_epoch,
            steps,
            device.kind,
            rc.world_size,
            out_dir,
        )
        world = rc.world_size
        if world == 1:
            _rank_main(0, 1, rc, device, train, val, sampler, steps, after_fit, None)
        else:
            import torch.multiprocessing as mp

            problem = device.workers_problem(world, rc.typed.trainer.device, None)
            if problem:
                raise UserError(problem)
            port = _free_port()
            try:
                mp.spawn(
                    _rank_main,
                    args=(world, rc, device, train, val, sampler, steps, after_fit, port),
                    nprocs=world,
                    join=True,
                )
            except mp.ProcessRaisedException as exc:  # a rank's UserError stays a user's error (no traceback)
                marker = "verl_npu.errors.UserError: "
                text = str(exc)
                if marker in text:
                    raise UserError(f"worker rank {exc.error_index}: {text.rsplit(marker, 1)[1].strip()}") from None
                raise
    return 0


def _rank_main(rank, world, rc, device, train, val, sampler, steps, after_fit, port) -> None:
    import torch.distributed as dist

    from verl_npu.workers import parallel

    if world > 1:
        os.environ.update(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
        )
        device.set_device(rank)
        dist.init_process_group(backend=device.dist_backend, rank=rank, world_size=world)
    elif rc.typed.engine.param_offload:  # offloading is FSDP2's: one worker shards over a group of itself
        parallel.start_one_rank_group(device.dist_backend)
    try:
        _SFTLoop(rank, world, rc, device, train, val, sampler, steps).fit(after_fit)
    finally:
        if world > 1:
            dist.destroy_process_group()


class _SFTLoop:
    def __init__(self, rank, world, rc, device, train, val, sampler, steps):
        from verl_npu.sft.worker import SFTWorker
        from verl_npu.trainer.checkpoint import CheckpointManager

        self.rank, self.world, self.rc, self.cfg = rank, world, rc, rc.typed
        self.train_set, self.val_set, self.sampler, self.steps = train, val, sampler, steps
        device.use_kernels()
        self.worker = SFTWorker(self.cfg, steps, device, rank=rank, world_size=world)
        self.worker.init_model()
        self.pad_id = self.worker.tokenizer.pad_token_id or 0
        self.checkpoints = CheckpointManager(self.cfg.trainer.default_local_dir, self.cfg.trainer.max_ckpt_to_keep)

    def _my_rows(self, rows):
        from verl_npu.data.sft_dataset import collate

        return collate([self.train_set.rows[i] for i in rows[self.rank :: self.world]], self.pad_id)

    def fit(self, after_fit) -> None:
        from verl_npu.trainer.tracking import CurveRedraws, Tracker

        cfg = self.cfg
        latest = self.checkpoints.resolve_resume(cfg.trainer.resume_mode, cfg.trainer.resume_from_path)
        start = 0
        if latest is not None:
            self.worker.load(str(latest))
            start = self.checkpoints.step_of(latest)
            if self.rank == 0:
                log.info("resumed from %s (step %d)", latest, start)
        tracker = None
        if self.rank == 0:
            tracker = Tracker(
                self.rc.out_dir,
                list(cfg.trainer.logger),
                cfg.trainer.project_name,
                cfg.trainer.experiment_name,
                resume_step=start,
                tensorboard_dir=cfg.trainer.tensorboard_dir,
                run_config=self.rc.tree,
            )
            tracker.total_steps = self.steps
        curves = CurveRedraws()
        try:
            for step in range(start + 1, self.steps + 1):
                metrics = self.worker.train_step(self._my_rows(self.sampler.rows(step - 1)))
                metrics["train/epoch"] = (step - 1) // self.sampler.steps_per_epoch
                metrics["training/global_step"] = step
                last = step == self.steps
                if self.val_set is not None and (self._due(cfg.trainer.test_freq, step) or last):
                    metrics["val/loss"] = self.validate()
                if self._due(cfg.trainer.save_freq, step) or last:
                    self.save(step)
                if tracker is not None:
                    tracker.log(metrics, step=step)
                if tracker is not None and curves.due(step, last):  # drawing costs more than a tiny step
                    curves.draw(
                        self.rc.out_dir / "metrics.jsonl", self.rc.out_dir / "training_curves.png", panels=SFT_CURVES
                    )
            if after_fit is not None:
                after_fit(self.worker)
        finally:
            if tracker is not None:
                tracker.close()

    def _due(self, freq, step: int) -> bool:
        """Whether a save / validation every `freq` steps (verl's "after_each_epoch": at each epoch's last step)
        falls on `step`."""
        if freq == "after_each_epoch":
            return step % self.sampler.steps_per_epoch == 0
        return freq > 0 and step % freq == 0

    def validate(self) -> float:
        """The token-mean NLL of the assistant tokens of the whole validation set (every rank a share; ranks
        with fewer rows run a masked copy so that all run the same forwards)."""
        from dataclasses import replace

        from verl_npu.data.sft_dataset import collate

        rows = self.val_set.rows
        mine = rows[self.rank :: self.world]
        per_rank = math.ceil(len(rows) / self.world)
        mine = mine + [replace(rows[0], loss_mask=(0,) * len(rows[0].loss_mask))] * (per_rank - len(mine))
        size = int(self.cfg.data.micro_batch_size_per_gpu)
        total = tokens = 0.0
        for i in range(0, per_rank, size):
            part_total, part_tokens = self.worker.val_loss(collate(mine[i : i + size], self.pad_id))
            total, tokens = total + part_total, tokens + part_tokens
        return total / max(tokens, 1.0)

    def save(self, step: int) -> None:
        """Checkpoint `step` (a collective): rank 0 makes the temp folder and moves it into place when every rank
        has written its files."""
        import torch.distributed as dist

        from verl_npu.workers.torch_files import save_torch

        def write(folder: Path) -> None:
            path = [str(folder)]
            if self.world > 1:
                dist.broadcast_object_list(path, src=0)
            self.worker.save(path[0])
            save_torch(self.sampler.state(step), Path(path[0]) / f"data_{self.rank}.pt")
            if self.world > 1:
                dist.barrier()

        if self.rank == 0:
            self.checkpoints.save(step, write)
        else:
            write(Path("."))
        if self.world > 1:
            dist.barrier()
