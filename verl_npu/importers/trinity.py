"""Trinity-RFT config -> verl-npu recipe (docs/import.md, 'Trinity-RFT').

Batch units follow Trinity's "align with verl" guide: `buffer.batch_size` counts tasks (prompts) per
explore step and equals verl's `ppo_mini_batch_size`; `buffer.train_batch_size` counts experiences
(responses) per gradient step (`batch_size * repeat_times` when unset); `synchronizer.sync_interval`
explore steps make one verl training step, so `data.train_batch_size = batch_size * sync_interval`.
Trinity splits GPUs between explorer and trainer; verl-npu colocates rollout and training on all
`cluster.node_num x gpu_per_node` devices. `trainer.trainer_config` is a verl-shaped dict: its keys
land on the same verl keys, except those Trinity itself overwrites.
"""

from __future__ import annotations

import math
from typing import Any

from verl_npu.importers import datasets, sft, trinity_stages
from verl_npu.importers.async_modes import versions_ahead, write_separate_async
from verl_npu.importers.ledger import Ledger
from verl_npu.importers.trinity_common import map_optimizer, top_level

A, AC, RO = "actor_rollout_ref", "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
#: Trinity's weight transfer, in verl-npu's separate_async (docs/async.md, 'Weight transfer')
TRANSFER = (
    "verl-npu pushes the weights after every training step by a gloo broadcast (a file in /dev/shm when "
    "no process group spans both sides) and checks their digest"
)

#: keys only Trinity's schema before its `algorithm:`/`buffer.explorer_input` rework has (A.0-3 of
#: shared/reference/import-and-sft.md): their presence marks a legacy config
LEGACY_MARKERS = (
    "data",
    "trainer.algorithm_type",
    "trainer.trainer_config_path",
    "explorer.engine_num",
    "explorer.repeat_times",
    "monitor.project",
    "monitor.name",
    "synchronizer.sync_iteration_interval",
    "buffer.train_dataset",
    "model.max_prompt_tokens_legacy",
)

#: Trinity advantage_fn / algorithm_type -> verl adv_estimator
ADVANTAGE = {
    "ppo": "gae",
    "gae": "gae",
    "grpo": "grpo",
    "reinforceplusplus": "reinforce_plus_plus",
    "reinforce_plus_plus": "reinforce_plus_plus",
    "rloo": "rloo",
    "remax": "remax",
    "opmd": None,
    "step_wise_grpo": None,
    "asymre": None,
}
ALGORITHM_TYPE = {
    "ppo": "gae",
    "grpo": "grpo",
    "dapo": "grpo",
    "reinforceplusplus": "reinforce_plus_plus",
    "rloo": "rloo",
    "gspo": "grpo",
}
#: Trinity kl function names -> verl's kl_penalty / kl_loss_type spellings
KL_NAMES = {
    "k1": "kl",
    "kl": "kl",
    "k2": "mse",
    "mse": "mse",
    "k3": "low_var_kl",
    "low_var_kl": "low_var_kl",
    "abs": "abs",
}
#: trainer_config keys Trinity's veRLConfig.synchronize_config overwrites from its own fields (T-VCFG)
OVERWRITTEN = {
    f"{A}.model.path": "model.model_path",
    f"{AC}.ppo_mini_batch_size": "buffer.batch_size",
    f"{RO}.n": "algorithm.repeat_times",
    f"{RO}.temperature": "model.temperature",
    "trainer.nnodes": "cluster.node_num",
    "trainer.n_gpus_per_node": "cluster.gpu_per_node",
    "trainer.project_name": "project",
    "trainer.experiment_name": "name",
    "trainer.default_local_dir": "checkpoint_root_dir",
    "trainer.save_freq": "trainer.save_interval",
    "trainer.resume_mode": "continue_from_checkpoint",
    "data.train_batch_size": "buffer.batch_size x sync_interval",
    f"{AC}.use_kl_loss": "algorithm.kl_loss_fn",
    "algorithm.use_kl_in_reward": "algorithm.kl_penalty_fn",
    "trainer.total_epochs": "buffer.total_epochs",
    "trainer.total_training_steps": "buffer.total_steps",
}


