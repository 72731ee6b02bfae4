"""What Trinity-RFT's RL and SFT configs share on import: the top level (project, name, checkpoint folder, monitor,
cluster) and `algorithm.optimizer` (docs/import.md, 'Trinity-RFT' and 'SFT')."""

from __future__ import annotations

from verl_npu.importers.ledger import Ledger

LOGGERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "swanlab": "swanlab"}


def top_level(led: Ledger) -> None:
    """project / name / checkpoint_root_dir / continue_from_checkpoint / monitor / cluster (RL and SFT alike)."""
    led.map("project", "trainer.project_name")
    led.map("name", "trainer.experiment_name")
    led.not_mapped("group", "not mapped: verl-npu has no run group; put it in trainer.experiment_name")
    if led.has("checkpoint_root_dir"):
        root = str(led.get("checkpoint_root_dir")).rstrip("/")
        out = f"{root}/{led.get('project', 'Trinity-RFT')}/{led.get('name', 'rft')}"
        led.map(
            "checkpoint_root_dir",
            "af_output_dir",
            out,
            "<checkpoint_root_dir>/<project>/<name>, Trinity's checkpoint folder; checkpoints in <it>/checkpoints",
        )
    else:
        led.set("af_output_dir", "outputs/imported", "no checkpoint_root_dir in the input: a local folder")
    if led.has("continue_from_checkpoint"):
        led.map(
            "continue_from_checkpoint",
            "trainer.resume_mode",
            transform=lambda v: "auto" if v else "disable",
            how="true -> auto, false -> disable",
        )
    led.not_mapped("ray_namespace", "not mapped: verl-npu starts its own Ray namespace")
    mt = led.get("monitor.monitor_type")
    if mt is not None:
        if mt in LOGGERS:
            led.map("monitor.monitor_type", "trainer.logger", ["console", LOGGERS[mt]], "[console, <type>]")
        else:
            led.not_mapped("monitor.monitor_type", f"not mapped: verl-npu has no {mt} logger")
    led.not_mapped_under("monitor", "not mapped: verl-npu's loggers take no extra arguments (trainer.logger)")
    led.map("cluster.node_num", "trainer.nnodes", how="verl-npu colocates explorer and trainer on all nodes")
    led.map("cluster.gpu_per_node", "trainer.n_gpus_per_node", how="all devices of a node, colocated")
    led.not_mapped("cluster.ray_address", "not mapped: verl-npu starts or joins Ray itself (docs/multinode.md)")
    led.not_mapped_under("cluster", "not mapped: no verl-npu counterpart")


def map_optimizer(led: Ledger, optim: str, grad_clip: str, scheduler: str) -> None:
    """`algorithm.optimizer.*` onto the optimizer section `optim` (the RL actor's or the SFT trainer's)."""
    opt = "algorithm.optimizer"
    led.map(f"{opt}.lr", f"{optim}.lr")
    for k in ("lr_warmup_steps", "lr_warmup_steps_ratio", "min_lr_ratio", "weight_decay", "betas"):
        led.map(f"{opt}.{k}", f"{optim}.{k}")
    led.map(f"{opt}.warmup_style", scheduler, how="verl 0.9.1 names it lr_scheduler_type")
    led.map(f"{opt}.lr_scheduler_type", scheduler, how="verl-npu's name for the scheduler")
    led.map(f"{opt}.clip_grad", grad_clip)
    if str(led.get(f"{opt}.optimizer_type", "adamw")).lower() in ("adam", "adamw"):
        led.accept(f"{opt}.optimizer_type", "AdamW, verl-npu's optimizer")
    led.not_mapped_under(opt, "not mapped: verl-npu's optimizer is AdamW with the optim.* keys only")
