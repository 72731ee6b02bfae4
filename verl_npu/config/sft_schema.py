"""The SFT recipe's keys: verl 0.9.1's engine SFT trainer config (`sft_trainer_engine.yaml`), each with its
default, type, meaning and limits (`Key`, as in the RL schema), plus verl's older `fsdp_sft_trainer` spellings.

An SFT recipe is a recipe like an RL one (`af_output_dir`, `backend_config`), whose `backend_config` holds
verl's SFT sections: `data`, `model`, `engine`, `optim`, `checkpoint`, `trainer` (and `profiler`). A key is
read (`KEYS`), accepted at any value as a no-op (`noop`: the text says why), accepted only at its off value
(`off_only`: any other value is refused, naming what to do instead), or one of verl's older spellings:
`LEGACY` maps it onto the 0.9.1 key with a warning naming both, `LEGACY_REFUSED` refuses it with what to do.
Plain data; imports nothing heavy.
"""

from __future__ import annotations

from typing import Any

from verl_npu.config.key import BOOL, DICT, FLOAT, FLOAT_LIST, INT, STR, STR_LIST, STR_OR_LIST, Key
from verl_npu.registry import METRIC_SINKS

# A table: one call per key, kept one per line so that the keys read as rows (ruff format would put each
# argument on a line of its own).
# fmt: off

SECTIONS = ("data", "model", "engine", "optim", "checkpoint", "trainer", "profiler")
BC = "backend_config."

KEYS: dict[str, Key] = {}


def _k(path: str, default: Any, type_: str, doc: str, **kw: Any) -> None:
    full = path if path == "af_output_dir" else BC + path
    KEYS[full] = Key(full, default, type_, doc, **kw)


_k("af_output_dir", None, STR, "Everything the run writes goes under here: metrics.jsonl, training_curves.png, "
   "tensorboard/, checkpoints/ (trainer.default_local_dir).", required=True)

# ---- data ------------------------------------------------------------------------------------------------
D = "data"
_k(f"{D}.train_files", None, STR_OR_LIST, "Parquet file(s) of conversations (a path or a list of paths).", required=True,
   nullable=False)
_k(f"{D}.val_files", None, STR_OR_LIST, "Parquet file(s) for the validation loss (null: no validation).")
_k(f"{D}.train_max_samples", -1, INT, "Use only the first N training rows (-1: all).", min=-1)
_k(f"{D}.val_max_samples", -1, INT, "Use only the first N validation rows (-1: all).", min=-1)
_k(f"{D}.messages_key", "messages", STR, "Column holding each row's conversation: a list of {role, content"
   "[, tool_calls]} messages (roles system, user, assistant, tool).")
_k(f"{D}.tools_key", "tools", STR, "Column holding each row's tool schemas (OpenAI function format), handed to the "
   "chat template; a missing column or a null cell means no tools.")
_k(f"{D}.enable_thinking_key", "enable_thinking", STR, "Column whose boolean, when present, is handed to the chat "
   "template as enable_thinking (Qwen3-style templates).")
_k(f"{D}.enable_thinking_default", None, BOOL, "enable_thinking for rows without that column (null: the template's "
   "own default).")
_k(f"{D}.max_length", 1024, INT, "Most tokens of one conversation (template included).", min=1)
_k(f"{D}.truncation", "error", STR, "A conversation longer than max_length: error (refused before training, naming "
   "file and row), left (keep its last max_length tokens) or right (keep its first max_length tokens).",
   choices=("error", "left", "right"))
_k(f"{D}.train_batch_size", 256, INT, "Conversations per optimizer step, over all workers.", min=1)
_k(f"{D}.micro_batch_size_per_gpu", 4, INT, "Conversations per forward/backward on one worker (without "
   "use_dynamic_bsz); also the validation batch.", min=1)
_k(f"{D}.use_dynamic_bsz", True, BOOL, "Micro-batches by a token budget (max_token_len_per_gpu) instead of a row "
   "count.")
_k(f"{D}.max_token_len_per_gpu", 8192, INT, "Token budget of one micro-batch with use_dynamic_bsz; at least "
   "max_length.", min=1)
_k(f"{D}.pad_mode", "no_padding", STR, "verl's layout of a micro-batch: no_padding (packed) or right (padded). "
   "Both give the same loss here: the packing itself is model.use_remove_padding.",
   choices=("no_padding", "right"), noop="the loss and gradients are the same in both layouts; "
   "model.use_remove_padding chooses packing in verl-npu")