def legacy_keys(raw: dict) -> list[str]:
    """The legacy-schema marker keys present in a parsed Trinity config."""
    found = []
    for marker in LEGACY_MARKERS:
        node: Any = raw
        for part in marker.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            found.append(marker)
    return found


def map_trinity(led: Ledger, raw: dict) -> str:
    """Fill `led` from a current-schema Trinity config; returns a refusal reason ('' when a recipe
    can be written)."""
    if str(led.get("algorithm.algorithm_type", "ppo")).lower() == "sft":
        led.kind = "sft"
        sft.map_trinity_sft(led)
        return ""
    refusal = _mode_and_algorithm(led)
    top_level(led)
    n = _algorithm(led)
    _model(led)
    _buffer(led, n, raw)
    _explorer(led)
    _trainer(led)
    _synchronizer(led)
    trinity_stages.map_stages(led, raw)
    led.not_mapped_under(
        "data_processor",
        "not mapped: verl-npu has no task/experience pipelines (Data-Juicer); prepare the data before training",
    )
    for section in ("log", "service"):
        led.not_mapped_under(
            section, "not mapped: Trinity's own service/log settings; verl-npu logs through trainer.logger"
        )
    return refusal


def _mode_and_algorithm(led: Ledger) -> str:
    mode = led.get("mode", "both")
    atype = str(led.get("algorithm.algorithm_type", "ppo")).lower()
    if atype in ("dpo", "opmd", "mix", "asymre", "sppo", "topr", "cispo"):
        led.not_mapped(
            "algorithm.algorithm_type",
            f"not mapped: verl-npu has no {atype} trainer (its algorithms: "
            "PPO-family with the estimators of `verl-npu explain algorithm.adv_estimator`)",
        )
        return f"algorithm.algorithm_type {atype} has no verl-npu counterpart"
    if mode == "both":
        led.accept("mode", "explore and train in one run: verl-npu's colocated loop")
    elif mode == "bench":
        led.map("mode", "trainer.val_only", True, "bench: evaluate only")
    elif mode in ("explore", "train"):
        led.map(
            "mode",
            "trainer.v1.trainer_mode",
            "separate_async",
            f"{mode}: one side of Trinity's asynchronous "
            "run; one verl-npu run holds both sides (a rollout process and the trainer), from one recipe",
        )
        led.notes.append(
            f"mode {mode}: Trinity runs this config's {mode} side as a process of its own; verl-npu "
            "runs both sides from this one recipe (trainer.v1.trainer_mode=separate_async). Settings "
            f"only the other side's config holds ({'trainer' if mode == 'explore' else 'explorer'}.*) "
            "are at their defaults here: import that config too and copy them over"
        )
    elif mode == "serve":
        led.not_mapped("mode", "not mapped: verl-npu has no model-serving mode")
        return "mode serve: verl-npu trains; it has no serving mode"
    est = ALGORITHM_TYPE.get(atype)
    if est and not led.has("algorithm.advantage_fn"):
        led.map("algorithm.algorithm_type", "algorithm.adv_estimator", est, f"{atype} -> {est}")
    elif est:
        led.accept("algorithm.algorithm_type", "the estimator comes from algorithm.advantage_fn")
    else:
        led.not_mapped("algorithm.algorithm_type", f"not mapped: unknown algorithm type {atype}")
    if atype == "dapo":
        led.notes.append(
            "Trinity's dapo algorithm type: add DAPO's clip_ratio_high / overlong buffer / "
            "filter_groups keys (recipes/tiny_geo3k_dapo.yaml shows them)"
        )
    return ""


