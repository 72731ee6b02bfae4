"""A trained role's checkpoint folder (`global_step_N/actor/`, `critic/`) in upstream verl's format.

`TrainingEngine.save` / `load` write and read it; `worker` below is such an engine.

Files, as verl's FSDP checkpoint manager writes and reads them (so that verl's model merger and
verl's resume read ours, and ours reads verl's); W is the world size, R the rank:

    model_world_size_W_rank_R.pt        `module.state_dict()` of rank R: FSDP2 DTensor shards on
                                        a mesh whose one dimension is named "fsdp" (one worker:
                                        DTensors of a one-rank mesh, as verl writes them)
    optim_world_size_W_rank_R.pt        `optimizer.state_dict()` of rank R (AdamW moments as shards)
    extra_state_world_size_W_rank_R.pt  {"lr_scheduler": scheduler.state_dict(),
                                         "rng": {"cpu", "numpy", "random"[, device kind]}}
    fsdp_config.json                    {"FSDP_version": 2, "world_size": W} (rank 0)
    lora_train_meta.json                LoRA only: {"r", "lora_alpha", "task_type"} (rank 0)
    huggingface/                        config, generation config, tokenizer / processor always;
                                        the full weights (safetensors) when `hf_model` is saved

Which of them a save writes and a resume reads follows `actor.checkpoint.save_contents` /
`load_contents` (verl's keys and meanings: model, optimizer, extra; hf_model on save).
"""

from __future__ import annotations

import errno
import json
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl_npu.errors import UserError, is_disk_full
from verl_npu.workers import parallel
from verl_npu.workers.torch_files import load_torch, save_torch

log = logging.getLogger("verl_npu")

FSDP_CONFIG_FILE = "fsdp_config.json"
HF_DIR = "huggingface"
#: what verl's FSDP_version records: verl-npu shards with FSDP2 (`fully_shard`)
FSDP_VERSION = 2
#: `save_contents` entry -> the per-rank file kind it writes (hf_model writes huggingface/ weights)
CONTENT_FILES = {"model": "model", "optimizer": "optim", "extra": "extra_state"}


def rank_file(kind: str, world_size: int, rank: int) -> str:
    """verl's per-rank file name, e.g. `model_world_size_2_rank_1.pt`."""
    return f"{kind}_world_size_{int(world_size)}_rank_{int(rank)}.pt"


def checkpoint_contents(checkpoint_cfg) -> tuple[list[str], list[str]]:
    """(save_contents, load_contents) of the `actor_rollout_ref.actor.checkpoint` section."""
    return list(checkpoint_cfg.save_contents), list(checkpoint_cfg.load_contents)


# ---- extra state (LR schedule and RNG) -----------------------------------------------------------
def extra_state(lr_scheduler, device) -> dict[str, Any]:
    """What verl keeps in `extra_state_*.pt`: the scheduler's state and this process's RNGs under
    verl's names (`cpu`: torch, `numpy`, `random`: Python, and the device kind's generator)."""
    return {
        "lr_scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else None,
        "rng": {
            "cpu": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "random": random.getstate(),
            **device.current_rng_state(),
        },
    }


def restore_extra_state(extra: Any, lr_scheduler, device, path: Path) -> None:
    """Restore `extra_state` (verl's format, or the `{"cpu", "device"}` RNG of older verl-npu
    checkpoints). A file without `lr_scheduler` is a UserError naming it."""
    if not isinstance(extra, dict) or "lr_scheduler" not in extra:
        raise UserError(f"{path} is not an extra state of verl or verl-npu (it has no lr_scheduler)")
    if extra["lr_scheduler"] is not None and lr_scheduler is not None:
        lr_scheduler.load_state_dict(extra["lr_scheduler"])
    rng = extra.get("rng")
    if not isinstance(rng, dict):
        log.warning("%s holds no RNG state (an old verl checkpoint): the random streams start afresh", path)
        return
    torch.set_rng_state(rng["cpu"])
    if "numpy" in rng:
        np.random.set_state(rng["numpy"])
    if "random" in rng:
        random.setstate(rng["random"])
    if "device" in rng:  # older verl-npu: {kind: [state per visible device]}
        device.set_rng_state(rng["device"])
    else:
        device.set_current_rng_state(rng)


# ---- fsdp_config.json -----------------------------------------------------------------------------
def write_fsdp_config(actor_dir: Path, world_size: int) -> None:
    (Path(actor_dir) / FSDP_CONFIG_FILE).write_text(
        json.dumps({"FSDP_version": FSDP_VERSION, "world_size": int(world_size)}, indent=4), encoding="utf-8"
    )


LORA_META_FILE = "lora_train_meta.json"
#: a LoRA actor's FSDP2 root is the transformers model inside peft; verl's root is the peft model,
#: so its files name parameters `base_model.model.<name>` (and verl's merger expects that)
PEFT_PREFIX = "base_model.model."


