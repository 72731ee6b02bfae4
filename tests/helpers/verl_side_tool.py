"""Upstream verl's own checkpoint code on verl-npu's side of the fence (run in the verl side venv,
under torchrun): `save` writes a checkpoint as verl does, `load` reads one (verl-npu's) as verl does.

`save`:

verl 0.9.1's pieces, as its FSDP engine uses them: the device mesh of `create_device_mesh`
(dimension "fsdp"; built here on "cpu", see below), `apply_fsdp2`, AdamW, `get_constant_schedule_with_warmup`, and
`FSDPCheckpointManager.save_checkpoint` for `global_step_N/actor/`; then what verl's trainer adds
(`data.pt`: its torchdata StatefulDataLoader state after N batches, with verl's sampler; the
`latest_checkpointed_iteration.txt` marker). N optimizer steps on a fixed token batch make the
weights, AdamW moments and LR schedule differ from a fresh start.

Besides the checkpoint, rank 0 writes `--reference` (a torch file: the full weights, AdamW
moments by parameter name, the scheduler's last_epoch and LR), which the test compares with what
verl-npu loads. Usage:

    torchrun --nproc_per_node W tests/helpers/verl_side_tool.py save --model DIR --root DIR --steps N
        --lr 1e-3 --warmup 4 --rows 8 --batch-size 4 [--shuffle] --reference FILE

`load`: builds the model of `ACTOR_DIR/huggingface/config.json` (random weights), shards it with
`apply_fsdp2` on the "fsdp" mesh, and lets `FSDPCheckpointManager.load_checkpoint` read the
actor folder into it, its AdamW and its LR schedule; rank 0 writes `--reference` as above:

    torchrun --nproc_per_node W tests/helpers/verl_side_tool.py load --actor-dir DIR --reference FILE
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def _setup():
    """The gloo group and the device mesh verl's FSDP engine shards over."""
    dist.init_process_group("gloo")
    # verl's create_device_mesh(world, -1) builds this mesh on get_device_name(), which has no CPU
    # platform and falls back to "cuda" (a CPU torch then fails: torch._C has no _cuda_setDevice):
    # the same mesh, one dimension named "fsdp", is built here on "cpu"
    return init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))


def _manager(model, optimizer, scheduler, tokenizer):
    from omegaconf import OmegaConf
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    contents = ["model", "optimizer", "extra"]
    return FSDPCheckpointManager(
        model,
        optimizer,
        lr_scheduler=scheduler,
        processing_class=tokenizer,
        checkpoint_config=OmegaConf.create({"save_contents": contents, "load_contents": contents}),
    )


def _shard_and_optimize(model, mesh, lr: float, warmup: int):
    from omegaconf import OmegaConf
    from verl.utils.fsdp_utils import apply_fsdp2
    from verl.utils.torch_functional import get_constant_schedule_with_warmup

    apply_fsdp2(model, {"mesh": mesh, "reshard_after_forward": True}, OmegaConf.create({}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
    return optimizer, get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup)


def _reference(model, optimizer, scheduler) -> dict:
    """Full weights, AdamW moments by parameter name, the schedule (a collective)."""
    weights = {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}
    moments = {}
    for name, p in model.named_parameters():
        state = optimizer.state.get(p, {})
        moments[name] = {k: state[k].full_tensor().clone() for k in ("exp_avg", "exp_avg_sq") if k in state}
        if "step" in state:
            moments[name]["step"] = float(state["step"])
    return {
        "weights": weights,
        "moments": moments,
        "last_epoch": scheduler.last_epoch,
        "lr": scheduler.get_last_lr()[0],
        "torch_cpu_rng": torch.get_rng_state(),
    }


def save(args) -> None:
    from omegaconf import OmegaConf
    from torchdata.stateful_dataloader import StatefulDataLoader
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.trainer.ppo.utils import create_rl_sampler

    mesh = _setup()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    optimizer, scheduler = _shard_and_optimize(model, mesh, args.lr, args.warmup)
    tokens = torch.randint(0, model.config.vocab_size, (4, 12), generator=torch.Generator().manual_seed(7))
    for _ in range(args.steps):
        optimizer.zero_grad()
        model(input_ids=tokens, labels=tokens).loss.backward()
        optimizer.step()
        scheduler.step()
    step_dir = os.path.join(args.root, f"global_step_{args.steps}")
    _manager(model, optimizer, scheduler, tokenizer).save_checkpoint(
        os.path.join(step_dir, "actor"), global_step=args.steps
    )
    reference = _reference(model, optimizer, scheduler)
    if dist.get_rank() == 0:
        # what verl's trainer writes beside actor/: its dataloader state after the steps of this
        # epoch (verl's sampler, one batch per step), then the marker
        rows = list(range(args.rows))
        sampler = create_rl_sampler(OmegaConf.create({"shuffle": args.shuffle, "seed": args.seed}), rows)
        loader = StatefulDataLoader(rows, batch_size=args.batch_size, drop_last=True, sampler=sampler)
        batches = iter(loader)
        reference["batches"] = [next(batches).tolist() for _ in range(args.steps % len(loader))]
        torch.save(loader.state_dict(), os.path.join(step_dir, "data.pt"))
        with open(os.path.join(args.root, "latest_checkpointed_iteration.txt"), "w") as fh:
            fh.write(str(args.steps))
        torch.save(reference, args.reference)
    dist.barrier()
    dist.destroy_process_group()


def load(args) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    mesh = _setup()
    hf_dir = os.path.join(args.actor_dir, "huggingface")
    config = AutoConfig.from_pretrained(hf_dir)
    auto = (
        AutoModelForCausalLM
        if any(a.endswith("ForCausalLM") for a in config.architectures)
        else AutoModelForImageTextToText
    )
    torch.manual_seed(123)  # weights unlike the checkpoint's: the load must replace every one
    model = auto.from_config(config, dtype=torch.float32)
    optimizer, scheduler = _shard_and_optimize(model, mesh, 1e-3, 0)
    manager = _manager(model, optimizer, scheduler, AutoTokenizer.from_pretrained(hf_dir))
    manager.load_checkpoint(args.actor_dir)
    reference = _reference(model, optimizer, scheduler)
    reference["state_dict_keys"] = sorted(model.state_dict())
    if dist.get_rank() == 0:
        torch.save(reference, args.reference)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    p_save = sub.add_parser("save")
    for name, kind in (
        ("--model", str),
        ("--root", str),
        ("--steps", int),
        ("--lr", float),
        ("--warmup", int),
        ("--rows", int),
        ("--batch-size", int),
        ("--reference", str),
    ):
        p_save.add_argument(name, type=kind, required=True)
    p_save.add_argument("--seed", type=int, default=1)
    p_save.add_argument("--shuffle", action="store_true")
    p_load = sub.add_parser("load")
    p_load.add_argument("--actor-dir", required=True)
    p_load.add_argument("--reference", required=True)
    args = parser.parse_args()
    {"save": save, "load": load}[args.command](args)


if __name__ == "__main__":
    main()