def _algorithm(led: Ledger) -> int:
    """Map `algorithm.*`; returns rollout.n (repeat_times)."""
    n = int(led.get("algorithm.repeat_times", 1))
    led.map("algorithm.repeat_times", f"{RO}.n")
    fn = led.get("algorithm.advantage_fn")
    if fn is not None:
        est = ADVANTAGE.get(str(fn).lower())
        if est:
            led.map("algorithm.advantage_fn", "algorithm.adv_estimator", est, f"{fn} -> {est}")
        else:
            led.not_mapped(
                "algorithm.advantage_fn",
                f"not mapped: verl-npu has no {fn} advantage; choose one of `verl-npu explain algorithm.adv_estimator`",
            )
    led.map("algorithm.advantage_fn_args.gamma", "algorithm.gamma")
    led.map("algorithm.advantage_fn_args.lam", "algorithm.lam")
    led.not_mapped_under("algorithm.advantage_fn_args", "not mapped: verl-npu's estimators take gamma and lam only")
    kp = led.get("algorithm.kl_penalty_fn")
    if kp is not None:
        if str(kp).lower() == "none":
            led.map("algorithm.kl_penalty_fn", "algorithm.use_kl_in_reward", False, "none -> no KL in the reward")
        elif str(kp).lower() in KL_NAMES:
            led.map("algorithm.kl_penalty_fn", "algorithm.use_kl_in_reward", True, "a KL function -> KL in reward")
            led.set(
                "backend_config.algorithm.kl_penalty",
                KL_NAMES[str(kp).lower()],
                f"trinity: algorithm.kl_penalty_fn ({kp})",
            )
        else:
            led.not_mapped("algorithm.kl_penalty_fn", f"not mapped: verl-npu has no {kp} KL penalty")
    led.map("algorithm.kl_penalty_fn_args.kl_coef", "algorithm.kl_ctrl.kl_coef")
    led.not_mapped_under("algorithm.kl_penalty_fn_args", "not mapped: verl-npu's KL penalty takes kl_coef only")
    kl = led.get("algorithm.kl_loss_fn")
    if kl is None:
        led.default(
            "algorithm.kl_loss_fn",
            f"{AC}.use_kl_loss",
            True,
            "Trinity's kl_loss_fn defaults to k2 (verl: use_kl_loss false)",
        )
        led.default("algorithm.kl_loss_fn", f"{AC}.kl_loss_type", "mse", "k2 is verl's mse")
    elif str(kl).lower() == "none":
        led.map("algorithm.kl_loss_fn", f"{AC}.use_kl_loss", False, "none -> no KL loss")
    elif str(kl).lower() in KL_NAMES:
        led.map("algorithm.kl_loss_fn", f"{AC}.use_kl_loss", True, "a KL function -> KL loss on")
        led.set(f"backend_config.{AC}.kl_loss_type", KL_NAMES[str(kl).lower()], f"trinity: algorithm.kl_loss_fn ({kl})")
    else:
        led.not_mapped("algorithm.kl_loss_fn", f"not mapped: verl-npu has no {kl} KL loss")
    led.map("algorithm.kl_loss_fn_args.kl_coef", f"{AC}.kl_loss_coef")
    led.not_mapped_under("algorithm.kl_loss_fn_args", "not mapped: verl-npu's KL loss takes kl_coef only")
    ent = led.get("algorithm.entropy_loss_fn")
    if ent is not None and str(ent).lower() == "none":
        led.map("algorithm.entropy_loss_fn", f"{AC}.entropy_coeff", 0.0, "none -> no entropy bonus")
    elif ent is not None:
        led.accept("algorithm.entropy_loss_fn", "the entropy bonus; its weight is entropy_loss_fn_args.entropy_coef")
    led.map("algorithm.entropy_loss_fn_args.entropy_coef", f"{AC}.entropy_coeff")
    led.not_mapped_under("algorithm.entropy_loss_fn_args", "not mapped: the entropy bonus takes its weight only")
    pl = led.get("algorithm.policy_loss_fn")
    if pl is not None:
        if str(pl).lower() in ("ppo", "vanilla"):
            led.map(
                "algorithm.policy_loss_fn", f"{AC}.policy_loss.loss_mode", "vanilla", f"{pl} -> vanilla (clipped PPO)"
            )
        elif str(pl).lower() in ("gspo", "clip_cov", "kl_cov", "gpg"):
            led.map("algorithm.policy_loss_fn", f"{AC}.policy_loss.loss_mode", str(pl).lower())
        else:
            led.not_mapped(
                "algorithm.policy_loss_fn",
                f"not mapped: verl-npu has no {pl} policy loss; see "
                "`verl-npu explain actor_rollout_ref.actor.policy_loss.loss_mode`",
            )
    led.map("algorithm.policy_loss_fn_args.clip_range", f"{AC}.clip_ratio")
    led.map("algorithm.policy_loss_fn_args.clip_range_low", f"{AC}.clip_ratio_low")
    led.map("algorithm.policy_loss_fn_args.clip_range_high", f"{AC}.clip_ratio_high")
    led.map("algorithm.policy_loss_fn_args.loss_agg_mode", f"{AC}.loss_agg_mode")
    led.not_mapped_under("algorithm.policy_loss_fn_args", "not mapped: no verl-npu policy-loss argument of that name")
    map_optimizer(led, f"{AC}.optim", f"{AC}.grad_clip", f"{AC}.optim.warmup_style")
    led.not_mapped_under("algorithm.sample_strategy", "not mapped: verl-npu samples from the step's own rollouts")
    led.not_mapped_under("algorithm.sample_strategy_args", "not mapped: verl-npu samples from the step's own rollouts")
    led.not_mapped_under("algorithm.advantage_fn", "not mapped")
    return n