_k(f"{D}.shuffle", True, BOOL, "Shuffle the training rows every epoch (seeded by trainer.seed).")
_k(f"{D}.apply_chat_template_kwargs", {}, DICT, "Extra keyword arguments of the tokenizer's apply_chat_template "
   "(e.g. {enable_thinking: false}).")
_k(f"{D}.ignore_input_ids_mismatch", False, BOOL, "A chat template that renders a conversation differently from "
   "its turns one after another (the per-turn masks would not line up): false refuses the row, naming it; "
   "true keeps the whole-conversation tokens and masks by the turns' spans found in it, with a warning.")
_k(f"{D}.image_key", "images", STR, "Column of a row's images (vision-language SFT).",
   noop="read only to refuse rows that hold images: vision-language SFT is not built yet")
_k(f"{D}.video_key", "videos", STR, "Column of a row's videos.",
   noop="read only to refuse rows that hold videos: video SFT is not built")
_k(f"{D}.custom_cls.path", None, STR, "A Python file with a custom dataset class.",
   off_only="a custom SFT dataset class", instead="convert your data to a parquet messages column "
   "(data_prep/ has examples) and leave data.custom_cls unset")
_k(f"{D}.custom_cls.name", None, STR, "The class name in data.custom_cls.path.",
   off_only="a custom SFT dataset class", instead="leave data.custom_cls unset")
_k(f"{D}.balance_dp_token", False, BOOL, "Balance tokens across data-parallel ranks.",
   off_only="token balancing across ranks", instead="leave it false (each rank takes every world_size-th row)")
_k(f"{D}.use_shm", False, BOOL, "Copy data to shared memory first.", off_only="shared-memory data",
   instead="leave it false")
_k(f"{D}.num_workers", 8, INT, "DataLoader worker processes.", min=0,
   noop="conversations are tokenized once, before training, in the driver")

# ---- model -------------------------------------------------------------------------------------------------
M = "model"
_k(f"{M}.path", None, STR, "The model to fine-tune: a local folder, a hub id, or tiny://NAME.", required=True,
   nullable=False)
_k(f"{M}.tokenizer_path", None, STR, "Tokenizer folder (null: model.path).")
_k(f"{M}.trust_remote_code", False, BOOL, "Allow the model's own Python code.")
_k(f"{M}.custom_chat_template", None, STR, "A Jinja chat template (text, or a file) replacing the tokenizer's.")
_k(f"{M}.external_lib", None, STR, "A Python module imported before loading (registers architectures).")
_k(f"{M}.override_config", {}, DICT, "Model config fields to override at load time.")
_k(f"{M}.enable_gradient_checkpointing", True, BOOL, "Recompute activations in backward (less memory).")
_k(f"{M}.use_remove_padding", True, BOOL, "Padding-free (packed) forward: the padding is never computed.")
_k(f"{M}.lora_rank", 0, INT, "LoRA rank (0: full fine-tuning).", min=0)
_k(f"{M}.lora_alpha", 16, INT, "LoRA alpha (the adapters' scale is alpha / rank).", min=1)
_k(f"{M}.target_modules", "all-linear", STR_OR_LIST, "LoRA target modules: all-linear or a list of module names.")
_k(f"{M}.exclude_modules", None, STR_OR_LIST, "Modules LoRA leaves alone (names or a list).")
_k(f"{M}.lora_adapter_path", None, STR, "Start from a saved peft adapter folder.")
_k(f"{M}.hf_config_path", None, STR, "A separate config folder.", off_only="a separate config folder",
   instead="put config.json in model.path")
_k(f"{M}.use_shm", False, BOOL, "Copy the model to shared memory first.", off_only="shared-memory models",
   instead="leave it false")
_k(f"{M}.enable_activation_offload", False, BOOL, "Offload activations to the host.",
   off_only="activation offload", instead="use model.enable_gradient_checkpointing=true")
_k(f"{M}.use_liger", False, BOOL, "Liger fused kernels (liger-kernel).", off_only="Liger kernels", instead="leave it false")
_k(f"{M}.use_fused_kernels", False, BOOL, "Fused output-projection kernels.", off_only="fused kernels in SFT",
   instead="leave it false")

