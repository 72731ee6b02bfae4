"""SFT configs of other systems -> a verl-npu SFT recipe (`verl-npu sft`, verl 0.9.1's SFT keys; docs/sft.md):
Trinity-RFT's `mode: train` with `algorithm.algorithm_type: sft` (and the SFT stage of its `stages:`), and
ROLL's SFT pipeline (an `sft_train` worker, no rollout worker). docs/import.md has the mapping and its sources.

Units: Trinity's `buffer.train_batch_size` and ROLL's per_device_train_batch_size x gradient_accumulation_steps x
devices count conversations per optimizer step, verl's SFT `data.train_batch_size` too. Both systems save models
that an RL run can start from; verl's SFT checkpoints hold Hugging Face weights only with `hf_model` in
`checkpoint.save_contents`, so the import writes it (an SFT stage's RL run starts from that export).
"""

from __future__ import annotations

from verl_npu.importers import datasets, roll_workers
from verl_npu.importers.hydra import device_list
from verl_npu.importers.ledger import Ledger
from verl_npu.importers.trinity_common import map_optimizer, top_level

#: the SFT stage's checkpoints as a model an RL run (or the stage that follows) starts from
SAVE_CONTENTS = ["model", "optimizer", "extra", "hf_model"]
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "bfloat16": "bfloat16", "float32": "float32"}


def _save_contents(led: Ledger, key: str, system: str) -> None:
    led.default(
        key,
        "checkpoint.save_contents",
        SAVE_CONTENTS,
        f"{system} saves loadable models; verl's SFT default (model, optimizer, extra) holds no Hugging Face "
        "weights, which an RL run starts from",
    )


def map_trinity_sft(led: Ledger) -> None:
    """Fill `led` from a Trinity SFT config (`mode: train`, `algorithm_type: sft`; or a stage merged over the
    top level)."""
    led.accept("mode", "train: the SFT trainer trains without an explorer")
    led.accept("algorithm.algorithm_type", "sft: verl-npu's SFT trainer (`verl-npu sft`)")
    top_level(led)
    map_optimizer(led, "optim", "optim.clip_grad", "optim.lr_scheduler_type")
    if not led.has("algorithm.optimizer.lr"):
        led.default("algorithm.optimizer.lr", "optim.lr", 1e-6, "Trinity's default learning rate (verl's SFT: 1e-3)")
    led.not_mapped_under("algorithm", "not mapped: an SFT run has no RL algorithm settings")
    prompt, response, total = (
        led.get(f"model.{k}") for k in ("max_prompt_tokens", "max_response_tokens", "max_model_len")
    )
    led.map("model.model_path", "model.path")
    if total is not None:
        led.map("model.max_model_len", "data.max_length", how="a conversation's token budget")
        for k in ("max_prompt_tokens", "max_response_tokens"):
            led.mapped_into(f"model.{k}", "data.max_length", "within max_model_len (SFT has one length)")
    elif prompt is not None and response is not None:
        led.set(
            "backend_config.data.max_length",
            int(prompt) + int(response),
            "trinity: model.max_prompt_tokens + max_response_tokens",
        )
        for k in ("max_prompt_tokens", "max_response_tokens"):
            led.mapped_into(f"model.{k}", "data.max_length", "their sum")
    led.map("model.custom_chat_template", "model.custom_chat_template")
    lora = "model.lora_configs[0]"
    for ours, theirs in (
        ("lora_rank", "lora_rank"),
        ("lora_alpha", "lora_alpha"),
        ("target_modules", "target_modules"),
        ("lora_adapter_path", "path"),
    ):
        led.map(f"{lora}.{theirs}", f"model.{ours}")
    led.not_mapped_under("model", "not mapped: no verl-npu SFT model option of that name")
    b = "buffer"
    led.map(f"{b}.train_batch_size", "data.train_batch_size", how="conversations per optimizer step")
    led.map(f"{b}.total_epochs", "trainer.total_epochs")
    led.map(f"{b}.total_steps", "trainer.total_training_steps")
    eb = f"{b}.trainer_input.experience_buffer"
    if led.has(f"{eb}.path"):
        path, split, subset = (led.get(f"{eb}.{k}") for k in ("path", "split", "subset_name"))
        out = datasets.trinity_parquet(path, split, subset)
        key = led.get(f"{eb}.format.messages_key", "messages")
        led.map(f"{eb}.path", "data.train_files", out, "<path>/<split>.parquet, written by data_prep (next:)")
        for k in ("split", "subset_name", "name", "storage_type"):
            led.mapped_into(f"{eb}.{k}", "data.train_files", "read by the data_prep command")
        led.mapped_into(f"{eb}.format.messages_key", "data.train_files", "the conversation column data_prep reads")
        led.accept_only(
            f"{eb}.format.prompt_type",
            "messages",
            "messages: conversations, verl's SFT rows",
            "not mapped: verl's SFT trains on conversations (a messages "
            "column); turn prompt/response pairs into [user, assistant] messages first",
        )
        led.notes.append(f"{eb}: write {out} with: " + datasets.sft_prep("trinity", path, split, subset, key, out))
    led.not_mapped_under(b, "not mapped: no verl-npu SFT data option of that name")
    t = "trainer"
    led.map(f"{t}.save_interval", "trainer.save_freq")
    led.map(f"{t}.grad_clip", "optim.clip_grad")
    led.map(f"{t}.use_dynamic_bsz", "data.use_dynamic_bsz")
    led.map(f"{t}.max_token_len_per_gpu", "data.max_token_len_per_gpu")
    led.map(f"{t}.ulysses_sequence_parallel_size", "engine.ulysses_sequence_parallel_size")
    led.map(f"{t}.max_checkpoints_to_keep", "trainer.max_ckpt_to_keep")
    if led.get(f"{t}.trainer_strategy") in ("fsdp", "fsdp2"):
        led.map(f"{t}.trainer_strategy", "engine.strategy")
    led.accept(f"{t}.trainer_type", "verl: verl-npu speaks verl's config")
    led.not_mapped_under(t, "not mapped: no verl-npu SFT trainer option of that name")
    _save_contents(led, "(the SFT checkpoints)", "Trinity")
    for section in ("explorer", "synchronizer", "data_processor", "log", "service"):
        led.not_mapped_under(section, "not mapped: an SFT run has no explorer, synchronizer or task pipeline")