def _model(led: Ledger) -> None:
    led.map("model.model_path", f"{A}.model.path")
    led.map("model.critic_model_path", "critic.model.path")
    prompt, response, total = (
        led.get(f"model.{k}") for k in ("max_prompt_tokens", "max_response_tokens", "max_model_len")
    )
    if prompt is None and response is None and total is not None:
        prompt = int(total) // 2
        led.set("backend_config.data.max_prompt_length", prompt, "trinity: model.max_model_len // 2 (Trinity's split)")
        led.set(
            "backend_config.data.max_response_length",
            int(total) - prompt,
            "trinity: model.max_model_len - max_prompt_length",
        )
    elif prompt is None and response is not None and total is not None:
        led.set(
            "backend_config.data.max_prompt_length",
            int(total) - int(response),
            "trinity: model.max_model_len - max_response_tokens (Trinity's derivation)",
        )
    elif response is None and prompt is not None and total is not None:
        led.set(
            "backend_config.data.max_response_length",
            int(total) - int(prompt),
            "trinity: model.max_model_len - max_prompt_tokens (Trinity's derivation)",
        )
    led.map("model.max_prompt_tokens", "data.max_prompt_length")
    led.map("model.max_response_tokens", "data.max_response_length")
    led.map("model.max_model_len", f"{RO}.max_model_len")
    led.map(
        "model.enable_prompt_truncation",
        "data.filter_overlong_prompts",
        how="Trinity leaves overlong prompts out of the loss; verl filters them out",
    )
    for k in ("temperature", "top_p", "top_k"):
        led.map(f"model.{k}", f"{RO}.{k}")
    led.map("model.custom_chat_template", f"{A}.model.custom_chat_template")
    lora = "model.lora_configs[0]"
    led.map(f"{lora}.lora_rank", f"{A}.model.lora_rank")
    led.map(f"{lora}.lora_alpha", f"{A}.model.lora_alpha")
    led.map(f"{lora}.target_modules", f"{A}.model.target_modules")
    led.map(f"{lora}.path", f"{A}.model.lora_adapter_path")
    led.not_mapped_under(lora, "not mapped: verl-npu's LoRA takes rank, alpha, target_modules and an adapter path")
    led.not_mapped_under("model.lora_configs", "not mapped: verl-npu trains one LoRA adapter (lora_configs[0])")
    led.not_mapped_under("model", "not mapped: verl-npu has no counterpart")