# ---- engine (verl's fsdp engine config) ---------------------------------------------------------------------
E = "engine"
_k(f"{E}.strategy", "fsdp", STR, "Training backend: fsdp and fsdp2 both train with FSDP2 here.",
   choices=("fsdp", "fsdp2"), unsupported=("megatron",), instead="use engine.strategy=fsdp2",
   noop="fsdp and fsdp2 both train with FSDP2 in verl-npu (megatron is refused by name)")
_k(f"{E}.dtype", "bfloat16", STR, "Compute dtype: bfloat16 computes in bf16 where the device has it (fp32 on CPU); "
   "float32 always in fp32.", choices=("bfloat16", "float32"))
_k(f"{E}.model_dtype", "fp32", STR, "Master weights' dtype.", choices=("fp32", "float32"),
   unsupported=("bf16", "bfloat16"), instead="keep fp32 master weights (engine.dtype sets the compute dtype)",
   noop="the master weights are always fp32 (bf16 master weights are refused)")
_k(f"{E}.param_offload", False, BOOL, "Keep parameters in host memory between uses (FSDP2 CPU offload).")
_k(f"{E}.optimizer_offload", False, BOOL, "Keep the optimizer state in host memory.",
   noop="with param_offload the optimizer state follows the parameters to the host; without it it stays on the device")
_k(f"{E}.offload_policy", False, BOOL, "verl's FSDP2 offload policy switch.",
   noop="engine.param_offload is the switch here")
_k(f"{E}.reshard_after_forward", True, BOOL, "FSDP2: free gathered parameters after forward.")
_k(f"{E}.forward_prefetch", False, BOOL, "FSDP2: prefetch the next block's parameters in forward.")
_k(f"{E}.fsdp_size", -1, INT, "Devices per FSDP shard group (-1: all).", choices=(-1,),
   instead="leave it -1: verl-npu shards over every worker")
_k(f"{E}.wrap_policy.min_num_params", 0, INT, "FSDP: wrap blocks with at least this many parameters.", min=0)
_k(f"{E}.ulysses_sequence_parallel_size", 1, INT, "Ulysses sequence parallelism.", choices=(1,),
   instead="leave it 1: Ulysses SFT is not built yet (RL actors have it)")
_k(f"{E}.use_torch_compile", True, BOOL, "torch.compile the model's forward.", noop="the SFT forward runs eagerly")
_k(f"{E}.entropy_from_logits_with_chunking", False, BOOL, "Compute the entropy in chunks of tokens.", noop="SFT computes no entropy")
_k(f"{E}.entropy_checkpointing", False, BOOL, "Recompute the entropy in backward.", noop="SFT computes no entropy")
_k(f"{E}.seed", 42, INT, "Seeds torch before the model is built (LoRA adapters' initial weights).")

# ---- optim ---------------------------------------------------------------------------------------------------
O = "optim"
_k(f"{O}.optimizer", "AdamW", STR, "Optimizer: only AdamW is built (torch.optim.AdamW).", choices=("AdamW",))
_k(f"{O}.optimizer_impl", "torch.optim", STR, "Optimizer implementation: torch.optim.", choices=("torch.optim",))
_k(f"{O}.lr", 1e-3, FLOAT, "Peak learning rate (verl 0.9.1's default is 1e-3: SFT recipes set their own, e.g. 1e-5).",
   min=0)
_k(f"{O}.lr_warmup_steps_ratio", 0.0, FLOAT, "Warm-up steps as a share of the total (when lr_warmup_steps <= 0).",
   min=0, max=1)
_k(f"{O}.lr_warmup_steps", -1, INT, "Warm-up steps (-1: from lr_warmup_steps_ratio).", min=-1)
_k(f"{O}.total_training_steps", -1, INT, "Steps of the LR schedule.",
   derived="trainer.total_training_steps, else steps per epoch x trainer.total_epochs")
_k(f"{O}.weight_decay", 0.01, FLOAT, "AdamW weight decay (decoupled).", min=0)
_k(f"{O}.betas", [0.9, 0.999], FLOAT_LIST, "AdamW betas [beta1, beta2].")
_k(f"{O}.clip_grad", 1.0, FLOAT, "Clip the global gradient norm to this.", gt=0)
_k(f"{O}.min_lr_ratio", 0.0, FLOAT, "cosine: the lowest LR as a share of lr.", min=0, max=1)
_k(f"{O}.num_cycles", 0.5, FLOAT, "cosine: cycles over the schedule.", min=0)
_k(f"{O}.lr_scheduler_type", "constant", STR, "LR schedule after the warm-up.", choices=("constant", "cosine"))
_k(f"{O}.warmup_style", None, STR, "verl's deprecated spelling of lr_scheduler_type (null: use that).",
   choices=("constant", "cosine"))