def write_lora_train_meta(actor_dir: Path, peft_model) -> None:
    """verl's `lora_train_meta.json` ({"r", "lora_alpha", "task_type"}) for a LoRA actor: verl's model
    merger reads the adapter's rank and alpha from it (without it, it assumes alpha 0)."""
    if peft_model is None:
        return
    config = next(iter(peft_model.peft_config.values()))
    task_type = getattr(config.task_type, "value", config.task_type) or "CAUSAL_LM"
    meta = {"r": int(config.r), "lora_alpha": int(config.lora_alpha), "task_type": str(task_type)}
    (Path(actor_dir) / LORA_META_FILE).write_text(json.dumps(meta, indent=4), encoding="utf-8")


def read_fsdp_config(actor_dir: Path) -> dict | None:
    """`fsdp_config.json` of an actor folder as a dict; None when absent; UserError when malformed."""
    path = Path(actor_dir) / FSDP_CONFIG_FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        int(doc["world_size"])
        return doc
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"{path} is not verl's fsdp_config.json ({type(exc).__name__}: {exc}); the checkpoint is damaged"
        ) from None


# ---- Hugging Face folder --------------------------------------------------------------------------
def save_hf_folder(out_dir: Path, module, tokenizer, processor, state_dict: dict | None, peft_model=None) -> None:
    """`huggingface/`: the model config, its generation config and the tokenizer / processor; with
    `state_dict` (the full weights) also the weights (safetensors), loadable with transformers. With
    `peft_model` (LoRA) the weights are written merged, and the adapter as a peft folder (`lora.save_hf_lora`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    from verl_npu.models import lora

    if peft_model is not None and state_dict is not None:  # merged weights + the adapter as a peft folder
        lora.save_hf_lora(out_dir, module, peft_model, state_dict)
        state_dict = None  # written; the config files and tokenizer follow
    if state_dict is not None:
        # tied weights (lm_head = embeddings) are stored once, as transformers itself does; a gathered
        # FSDP state dict holds them as two separate tensors
        tied = getattr(module, "all_tied_weights_keys", None) or {}
        state_dict = {k: v for k, v in state_dict.items() if k not in tied}
        module.save_pretrained(out_dir, state_dict=state_dict, safe_serialization=True)
    else:
        module.config.save_pretrained(out_dir)
        generation = getattr(module, "generation_config", None)
        if generation is not None and module.can_generate():
            generation.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if processor is not None:
        processor.save_pretrained(out_dir)


# ---- save / load ----------------------------------------------------------------------------------
def _local_params(worker):
    """This rank's local tensors of every parameter (a DTensor's own shard)."""
    for p in worker.module.parameters():
        yield p.to_local() if hasattr(p, "to_local") else p


def save_actor(worker, actor_dir: str | Path) -> None:
    """Write this rank's part of the actor folder (see the module docstring); a collective.

    A full disk anywhere in here (torch's writer, safetensors) is re-raised as `OSError(ENOSPC)`
    naming `actor_dir`, so that the controller reports it as such."""
    actor_dir = Path(actor_dir)
    save_contents, _ = checkpoint_contents(worker.checkpoint)
    ws, rank = worker.world_size, worker.rank
    # every rank counts its shards' non-finite weights and all learn the total: all refuse together
    bad = parallel.all_reduce_sum(
        float(sum(not bool(torch.isfinite(p.detach()).all()) for p in _local_params(worker))), ws, worker.torch_device
    )
    if bad:
        raise UserError(
            f"not saving {actor_dir}: {int(bad)} weight tensor(s) of the {actor_dir.name} hold non-finite values "
            "(NaN / inf), which no checkpoint may hold; the run diverged (lower the learning rate, check the "
            "rewards, or lower grad_clip). The checkpoints saved before are intact: resume from the last one"
        )
    try:
        actor_dir.mkdir(parents=True, exist_ok=True)
        # one worker is not sharded; its files still hold DTensors of a one-rank mesh, as verl's do
        mesh = parallel.one_rank_mesh(worker.torch_device.type, worker.device.dist_backend) if ws == 1 else None
        if "model" in save_contents:
            state = parallel.module_state_dict(worker.module, mesh)
            if getattr(worker, "peft_model", None) is not None:
                state = {PEFT_PREFIX + name: value for name, value in state.items()}
            save_torch(state, actor_dir / rank_file("model", ws, rank))
        if "optimizer" in save_contents:
            save_torch(
                parallel.optimizer_state_dict(worker.module, worker.optimizer, mesh),
                actor_dir / rank_file("optim", ws, rank),
            )
        if "extra" in save_contents:
            save_torch(extra_state(worker.lr_scheduler, worker.device), actor_dir / rank_file("extra_state", ws, rank))
        full = parallel.full_state_dict_on_rank0(worker.module) if "hf_model" in save_contents else None
        if rank == 0:
            write_fsdp_config(actor_dir, ws)
            write_lora_train_meta(actor_dir, getattr(worker, "peft_model", None))
            save_hf_folder(
                actor_dir / HF_DIR,
                worker.module,
                worker.tokenizer,
                worker.processor,
                full,
                peft_model=getattr(worker, "peft_model", None),
            )
    except Exception as exc:
        if is_disk_full(exc) and not (isinstance(exc, OSError) and exc.filename):
            raise OSError(errno.ENOSPC, f"No space left on device (rank {rank})", str(actor_dir)) from exc
        raise
    parallel.barrier(ws)


def _check_model_fits(module, state: dict, path: Path) -> None:
    """UserError naming `path` when a weight of the checkpoint has another shape than the model's
    weight of that name (a checkpoint of another model size), before anything is loaded."""
    own = module.state_dict()
    wrong = [
        f"{name} {tuple(value.shape)} vs {tuple(own[name].shape)}"
        for name, value in state.items()
        if name in own and hasattr(value, "shape") and tuple(value.shape) != tuple(own[name].shape)
    ]
    if wrong:
        raise UserError(
            f"{path} holds weights of another shape than this run's model ({len(wrong)} of {len(state)}, "
            f"checkpoint vs model: {'; '.join(wrong[:3])}{'; ...' if len(wrong) > 3 else ''}): it was saved "
            "from another model. Resume it with the actor_rollout_ref.model.path that wrote it, or start fresh "
            "(trainer.resume_mode=disable)"
        )


def load_actor(worker, actor_dir: str | Path) -> None:
    """Load this rank's files named by `load_contents` from an actor folder of verl-npu or verl.
    Every file goes through `load_torch` (weights_only=True: nothing in it is executed) and is read
    before any state changes; a missing, damaged or unsafe file is a UserError naming it."""
    actor_dir = Path(actor_dir)
    _, load_contents = checkpoint_contents(worker.checkpoint)
    ws, rank = worker.world_size, worker.rank
    config = read_fsdp_config(actor_dir)
    if config is not None:
        if int(config.get("FSDP_version", FSDP_VERSION)) == 1:
            raise UserError(
                f"{actor_dir / FSDP_CONFIG_FILE}: the checkpoint was written with FSDP1 (verl's strategy=fsdp), "
                "whose shards verl-npu cannot read; resume it in verl with strategy=fsdp2, or start verl-npu from "
                f"its {HF_DIR}/ weights (actor_rollout_ref.model.path)"
            )
        if int(config["world_size"]) != ws:
            raise UserError(
                f"checkpoint {actor_dir} was saved by {config['world_size']} workers, this run has {ws}: a "
                "checkpoint resumes on the same number of workers it was saved with (set trainer.nnodes x "
                f"trainer.n_gpus_per_node = {config['world_size']})"
            )
    wanted = [c for c in ("model", "optimizer", "extra") if c in load_contents]
    files = {c: actor_dir / rank_file(CONTENT_FILES[c], ws, rank) for c in wanted}
    if "model" in files and not files["model"].exists():
        found = sorted(p.name for p in actor_dir.glob("model_world_size_*"))
        if found and not any(f"world_size_{ws}_" in name for name in found):
            raise UserError(
                f"checkpoint {actor_dir} has no {files['model'].name} (found: {', '.join(found)}); "
                f"a checkpoint resumes on the same number of workers it was saved with"
            )
    missing = [f"{p.name} ({c})" for c, p in files.items() if not p.is_file()]
    if missing:
        raise UserError(
            f"checkpoint {actor_dir} lacks {', '.join(missing)}: it is incomplete, or was saved without that "
            "part; resume from another checkpoint, or leave the part out of "
            "actor_rollout_ref.actor.checkpoint.load_contents"
        )
    states = {c: load_torch(p) for c, p in files.items()}
    if "extra" in states and (not isinstance(states["extra"], dict) or "lr_scheduler" not in states["extra"]):
        raise UserError(f"{files['extra']} is not an extra state of verl or verl-npu (it has no lr_scheduler)")
    skipped = [c for c in ("model", "optimizer", "extra") if c not in wanted]
    if skipped and rank == 0:
        log.warning(
            "actor_rollout_ref.actor.checkpoint.load_contents=%s: not loading %s from %s (they start "
            "as in a fresh run)",
            load_contents,
            ", ".join(skipped),
            actor_dir,
        )
    state = states.get("model")
    if state is not None and getattr(worker, "peft_model", None) is not None:
        state = {name.removeprefix(PEFT_PREFIX): value for name, value in state.items()}
    if state is not None:
        _check_model_fits(worker.module, state, files["model"])
    try:
        if state is not None:
            parallel.load_module_state_dict(worker.module, state)
        if "optimizer" in states:
            parallel.load_optimizer_state_dict(worker.module, worker.optimizer, states["optimizer"])
    except (RuntimeError, KeyError, ValueError, IndexError) as exc:
        raise UserError(
            f"checkpoint {actor_dir} does not fit this run's model ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0][:300]}): it was saved from another model or another LoRA setting; "
            "resume it with the model.path and settings that wrote it, or start fresh "
            "(trainer.resume_mode=disable)"
        ) from None
    if "extra" in states:
        restore_extra_state(states["extra"], worker.lr_scheduler, worker.device, files["extra"])