def _taskset(led: Ledger, prefix: str) -> tuple[str | None, dict]:
    """(parquet path, rollout args) of one taskset; writes the data_prep note."""
    path = led.get(f"{prefix}.path")
    if path is None:
        return None, {}
    split, subset = led.get(f"{prefix}.split", "train"), led.get(f"{prefix}.subset_name")
    out = datasets.trinity_parquet(path, split, subset)
    cmd = datasets.trinity_prep(
        path,
        split,
        subset,
        led.get(f"{prefix}.format.prompt_key"),
        led.get(f"{prefix}.format.response_key"),
        led.get(f"{prefix}.format.system_prompt"),
        out,
        led.get(f"{prefix}.name"),
    )
    if not str(path).endswith(".parquet"):
        led.notes.append(f"{prefix}: write {out} with: {cmd}")
    target = "data.val_files" if "eval_tasksets" in prefix else "data.train_files"
    how = "<path>/<split>.parquet, written by data_prep/foreign_json.py (the command under next:)"
    for k in ("path", "split", "subset_name", "format.prompt_key", "format.response_key", "format.system_prompt"):
        led.mapped_into(f"{prefix}.{k}", target, how)
    led.mapped_into(f"{prefix}.name", target, "the rows' data_source (data_prep --data-source)")
    led.accept(f"{prefix}.storage_type", "file: read by the data_prep command")
    args = {k.rsplit(".", 1)[1]: led.get(k) for k in led.under(f"{prefix}.rollout_args")}
    return out, args


def _buffer(led: Ledger, n: int, raw: dict) -> None:
    b = "buffer"
    bs = led.get(f"{b}.batch_size", 1)
    interval = int(led.get("synchronizer.sync_interval", 1))
    tbs = led.get(f"{b}.train_batch_size")
    if tbs:
        if int(tbs) % max(n, 1):
            led.not_mapped(
                f"{b}.train_batch_size",
                f"not mapped: {tbs} experiences is not a whole number of "
                f"groups of repeat_times={n}; set ppo_mini_batch_size by hand",
            )
        else:
            led.map(
                f"{b}.train_batch_size",
                f"{AC}.ppo_mini_batch_size",
                int(tbs) // max(n, 1),
                f"experiences per gradient step / repeat_times = {tbs}/{n}",
            )
            led.mapped_into(f"{b}.batch_size", "data.train_batch_size", "tasks per explore step")
    if f"{b}.train_batch_size" not in led.rows or led.rows[f"{b}.train_batch_size"].status != "mapped":
        led.map(f"{b}.batch_size", f"{AC}.ppo_mini_batch_size", bs, "tasks per explore step = ppo_mini_batch_size")
    led.set(
        "backend_config.data.train_batch_size",
        int(bs) * interval,
        f"trinity: buffer.batch_size x synchronizer.sync_interval = {bs} x {interval} (align_with_verl)",
    )
    led.map(f"{b}.total_epochs", "trainer.total_epochs")
    steps = led.get(f"{b}.total_steps")
    if steps is not None:
        led.map(
            f"{b}.total_steps",
            "trainer.total_training_steps",
            math.ceil(int(steps) / interval),
            f"explore steps / sync_interval = ceil({steps}/{interval})",
        )
    ei = f"{b}.explorer_input"
    trains = [f"{ei}.taskset"] if led.under(f"{ei}.taskset") else []
    trains += sorted({k.split("]")[0] + "]" for k in led.under(f"{ei}.tasksets")})
    files, rollout_args, args_from = [], {}, ""
    for prefix in trains:
        out, args = _taskset(led, prefix)
        if out:
            files.append(out)
        if args and not rollout_args:
            rollout_args, args_from = args, prefix
        _selector(led, prefix)
    if files:
        led.set(
            "backend_config.data.train_files",
            files if len(files) > 1 else files[0],
            f"trinity: {', '.join(t + '.path' for t in trains)} (parquet written by data_prep)",
        )
    for k, v in rollout_args.items():
        if k in ("temperature", "top_p", "top_k"):
            led.set(
                f"backend_config.{RO}.{k}",
                v,
                f"trinity: {args_from}.rollout_args.{k} (verl has one value: the first taskset's that sets it)",
            )
            for t in trains:
                led.mapped_into(f"{t}.rollout_args.{k}", f"{RO}.{k}", "the first taskset's value (verl has one)")
    evals = sorted({k.split("]")[0] + "]" for k in led.under(f"{ei}.eval_tasksets")})
    val_files = []
    for prefix in evals:
        out, args = _taskset(led, prefix)
        if out:
            val_files.append(out)
        for k, v in args.items():
            if k in ("temperature", "top_p", "top_k"):
                led.map(f"{prefix}.rollout_args.{k}", f"{RO}.val_kwargs.{k}", how="verl has one value for all")
        led.map(f"{prefix}.repeat_times", f"{RO}.val_kwargs.n")
    if val_files:
        led.set(
            "backend_config.data.val_files",
            val_files if len(val_files) > 1 else val_files[0],
            f"trinity: {', '.join(e + '.path' for e in evals)} (parquet written by data_prep)",
        )
    for key in (
        f"{ei}.default_reward_fn_type",
        *[f"{t}.default_reward_fn_type" for t in trains + evals],
        *[f"{t}.reward_fn_type" for t in trains + evals],
    ):
        led.not_mapped(
            key,
            "not mapped: Trinity's reward registry; verl-npu scores by the rows' data_source "
            "(docs/data_formats.md) or a compute_score file in custom_reward_function.path",
        )
    for prefix in trains + evals + [ei]:
        for k in (
            "default_workflow_type",
            "workflow_args",
            "reward_fn_args",
            "format.workflow_key",
            "default_eval_workflow_type",
        ):
            led.not_mapped_under(
                f"{prefix}.{k}",
                "not mapped: Trinity workflows are Python classes; port one as a "
                "verl custom agent loop (actor_rollout_ref.rollout.agent.agent_loop_config_path, "
                "docs/agents.md 'Custom agent loops'), tools or an interaction",
            )
        led.not_mapped_under(f"{prefix}.rollout_args", "not mapped: verl has temperature/top_p/top_k only")
        led.not_mapped_under(prefix, "not mapped: no verl-npu counterpart for this taskset option")
    led.not_mapped_under(
        f"{b}.trainer_input",
        "not mapped: verl-npu trains on each step's own rollouts (no experience buffer, replay or auxiliary buffers)",
    )
    led.not_mapped_under(b, "not mapped: no verl-npu counterpart")