def map_roll_sft(led: Ledger) -> None:
    """Fill `led` from ROLL's SFT pipeline config (its `sft_train` worker)."""
    w = "sft_train"
    led.map("exp_name", "trainer.experiment_name")
    led.map("seed", "trainer.seed")
    if led.has("output_dir"):
        led.map("output_dir", "af_output_dir", str(led.get("output_dir")), "checkpoints in <it>/checkpoints")
    else:
        led.set("af_output_dir", "./output", "roll default of output_dir")
    track = led.get("track_with")
    loggers = {"tensorboard": "tensorboard", "wandb": "wandb", "stdout": "console", "swanlab": "swanlab"}
    if track is not None and str(track) in loggers:
        led.map("track_with", "trainer.logger", sorted({"console", loggers[str(track)]}), "[console, <it>]")
    led.not_mapped_under("tracker_kwargs", "not mapped: verl-npu's loggers take no extra arguments")
    led.map("max_steps", "trainer.total_training_steps")
    led.map("save_steps", "trainer.save_freq")
    led.map("eval_steps", "trainer.test_freq")
    if led.has("resume_from_checkpoint"):
        v = led.get("resume_from_checkpoint")
        if isinstance(v, str):
            led.map("resume_from_checkpoint", "trainer.resume_from_path", how="a checkpoint path")
            led.set("backend_config.trainer.resume_mode", "resume_path", "roll: resume_from_checkpoint (a path)")
        else:
            led.map(
                "resume_from_checkpoint",
                "trainer.resume_mode",
                "auto" if v else "disable",
                "true -> auto, false -> disable",
            )
    led.map("sequence_length", "data.max_length", how="a conversation's token budget")
    led.map("pretrain", "model.path", how="the sft_train worker's model (ROLL fills model_name_or_path from it)")
    roll_workers.map_model_args(led, w, "model")
    dtype = led.get(f"{w}.model_args.dtype")
    if dtype is not None and str(dtype) in DTYPES:
        led.map(f"{w}.model_args.dtype", "engine.dtype", DTYPES[str(dtype)], f"{dtype} -> {DTYPES[str(dtype)]}")
    for theirs, ours in (("lora_rank", "lora_rank"), ("lora_alpha", "lora_alpha"), ("lora_target", "target_modules")):
        led.map(f"{w}.model_args.{theirs}", f"model.{ours}")
    ta = f"{w}.training_args"
    for theirs, ours in (
        ("learning_rate", "lr"),
        ("weight_decay", "weight_decay"),
        ("warmup_steps", "lr_warmup_steps"),
        ("lr_scheduler_type", "lr_scheduler_type"),
        ("max_grad_norm", "clip_grad"),
    ):
        led.map(f"{ta}.{theirs}", f"optim.{ours}")
    per_device = int(led.get(f"{ta}.per_device_train_batch_size", 1) or 1)
    accumulation = int(led.get(f"{ta}.gradient_accumulation_steps", 1) or 1)
    devices = led.get(f"{w}.device_mapping")
    world = len(device_list(devices, f"{w}.device_mapping")) if devices is not None else 1
    led.map(f"{ta}.per_device_train_batch_size", "data.micro_batch_size_per_gpu")
    led.set(
        "backend_config.data.train_batch_size",
        per_device * accumulation * world,
        f"roll: per_device_train_batch_size x gradient_accumulation_steps x devices = {per_device} x "
        f"{accumulation} x {world}",
    )
    led.mapped_into(f"{ta}.gradient_accumulation_steps", "data.train_batch_size", "x per-device batch x devices")
    if devices is not None:
        led.map(
            f"{w}.device_mapping",
            "trainer.n_gpus_per_node",
            min(world, int(led.get("num_gpus_per_node", 8))),
            "the devices of its mapping (one node)",
        )
    led.mapped_into("num_gpus_per_node", "trainer.n_gpus_per_node", "a node's devices")
    led.default(
        "(the SFT batching)",
        "data.use_dynamic_bsz",
        False,
        "ROLL batches by per_device_train_batch_size (verl's SFT default packs by tokens)",
    )
    led.not_mapped_under(ta, "not mapped: no verl-npu SFT optimizer option of that name")
    strategy = str(led.get(f"{w}.strategy_args.strategy_name", "fsdp2_train"))
    if strategy.startswith("fsdp2"):
        led.map(f"{w}.strategy_args.strategy_name", "engine.strategy", "fsdp2", f"{strategy} -> fsdp2")
    else:
        led.not_mapped(
            f"{w}.strategy_args.strategy_name",
            f"not mapped: verl-npu trains with FSDP2 only (no {strategy}); the recipe uses fsdp2",
        )
    da = f"{w}.data_args"
    file_name = led.get(f"{da}.file_name")
    if file_name is not None:
        files = file_name if isinstance(file_name, list) else [file_name]
        outs = [datasets.roll_parquet(f) for f in files]
        key = led.get(f"{da}.messages", "messages")
        led.map(
            f"{da}.file_name",
            "data.train_files",
            outs if len(outs) > 1 else outs[0],
            "x.jsonl -> x.parquet, written by data_prep (next:)",
        )
        led.mapped_into(f"{da}.messages", "data.train_files", "the conversation column data_prep reads")
        for src, out_file in zip(files, outs):
            led.notes.append(
                f"{da}.file_name: write {out_file} with: " + datasets.sft_prep("roll", src, None, None, key, out_file)
            )
    _save_contents(led, "(the SFT checkpoints)", "ROLL")
    led.not_mapped_under(w, "not mapped: no verl-npu SFT option of that name")
    led.not_mapped_under("hydra", "not mapped: Hydra's own run settings (verl-npu writes to af_output_dir)")