# ---- checkpoint ------------------------------------------------------------------------------------------------
CONTENTS = ("model", "optimizer", "extra", "hf_model")
_k("checkpoint.save_contents", ["model", "optimizer", "extra"], STR_LIST, "What a checkpoint holds: model, "
   "optimizer, extra (LR schedule, RNG), hf_model (full weights in huggingface/, what an RL recipe starts from).",
   choices=CONTENTS)
_k("checkpoint.load_contents", None, STR_LIST, "What a resume loads (null: checkpoint.save_contents without "
   "hf_model, an export written for the RL stage that a resume never reads back).",
   choices=CONTENTS)

# ---- trainer ------------------------------------------------------------------------------------------------------
T = "trainer"
_k(f"{T}.default_local_dir", None, STR, "Checkpoint folder (global_step_N/ and the latest marker).", derived="<af_output_dir>/checkpoints")
_k(f"{T}.default_hdfs_dir", None, STR, "HDFS copy of the checkpoints.", off_only="HDFS copies",
   instead="leave it null and copy trainer.default_local_dir yourself")
_k(f"{T}.project_name", "gsm8k-sft", STR, "Project name for loggers.")
_k(f"{T}.experiment_name", "test", STR, "Run name for loggers.")
_k(f"{T}.total_epochs", 4, INT, "Passes over the training data.", min=1)
_k(f"{T}.total_training_steps", None, INT, "Stop after this many steps (null: total_epochs).", min=1)
_k(f"{T}.logger", ["console"], STR_LIST, "Metric sinks (verl's default adds wandb; here console unless asked).",
   choices=METRIC_SINKS.names())
_k(f"{T}.seed", 1, INT, "Seeds the row order and the run's random streams.")
_k(f"{T}.save_freq", -1, INT, "Save a checkpoint every N steps, or at the end of every epoch with after_each_epoch "
   "(-1: only at the end of the run).", min=-1)
_k(f"{T}.test_freq", -1, INT, "Validation loss every N steps, or at the end of every epoch with after_each_epoch (-1: "
   "at the end of the run; with data.val_files).", min=-1)
_k(f"{T}.max_ckpt_to_keep", None, INT, "Keep only the newest N checkpoints (null: all).", min=1)
_k(f"{T}.balance_batch", True, BOOL, "Balance sequence lengths across ranks.",
   noop="each rank takes every world_size-th row of the step's batch; the loss is the same")
_k(f"{T}.resume_mode", "auto", STR, "auto: resume from the latest checkpoint; disable: start fresh; resume_path: "
   "from trainer.resume_from_path.", choices=("auto", "disable", "resume_path"))
_k(f"{T}.resume_from_path", None, STR, "A global_step_N folder to resume from (resume_mode=resume_path).")
_k(f"{T}.device", None, STR, "Device kind; null detects npu, then cuda, then cpu.", choices=("cpu", "cuda", "npu"))
_k(f"{T}.nnodes", 1, INT, "Nodes of the run.", choices=(1,), instead="multi-node SFT is not built yet: use one node")
_k(f"{T}.n_gpus_per_node", 1, INT, "Workers (devices) on the node.", min=1)
_k(f"{T}.tensorboard_dir", None, STR, "verl-npu: TensorBoard folder (with tensorboard in trainer.logger).",
   derived="<af_output_dir>/tensorboard")
_k(f"{T}.profile_interval", [-1, -1], FLOAT_LIST, "Steps to profile ([start, end]).", noop="the SFT loop has no profiler yet")

#: the keys that also take verl's "after_each_epoch" instead of a number of steps
EPOCH_FREQ_KEYS = (BC + "trainer.save_freq", BC + "trainer.test_freq")
EPOCH_FREQ = "after_each_epoch"

#: free-form or ignored sections: everything below passes (verl's profiler section, off by default)
NOOP_SECTIONS = {"backend_config.profiler": "the SFT loop has no profiler yet"}