def _selector(led: Ledger, prefix: str) -> None:
    for key in (f"{prefix}.task_selector.selector_type", f"{prefix}.data_selector.selector_type"):
        v = led.get(key)
        if v is not None:
            led.map(
                key,
                "data.shuffle",
                str(v).lower() in ("random", "shuffle"),
                f"{v} -> shuffle {str(v).lower() in ('random', 'shuffle')}",
            )


def _explorer(led: Ledger) -> None:
    rm = "explorer.rollout_model"
    led.map(f"{rm}.tensor_parallel_size", f"{RO}.tensor_model_parallel_size")
    led.map(f"{rm}.gpu_memory_utilization", f"{RO}.gpu_memory_utilization")
    engine = led.get(f"{rm}.engine_type", "vllm")
    if str(engine).startswith("vllm"):
        if led.has(f"{rm}.engine_type"):
            led.map(f"{rm}.engine_type", f"{RO}.name", "vllm")
        else:
            led.default(f"{rm}.engine_type", f"{RO}.name", "vllm", "Trinity's explorer is vLLM")
    else:
        led.not_mapped(f"{rm}.engine_type", f"not mapped: verl-npu has no {engine} engine (hf, vllm)")
    for k in ("enforce_eager", "enable_chunked_prefill", "dtype", "max_model_len"):
        led.map(f"{rm}.{k}", f"{RO}.{k}")
    if int(led.get("synchronizer.sync_offset", 0) or 0) > 0 or str(led.get("mode", "both")) in ("explore", "train"):
        led.not_mapped(
            f"{rm}.engine_num",
            "not mapped: separate_async's rollout processes are set by "
            "actor_rollout_ref.rollout.nnodes (1) x n_gpus_per_node, one node (docs/async.md)",
        )
    led.not_mapped(
        f"{rm}.engine_num",
        "not mapped: verl-npu colocates rollout with training on all devices "
        "(no separate explorer engines); GPUs: trainer.nnodes x n_gpus_per_node",
    )
    led.not_mapped_under(rm, "not mapped: no verl-npu rollout option of that name")
    led.default(
        "(the explorer)",
        "data.return_raw_chat",
        True,
        "Trinity's explorer generates from the chat messages, as verl's data.return_raw_chat=true keeps them",
    )
    led.map("explorer.eval_interval", "trainer.test_freq")
    led.map("explorer.eval_on_startup", "trainer.val_before_train")
    aux = "explorer.auxiliary_models[0]"
    if led.has(f"{aux}.model_path"):
        led.map(f"{aux}.model_path", "reward_model.model.path", how="Trinity's auxiliary model as verl's reward model")
        led.set("backend_config.reward_model.enable", True, f"trinity: {aux} (an auxiliary model)")
    led.not_mapped_under(
        "explorer.auxiliary_models",
        "not mapped: verl-npu's reward model is a sequence "
        "classifier on the training devices (no serving engine options; judges: a reward function)",
    )
    led.not_mapped_under(
        "explorer", "not mapped: Trinity's explorer runners/timeouts; verl-npu's rollout has no separate process"
    )


