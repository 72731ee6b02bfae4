"""ROLL's worker blocks (actor_train, actor_infer, reference, critic, reward) -> verl-npu keys.

Batch arithmetic (ROLL's config guide): a ROLL train step covers
`per_device_train_batch_size x gradient_accumulation_steps x dp` responses, dp = the actor_train
devices (divided by TP x PP x CP under Megatron). verl's `ppo_mini_batch_size` counts prompts, each
with rollout.n responses, so ppo_mini_batch_size = that product / rollout.n.
"""

from __future__ import annotations

from verl_npu.importers import datasets
from verl_npu.importers.hydra import device_list
from verl_npu.importers.ledger import Ledger

A, AC, RO, REF = "actor_rollout_ref", "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
ROLES = ("actor_train", "actor_infer", "reference", "critic", "reward")
#: ROLL's GeneratingArguments defaults that differ from verl's (verl: temperature 1.0, top_p 1.0, top_k -1)
GENERATION_DEFAULTS = {"temperature": 0.95, "top_p": 0.7, "top_k": 50}
TRAIN_STRATEGIES = {"fsdp2_train": "fsdp2", "fsdp_train": "fsdp"}
NOT_OURS = {
    "megatron_train": "Megatron",
    "megatron_infer": "Megatron",
    "deepspeed_train": "DeepSpeed",
    "deepspeed_infer": "DeepSpeed",
    "sglang": "SGLang",
    "vllm_v1": None,
}


def devices(led: Ledger) -> tuple[list[int], dict[str, list[int]]]:
    """Union of every role's device ids, and each role's ids (mapped rows for device_mapping)."""
    per_role: dict[str, list[int]] = {}
    for role in ROLES:
        key = f"{role}.device_mapping"
        if led.has(key):
            per_role[role] = device_list(led.get(key), key)
    union = sorted({d for ids in per_role.values() for d in ids})
    return union, per_role