# ---- verl's older fsdp_sft_trainer spellings (verl <= 0.7) --------------------------------------------------------
#: old key -> 0.9.1 key: mapped, with a warning naming both
LEGACY = {
    "model.partial_pretrain": "model.path",
    "model.strategy": "engine.strategy",
    "model.fsdp_config.cpu_offload": "engine.param_offload",
    "model.fsdp_config.offload_params": "engine.param_offload",
    "model.fsdp_config.model_dtype": "engine.model_dtype",
    "model.fsdp_config.wrap_policy.min_num_params": "engine.wrap_policy.min_num_params",
    "use_remove_padding": "model.use_remove_padding",
    "ulysses_sequence_parallel_size": "engine.ulysses_sequence_parallel_size",
    "data.multiturn.messages_key": "data.messages_key",
    "data.multiturn.tools_key": "data.tools_key",
    "data.multiturn.enable_thinking_key": "data.enable_thinking_key",
    "data.chat_template": "model.custom_chat_template",
    "optim.lr_scheduler": "optim.lr_scheduler_type",
    "trainer.checkpoint.save_contents": "checkpoint.save_contents",
    "trainer.checkpoint.load_contents": "checkpoint.load_contents",
}
#: old keys that have no 0.9.1 key: (value that is accepted with a warning, or None: always refused; what to do)
LEGACY_REFUSED = {
    "data.multiturn.enable": (True, "verl 0.9.1's SFT is always multi-turn: drop the key, and give the rows a "
                                    "messages column (single-turn rows: [user prompt, assistant response])"),
    "data.prompt_key": (None, "verl 0.9.1 reads conversations only: write each row as a messages column "
                              "[{role: user, content: prompt}, {role: assistant, content: response}]"),
    "data.response_key": (None, "the same: fold prompt and response into a messages column"),
    "data.prompt_dict_keys": (None, "the same: fold prompt and response into a messages column"),
    "data.response_dict_keys": (None, "the same: fold prompt and response into a messages column"),
    "data.micro_batch_size": (None, "use data.micro_batch_size_per_gpu (per worker)"),
}
# fmt: on


def defaults_tree() -> dict:
    """The SFT backend config with every key at its default, as a nested dict."""
    tree: dict = {}
    for key in KEYS.values():
        if not key.path.startswith(BC):
            continue
        node = tree
        *heads, leaf = key.path[len(BC) :].split(".")
        for head in heads:
            node = node.setdefault(head, {})
        node[leaf] = key.default
    return tree


_SFT_ONLY_SECTIONS = ("model", "engine", "optim", "checkpoint")


def is_sft_tree(raw: dict) -> bool:
    """True when a recipe's YAML (a dict) is an SFT recipe: no actor_rollout_ref, and one of verl's SFT sections
    (model, engine, optim, checkpoint) or an older SFT spelling at the top of backend_config."""
    bc = raw.get("backend_config") if isinstance(raw, dict) else None
    if not isinstance(bc, dict) or "actor_rollout_ref" in bc:
        return False
    return any(s in bc for s in _SFT_ONLY_SECTIONS + ("use_remove_padding", "ulysses_sequence_parallel_size"))


def reference_table() -> str:
    """The markdown table of every SFT key (docs/sft.md holds it; tests/sft/test_sft.py keeps the two equal)."""
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key in KEYS.values():
        note = key.doc
        if key.noop:
            note += f" No-op here: {key.noop}."
        if key.off_only:
            note += f" Only {key.default!r}: {key.off_only} is not built; {key.instead}."
        if key.derived:
            note += f" Unset: {key.derived}."
        if key.choices and not key.off_only:
            note += f" One of: {', '.join(map(str, key.choices))}."
        if key.unsupported:
            note += f" Refused: {', '.join(key.unsupported)} ({key.instead})."
        lines.append(
            f"| `{key.short}` | {key.type.replace('|', 'or')} | `{key.default!r}` | {note.replace('|', '/')} |"
        )
    lines += ["", "verl's older `fsdp_sft_trainer` spellings:", "", "| older key | read as / refused |", "|---|---|"]
    lines += [f"| `{old}` | `{new}` (with a warning) |" for old, new in LEGACY.items()]
    lines += [
        f"| `{old}` | " + (f"accepted at `{ok}` with a warning; " if ok is not None else "refused: ") + f"{fix} |"
        for old, (ok, fix) in LEGACY_REFUSED.items()
    ]
    return "\n".join(lines) + "\n"