def _trainer(led: Ledger) -> None:
    t = "trainer"
    led.map(f"{t}.save_interval", "trainer.save_freq")
    led.map(f"{t}.grad_clip", f"{AC}.grad_clip")
    if led.has(f"{t}.use_dynamic_bsz"):
        led.map(f"{t}.use_dynamic_bsz", f"{AC}.use_dynamic_bsz")
    elif not led.has(f"{t}.trainer_config.{AC}.use_dynamic_bsz"):
        led.default(
            f"{t}.use_dynamic_bsz",
            f"{AC}.use_dynamic_bsz",
            True,
            "Trinity packs micro batches by tokens by default (verl: false)",
        )
    sp = int(led.get(f"{t}.ulysses_sequence_parallel_size", 1) or 1)
    total = led.get("model.max_model_len") or sum(
        int(led.recipe.get(f"backend_config.data.{k}") or 0) for k in ("max_prompt_length", "max_response_length")
    )
    if led.has(f"{t}.max_token_len_per_gpu"):
        tokens = int(led.get(f"{t}.max_token_len_per_gpu"))
        floor = math.ceil(int(total) / sp) if total else 0
        led.map(
            f"{t}.max_token_len_per_gpu",
            f"{AC}.ppo_max_token_len_per_gpu",
            max(tokens, floor),
            f"raised to max_model_len / sp = {floor}, as Trinity does" if floor > tokens else "1:1",
        )
    dyn = led.get(f"{t}.use_dynamic_bsz", True)
    prompt, response = (
        led.recipe.get("backend_config.data.max_prompt_length"),
        led.recipe.get("backend_config.data.max_response_length"),
    )
    if dyn and not led.has(f"{t}.max_token_len_per_gpu") and prompt and response:
        total = int(led.get("model.max_model_len") or (int(prompt) + int(response)))
        led.default(
            f"{t}.max_token_len_per_gpu",
            f"{AC}.ppo_max_token_len_per_gpu",
            math.ceil(2 * total / sp),
            f"Trinity's default: ceil(2 x max_model_len {total} / sequence parallel {sp})",
        )
    led.map(f"{t}.ulysses_sequence_parallel_size", f"{AC}.ulysses_sequence_parallel_size")
    led.map(f"{t}.total_steps", "trainer.total_training_steps", how="gradient steps")
    led.map(f"{t}.max_checkpoints_to_keep", "trainer.max_actor_ckpt_to_keep")
    if str(led.get(f"{t}.trainer_type", "verl")) == "verl":
        led.accept(f"{t}.trainer_type", "verl: verl-npu speaks verl's config")
    strategy = led.get(f"{t}.trainer_strategy")
    if strategy in ("fsdp", "fsdp2"):
        led.map(f"{t}.trainer_strategy", f"{AC}.strategy")
    elif strategy is not None:
        led.not_mapped(f"{t}.trainer_strategy", f"not mapped: verl-npu trains with FSDP2 only (no {strategy})")
    tc = f"{t}.trainer_config"
    for key in led.unsettled(tc):
        verl_key = key[len(tc) + 1 :]
        if "[" in verl_key:
            continue
        if ".megatron." in f".{verl_key}":
            led.not_mapped(
                key,
                "not mapped: verl-npu has no Megatron backend; it trains with FSDP2 (Ulysses "
                "sequence parallel for long sequences, docs/memory.md)",
            )
        elif verl_key in OVERWRITTEN:
            led.not_mapped(key, f"not mapped: Trinity overwrites it with {OVERWRITTEN[verl_key]} (mapped from there)")
        else:
            led.map(key, verl_key, how="trainer_config: the same verl key")
    led.not_mapped_under(tc, "not mapped: a list inside trainer_config")
    led.not_mapped_under(t, "not mapped: no verl-npu trainer option of that name")