def map_cluster(led: Ledger) -> None:
    union, per_role = devices(led)
    gpn = int(led.get("num_gpus_per_node", 8))
    if union:
        nodes = -(-(max(union) + 1) // gpn)
        per_node = gpn if nodes > 1 else max(union) + 1
        led.set(
            "backend_config.trainer.nnodes",
            nodes,
            f"roll: ceil((max device id {max(union)} + 1) / num_gpus_per_node {gpn}), as ROLL derives num_nodes",
        )
        led.set(
            "backend_config.trainer.n_gpus_per_node",
            per_node,
            "roll: devices of the device_mappings on one node (verl-npu colocates every role on them)",
        )
        for role, ids in per_role.items():
            note = "its devices count into trainer.nnodes x n_gpus_per_node (every role colocated)"
            if role == "actor_infer" and set(ids).isdisjoint(per_role.get("actor_train", [])):
                note += "; ROLL's separate inference devices have no verl-npu counterpart: rollout shares them"
            led.mapped_into(f"{role}.device_mapping", "trainer.nnodes / trainer.n_gpus_per_node", note)
        led.mapped_into("num_gpus_per_node", "trainer.n_gpus_per_node", "devices per node")
        led.accept("num_nodes", "derived from the device mappings, as ROLL does")
    else:
        led.map("num_nodes", "trainer.nnodes")
        led.map("num_gpus_per_node", "trainer.n_gpus_per_node")


def map_workers(led: Ledger, n: int, agentic: bool) -> None:
    _actor_train(led, n)
    _actor_infer(led, agentic)
    _reference(led)
    _critic(led)
    _reward(led)
    for role in ROLES:
        for k in (
            "world_size",
            "worker_cls",
            "model_update_frequency",
            "backend_timeout",
            "offload_nccl",
            "logits_in_fp32",
            "use_sequence_packing",
            "apply_loss_scale",
            "pg_variant",
            "system_envs",
            "name",
            "checkpoint_config",
        ):
            led.not_mapped_under(f"{role}.{k}", "not mapped: ROLL's worker plumbing; verl-npu's workers need none")
        led.not_mapped_under(f"{role}.model_args", "not mapped: no verl-npu model option of that name")
        led.not_mapped_under(
            f"{role}.training_args",
            "not mapped: verl-npu's optimizer keys are actor.optim.* (lr, weight_decay, warmup, betas)",
        )
        led.not_mapped_under(f"{role}.generating_args", "not mapped: verl-npu samples with temperature/top_p/top_k")
        led.not_mapped_under(f"{role}.strategy_args", "not mapped: no verl-npu counterpart for this strategy option")
        led.not_mapped_under(role, "not mapped: no verl-npu worker option of that name")


def _strategy(led: Ledger, role: str, target: str | None) -> str:
    key = f"{role}.strategy_args.strategy_name"
    name = str(led.get(key, "fsdp2_train" if role != "actor_infer" else "vllm"))
    if name in NOT_OURS and NOT_OURS[name]:
        led.not_mapped(
            key,
            f"not mapped: verl-npu has no {NOT_OURS[name]} backend; it trains with FSDP2 "
            "(the import writes FSDP2: check memory with `verl-npu plan`)",
        )
        led.not_mapped_under(
            f"{role}.strategy_args.strategy_config",
            f"not mapped: {NOT_OURS[name]} options (parallel sizes, recompute, ZeRO) have no "
            "FSDP2 counterpart; see docs/memory.md for FSDP2's offload and sequence parallel",
        )
    elif target and name in TRAIN_STRATEGIES and led.has(key):
        led.map(key, target, TRAIN_STRATEGIES[name], f"{name} -> {TRAIN_STRATEGIES[name]}")
    elif name.endswith("_infer") and role == "reference":
        led.accept(key, "the reference model runs on verl-npu's training backend")
    return name


def map_model_args(led: Ledger, role: str, model: str) -> None:
    m = f"{role}.model_args"
    led.map(f"{m}.model_name_or_path", f"{model}.path")
    if led.has(f"{m}.disable_gradient_checkpointing"):
        led.map(
            f"{m}.disable_gradient_checkpointing",
            f"{model}.enable_gradient_checkpointing",
            transform=lambda v: not v,
            how="enable = not disable",
        )


def _actor_train(led: Ledger, n: int) -> None:
    r = "actor_train"
    map_model_args(led, r, f"{A}.model")
    m = f"{r}.model_args"
    if int(led.get(f"{m}.lora_rank", 0) or 0) > 0 and led.has(f"{m}.lora_target"):
        led.map(f"{m}.lora_rank", f"{A}.model.lora_rank")
        alpha = led.get(f"{m}.lora_alpha")
        if alpha is None:
            led.default(
                f"{m}.lora_alpha",
                f"{A}.model.lora_alpha",
                2 * int(led.get(f"{m}.lora_rank")),
                "ROLL's lora_alpha defaults to 2 x lora_rank (verl: 16)",
            )
        else:
            led.map(f"{m}.lora_alpha", f"{A}.model.lora_alpha")
        target = led.get(f"{m}.lora_target")
        led.map(
            f"{m}.lora_target",
            f"{A}.model.target_modules",
            transform=lambda v: (
                v if v in ("all-linear",) or isinstance(v, list) else [s.strip() for s in str(v).split(",")]
            ),
            how="comma list -> list",
        )
        del target
    elif led.has(f"{m}.lora_rank"):
        led.accept(f"{m}.lora_rank", "no lora_target: ROLL trains the full model")
    led.map(f"{m}.ulysses_size", f"{AC}.ulysses_sequence_parallel_size")
    led.map(f"{r}.use_dynamic_batching_in_train", f"{AC}.use_dynamic_bsz")
    led.map(f"{r}.max_tokens_per_microbatch_in_train", f"{AC}.ppo_max_token_len_per_gpu")
    led.map(f"{r}.use_dynamic_batching_in_infer", f"{RO}.log_prob_use_dynamic_bsz")
    led.map(f"{r}.max_tokens_per_microbatch_in_infer", f"{RO}.log_prob_max_token_len_per_gpu")
    _infer_batch(led, r, f"{RO}.log_prob_micro_batch_size_per_gpu", "the actor's old-log-prob pass")
    led.not_mapped(
        f"{m}.dtype", "not mapped: verl-npu trains with fp32 master weights and bf16 compute (FSDP2 mixed precision)"
    )
    strategy = _strategy(led, r, f"{AC}.strategy")
    t = f"{r}.training_args"
    led.map(f"{t}.learning_rate", f"{AC}.optim.lr")
    led.map(f"{t}.weight_decay", f"{AC}.optim.weight_decay")
    led.map(f"{t}.warmup_steps", f"{AC}.optim.lr_warmup_steps")
    led.map(f"{t}.lr_scheduler_type", f"{AC}.optim.warmup_style")
    led.map(f"{t}.max_grad_norm", f"{AC}.grad_clip")
    per_dev = led.get(f"{t}.per_device_train_batch_size")
    ga = led.get(f"{t}.gradient_accumulation_steps")
    if per_dev is not None:
        led.map(f"{t}.per_device_train_batch_size", f"{AC}.ppo_micro_batch_size_per_gpu")
    if per_dev is not None and ga is not None:
        _, per_role = devices(led)
        world = len(per_role.get(r, [])) or 1
        sc = f"{r}.strategy_args.strategy_config"
        split = 1
        if strategy.startswith("megatron"):
            for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
                split *= int(led.get(f"{sc}.{k}", 1) or 1)
        dp = max(world // split, 1)
        responses = int(per_dev) * int(ga) * dp
        mini = max(responses // max(n, 1), 1)
        how = f"per_device {per_dev} x GA {ga} x dp {dp} responses / rollout.n {n} = {mini} prompts"
        batch = led.recipe.get("backend_config.data.train_batch_size")
        if batch and mini > int(batch):
            how += f", more than the step's {batch}: one optimizer step per step, as ROLL takes it"
            mini = int(batch)
        led.map(f"{t}.gradient_accumulation_steps", f"{AC}.ppo_mini_batch_size", mini, how)


def _actor_infer(led: Ledger, agentic: bool) -> None:
    r = "actor_infer"
    m = f"{r}.model_args"
    led.accept(f"{m}.model_name_or_path", "the rollout runs the actor's weights (actor_rollout_ref.model.path)")
    led.map(
        f"{m}.dtype",
        f"{RO}.dtype",
        transform=lambda v: {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(str(v), v),
    )
    led.accept(f"{m}.disable_gradient_checkpointing", "inference: no gradients")
    name = _strategy(led, r, None)
    if name in ("vllm", "hf_infer"):
        led.map(f"{r}.strategy_args.strategy_name", f"{RO}.name", "vllm" if name == "vllm" else "hf")
    sc = f"{r}.strategy_args.strategy_config"
    for k in (
        "gpu_memory_utilization",
        "max_model_len",
        "load_format",
        "enforce_eager",
        "max_num_batched_tokens",
        "enable_chunked_prefill",
    ):
        led.map(f"{sc}.{k}", f"{RO}.{k}")
    if led.has(f"{sc}.block_size"):
        led.map(f"{sc}.block_size", "engine_kwargs.vllm.block_size", how="a vLLM engine argument")
    led.map(f"{r}.num_gpus_per_worker", f"{RO}.tensor_model_parallel_size", how="GPUs per inference engine")
    g = f"{r}.generating_args"
    for k, dflt in GENERATION_DEFAULTS.items():
        if led.has(f"{g}.{k}"):
            led.map(f"{g}.{k}", f"{RO}.{k}")
        else:
            led.default(
                f"{g}.{k}",
                f"{RO}.{k}",
                dflt,
                f"ROLL samples with {k} {dflt} by default (verl: "
                f"{ {'temperature': 1.0, 'top_p': 1.0, 'top_k': -1}[k] })",
            )
    led.map(f"{g}.do_sample", f"{RO}.do_sample")
    if agentic:
        led.accept(
            f"{g}.max_new_tokens",
            "agentic: the tokens of one turn (max_tokens_per_step caps a turn; "
            "data.max_response_length holds the whole episode)",
        )
    elif led.has("response_length") or led.has("sequence_length"):
        led.accept(f"{g}.max_new_tokens", "ROLL replaces it with response_length (mapped from there)")
    else:
        led.map(f"{g}.max_new_tokens", "data.max_response_length")
    if agentic:
        led.accept(f"{g}.num_return_sequences", "agentic: ROLL forces 1; the group is train_env_manager.group_size")
    elif led.has(f"{g}.num_return_sequences"):
        led.accept(f"{g}.num_return_sequences", "ROLL replaces it with num_return_sequences_in_group (rollout.n)")
    led.not_mapped(
        f"{r}.infer_batch_size",
        "not mapped: verl-npu's rollout engine batches by itself (the "
        "log-prob micro batch comes from actor_train.infer_batch_size)",
    )


def _infer_batch(led: Ledger, role: str, target: str, what: str) -> None:
    """`<role>.infer_batch_size` (ROLL's default 16 written out when unset) -> a log-prob micro batch."""
    if led.has(f"{role}.infer_batch_size"):
        led.map(f"{role}.infer_batch_size", target, how=what)
    else:
        led.default(f"{role}.infer_batch_size", target, 16, f"ROLL's infer_batch_size is 16 ({what})")


def _reference(led: Ledger) -> None:
    r = "reference"
    led.accept(f"{r}.model_args.model_name_or_path", "the reference model is the actor's initial weights")
    led.accept(f"{r}.model_args.dtype", "the reference runs in the training dtype")
    _strategy(led, r, None)
    _infer_batch(led, r, f"{REF}.log_prob_micro_batch_size_per_gpu", "the reference's log-prob pass")
    led.map(f"{r}.use_dynamic_batching_in_infer", f"{REF}.log_prob_use_dynamic_bsz")
    led.map(f"{r}.max_tokens_per_microbatch_in_infer", f"{REF}.log_prob_max_token_len_per_gpu")


def _critic(led: Ledger) -> None:
    r = "critic"
    map_model_args(led, r, "critic.model")
    _strategy(led, r, "critic.strategy")
    t = f"{r}.training_args"
    led.map(f"{t}.learning_rate", "critic.optim.lr")
    led.map(f"{t}.weight_decay", "critic.optim.weight_decay")
    led.map(f"{t}.warmup_steps", "critic.optim.lr_warmup_steps")
    led.map(f"{t}.per_device_train_batch_size", "critic.ppo_micro_batch_size_per_gpu")
    led.map(f"{r}.infer_batch_size", "critic.forward_micro_batch_size_per_gpu")


def _reward(led: Ledger) -> None:
    r = "reward"
    if led.has(f"{r}.model_args.model_name_or_path"):
        led.map(
            f"{r}.model_args.model_name_or_path",
            "reward_model.model.path",
            how="a sequence-classification reward model",
        )
        led.set("backend_config.reward_model.enable", True, "roll: reward.model_args (a reward model worker)")


def map_data(led: Ledger, role: str, val: bool) -> None:
    """`<role>.data_args.file_name` -> data.train_files / val_files (parquet written by data_prep)."""
    d = f"{role}.data_args"
    files = led.get(f"{d}.file_name")
    if files is None:
        return
    names = files if isinstance(files, list) else [f.strip() for f in str(files).split(",")]
    outs = [datasets.roll_parquet(f) for f in names]
    prompt, messages = led.get(f"{d}.prompt"), led.get(f"{d}.messages")
    for f, out in zip(names, outs):
        if out != f:
            led.notes.append(f"{d}.file_name: write {out} with: {datasets.roll_prep(f, prompt, messages, out)}")
    target = "data.val_files" if val else "data.train_files"
    led.map(
        f"{d}.file_name",
        target,
        outs if len(outs) > 1 else outs[0],
        "json/jsonl -> parquet written by data_prep/foreign_json.py (the recipe's NEXT lines)",
    )
    for k in ("prompt", "messages", "response", "tag", "id"):
        led.mapped_into(f"{d}.{k}", target, "a column name, read by the data_prep command")
    led.accept_only(
        f"{d}.template",
        "native",
        "native: the tokenizer's chat template, as verl-npu uses",
        "not mapped: verl-npu applies the tokenizer's chat template; a custom one "
        "goes in actor_rollout_ref.model.custom_chat_template (Jinja text)",
    )
    led.not_mapped_under(
        f"{d}.domain_interleave_probs",
        "not mapped: verl-npu reads the files' rows in order (or shuffled): mix the domains in the parquet",
    )
    led.not_mapped_under(d, "not mapped: no verl-npu data option of that name")