def _synchronizer(led: Ledger) -> None:
    """sync_offset 0 in one process (mode both): the sync loop. A positive offset, or separate explore / train
    processes: separate_async, the bound in model versions ceil(sync_offset / sync_interval) (one version is
    sync_interval explore steps; separate processes without an offset: 1, the one-step-off pipeline)."""
    s = "synchronizer"
    interval = int(led.get(f"{s}.sync_interval", 1) or 1)
    offset = int(led.get(f"{s}.sync_offset", 0) or 0)
    separate = str(led.get("mode", "both")) in ("explore", "train")
    if led.has(f"{s}.sync_interval"):
        led.mapped_into(
            f"{s}.sync_interval", "data.train_batch_size", "data.train_batch_size = buffer.batch_size x sync_interval"
        )
    led.accept_only(
        f"{s}.sync_style",
        "fixed",
        "fixed: the weights move after every training step, as in verl-npu",
        "not mapped: verl-npu moves the weights after every training step "
        "(Trinity's fixed style); the recipe does that",
    )
    if offset == 0 and not separate:
        led.accept(f"{s}.sync_offset", "0: on-policy, the sync loop (generate, then train)")
        led.not_mapped_under(
            s,
            "not mapped: the sync loop samples with the actor's own weights (nothing to "
            "transfer); for Trinity's explorer/trainer split set sync_offset >= 1",
        )
        return
    threshold = versions_ahead(offset or 1, interval)
    why = (
        (
            f"synchronizer.sync_offset {offset} explore steps ahead, sync_interval {interval} per model version: "
            f"ceil({offset}/{interval}) = {threshold} version(s)"
        )
        if offset
        else (
            "separate explore and train processes: one version ahead (the one-step-off pipeline; raise "
            "trainer.v1.sampler.max_off_policy_threshold to let generation run further ahead)"
        )
    )
    write_separate_async(led, threshold, why)
    if offset and not separate:
        led.notes.append(
            f"synchronizer.sync_offset {offset}: the explorer runs ahead, so the recipe overlaps "
            "generation and training (separate_async). Trinity's align-with-verl guide says verl's "
            "synchronous run is sync_offset 0: for it import with sync_offset 0, or run with "
            "trainer.v1.trainer_mode=sync actor_rollout_ref.rollout.nnodes=0"
        )
    if offset:
        led.map(f"{s}.sync_offset", "trainer.v1.sampler.max_off_policy_threshold", threshold, why)
    if led.has(f"{s}.sync_interval"):
        led.mapped_into(
            f"{s}.sync_interval",
            "trainer.v1.separate_async.parameter_sync_step",
            "data.train_batch_size / ppo_mini_batch_size = sync_interval",
        )
    led.not_mapped_under(f"{s}.sync_method", f"not mapped: {TRANSFER}")
    led.not_mapped_under(s, "not mapped: no verl-npu setting of Trinity's synchronizer of that name")
