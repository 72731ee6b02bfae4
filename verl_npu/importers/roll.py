"""ROLL config (RLVR or agentic pipeline; Hydra YAML) -> verl-npu recipe (docs/import.md, 'ROLL').

The file is composed and resolved first (`importers.hydra`). Batch units: RLVR's `rollout_batch_size`
counts prompts (each with `num_return_sequences_in_group` responses); the agentic pipeline's counts
trajectories, `train_env_manager.group_size` per environment seed, so verl's prompts per step are
`rollout_batch_size / group_size`. Defaults that differ from verl's (loss_agg_mode
seq-mean-token-mean, temperature 0.95, top_p 0.7, top_k 50, lambd 0.95) are written out.
"""

from __future__ import annotations

from verl_npu.importers import roll_workers
from verl_npu.importers.async_modes import versions_ahead, write_separate_async
from verl_npu.importers.ledger import Ledger
from verl_npu.importers.sft import map_roll_sft

A, AC, RO = "actor_rollout_ref", "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
LOGGERS = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "stdout": "console",
    "swanlab": "swanlab",
    "mlflow": "mlflow",
}
ESTIMATORS = {
    "gae": "gae",
    "grpo": "grpo",
    "reinforce_plus_plus": "reinforce_plus_plus",
    "rloo": "rloo",
    "remax": "remax",
}
KL_PENALTY = {"kl": "kl", "abs": "abs", "mse": "mse", "full": "full", "low_var_kl": "low_var_kl", "k3": "low_var_kl"}
#: ROLL env_type -> verl-npu grid environment
GRID_ENVS = {"sokoban": "sokoban", "frozen_lake": "frozen_lake", "frozenlake": "frozen_lake"}
#: ROLL reward_normalization.grouping -> verl-npu algorithm.reward_norm.grouping
GROUPINGS = {
    "state": "state",
    "traj_group_id": "state",
    "batch": "batch",
    "inductive": "inductive",
    "tags": "inductive",
}
METHODS = {"identity": "identity", "mean_std": "mean_std", "mean": "mean", "asym_clip": "asym_clip"}


def is_agentic(led: Ledger) -> bool:
    return bool(led.under("train_env_manager") or led.under("custom_envs"))


def map_roll(led: Ledger) -> str:
    """Fill `led` from a composed, resolved ROLL config; returns a refusal reason ('' normally)."""
    agentic = is_agentic(led)
    if led.under("sft_train") and not led.under("actor_infer") and not agentic:  # ROLL's SFT pipeline
        led.kind = "sft"
        map_roll_sft(led)
        return ""
    n = _group(led, agentic)
    _pipeline(led, agentic, n)
    _algorithm(led)
    roll_workers.map_cluster(led)
    roll_workers.map_workers(led, n, agentic)
    roll_workers.map_data(led, "actor_train", val=False)
    roll_workers.map_data(led, "validation", val=True)
    _validation(led)
    if agentic:
        _agentic(led, n)
    _rewards(led)
    ratio = float(led.get("async_generation_ratio", 0) or 0)
    if ratio == 0:
        led.accept("async_generation_ratio", "0: synchronous generation, the sync loop")
    elif ratio > 0:
        threshold = versions_ahead(ratio, 1)
        why = (
            f"async_generation_ratio {ratio:g}: the next batch generated while this one trains, at most "
            f"ceil({ratio:g}) = {threshold} model version(s) stale"
        )
        write_separate_async(led, threshold, why)
        led.map("async_generation_ratio", "trainer.v1.sampler.max_off_policy_threshold", threshold, why)
    led.not_mapped_under("hydra", "not mapped: Hydra's own run settings (verl-npu writes to af_output_dir)")
    led.not_mapped_under("custom_env", "not mapped: environment templates; custom_envs picks from them (mapped there)")
    led.not_mapped_under(
        "sft_train",
        "not mapped: an SFT worker beside the RL workers; import ROLL's SFT pipeline "
        "config by itself (an SFT recipe), then point actor_rollout_ref.model.path at its export",
    )
    for key in [k for k in led.unsettled() if k.startswith("deepspeed_")]:
        led.not_mapped(
            key,
            "not mapped: a DeepSpeed config included for strategy_config; verl-npu has no DeepSpeed "
            "backend (FSDP2 instead)",
        )
    for k in ("teacher", "student_train", "student_infer", "is_pure_opd", "use_opd"):
        led.not_mapped_under(
            k,
            "not mapped: the importer does not convert ROLL's on-policy distillation; verl-npu "
            "reads verl 0.9.1's distillation.* keys (`verl-npu explain distillation`): set them by hand",
        )
    if not led.under("actor_infer") and not agentic:
        return (
            "no actor_infer (rollout) worker and no sft_train worker: neither ROLL's RL pipelines nor its SFT "
            "pipeline; add the workers the config's pipeline needs"
        )
    return ""


def _group(led: Ledger, agentic: bool) -> int:
    if agentic:
        n = int(led.get("train_env_manager.group_size", 1))
        led.map("train_env_manager.group_size", f"{RO}.n", how="responses per environment seed (GRPO's group)")
        led.accept("num_return_sequences_in_group", "agentic: ROLL ignores it (the group is group_size)")
        return n
    n = int(led.get("num_return_sequences_in_group", 1))
    led.map("num_return_sequences_in_group", f"{RO}.n")
    return n


def _pipeline(led: Ledger, agentic: bool, n: int) -> None:
    led.map("exp_name", "trainer.experiment_name")
    project = led.get("tracker_kwargs.project")
    if project is not None:
        led.map("tracker_kwargs.project", "trainer.project_name")
    led.not_mapped_under(
        "tracker_kwargs",
        "not mapped: verl-npu's loggers take no extra arguments (the "
        "tensorboard folder is <af_output_dir>/tensorboard or $TENSORBOARD_DIR)",
    )
    led.map("seed", "data.seed")
    out = led.get("checkpoint_config.output_dir") or led.get("output_dir")
    if out is not None:
        key = "checkpoint_config.output_dir" if led.has("checkpoint_config.output_dir") else "output_dir"
        led.map(key, "af_output_dir", str(out), "checkpoints in <it>/checkpoints")
        if key != "output_dir":
            led.mapped_into("output_dir", "af_output_dir", "checkpoint_config.output_dir wins, as in ROLL")
    else:
        led.set("af_output_dir", "./output", "roll default of output_dir")
    led.not_mapped_under("checkpoint_config", "not mapped: verl-npu writes checkpoints to <af_output_dir>/checkpoints")
    led.map("rollout_dump_dir", "trainer.rollout_data_dir")
    for k in (
        "logging_dir",
        "base_dir",
        "render_save_dir",
        "system_envs",
        "profiler_timeline",
        "profiler_output_dir",
        "profiler_memory",
        "local_rank",
        "rpc_timeout",
        "generate_opt_level",
        "is_num_return_sequences_expand",
        "is_use_additional_prompts",
        "max_additional_running_prompts",
        "model_update_buffer_size_mb",
        "logging_steps",
        "num_gpus_per_worker",
    ):
        led.not_mapped_under(
            k,
            "not mapped: ROLL's scheduling / logging plumbing; verl-npu logs every step "
            "to trainer.logger and needs no RPC or request settings",
        )
    led.map("max_running_requests", f"{RO}.max_num_seqs", how="concurrent requests of the inference engine")
    track = led.get("track_with")
    if track is not None:
        if str(track) in LOGGERS:
            led.map("track_with", "trainer.logger", sorted({"console", LOGGERS[str(track)]}), "[console, <it>]")
        else:
            led.not_mapped("track_with", f"not mapped: verl-npu has no {track} logger")
    led.map("max_steps", "trainer.total_training_steps")
    if led.has("max_steps"):
        led.set(
            "backend_config.trainer.total_epochs",
            1000,
            "roll: max_steps bounds the run (ROLL cycles its data); epochs only need not stop it earlier",
        )
    led.map("save_steps", "trainer.save_freq")
    led.map("eval_steps", "trainer.test_freq")
    rc = led.get("resume_from_checkpoint")
    if rc is not None:
        if isinstance(rc, bool):
            led.map(
                "resume_from_checkpoint",
                "trainer.resume_mode",
                "auto" if rc else "disable",
                "true -> auto, false -> disable",
            )
        else:
            led.not_mapped(
                "resume_from_checkpoint",
                "not mapped: a ROLL checkpoint folder is in ROLL's layout; "
                "verl-npu resumes its own (trainer.resume_mode auto). To start from its weights, save "
                "them as a Hugging Face folder and set actor_rollout_ref.model.path",
            )
    keep = led.get("max_ckpt_to_keep")
    if keep is not None:
        led.map(
            "max_ckpt_to_keep",
            "trainer.max_actor_ckpt_to_keep",
            None if int(keep) == 0 else int(keep),
            "0 (keep all) -> null",
        )
    rbs = led.get("rollout_batch_size")
    if rbs is not None:
        if agentic:
            led.map(
                "rollout_batch_size",
                "data.train_batch_size",
                max(int(rbs) // max(n, 1), 1),
                f"trajectories / group_size = {rbs}/{n} environment seeds (prompts)",
            )
        else:
            led.map("rollout_batch_size", "data.train_batch_size", how="prompts per step")
    led.map("val_batch_size", "data.val_batch_size")
    if led.has("prompt_length"):
        led.map("prompt_length", "data.max_prompt_length")
    else:
        led.default("prompt_length", "data.max_prompt_length", 1024, "ROLL's prompt_length is 1024")
    resp = led.get("response_length")
    if resp is None and led.has("sequence_length"):
        resp = int(led.get("sequence_length")) - int(led.get("prompt_length", 1024))
        led.set("backend_config.data.max_response_length", resp, "roll: sequence_length - prompt_length")
    led.map("response_length", "data.max_response_length")
    led.map("sequence_length", f"{RO}.max_model_len")
    for k in ("val_prompt_length", "val_sequence_length"):
        led.not_mapped(k, "not mapped: verl-npu validates with the training lengths")
    led.map("pretrain", f"{A}.model.path", how="ROLL fills every worker's model_name_or_path from it")
    if str(led.get("adv_estimator", "gae")) == "gae" or led.under("critic"):
        led.map("reward_pretrain", "critic.model.path", how="ROLL's critic default")
    else:
        led.not_mapped("reward_pretrain", "not mapped: no critic (the estimator needs none)")


def _algorithm(led: Ledger) -> None:
    led.map("ppo_epochs", f"{AC}.ppo_epochs")
    led.map("max_grad_norm", f"{AC}.grad_clip")
    led.not_mapped("l2", "not mapped: an L2 penalty on the weights; use actor.optim.weight_decay")
    est = str(led.get("adv_estimator", "gae"))
    if led.has("adv_estimator"):
        if est in ESTIMATORS:
            led.map("adv_estimator", "algorithm.adv_estimator", ESTIMATORS[est])
        else:
            led.not_mapped(
                "adv_estimator",
                f"not mapped: verl-npu has no {est} estimator; the nearest are "
                "reinforce_plus_plus / reinforce_plus_plus_baseline / rloo (the recipe keeps grpo)",
            )
    else:
        led.default(
            "adv_estimator", "algorithm.adv_estimator", "gae", "ROLL's default estimator is gae (verl-npu: grpo)"
        )
    if est == "gae":
        if led.has("lambd"):
            led.map("lambd", "algorithm.lam")
        else:
            led.default("lambd", "algorithm.lam", 0.95, "ROLL's GAE lambda is 0.95 (verl: 1.0)")
    else:
        led.accept("lambd", "read by GAE only, which this config does not use")
    led.map("gamma", "algorithm.gamma")
    if led.get("use_pg_clip_range"):
        led.map("pg_clip_low", f"{AC}.clip_ratio_low")
        led.map("pg_clip_high", f"{AC}.clip_ratio_high")
        led.accept("use_pg_clip_range", "its low/high clips are written")
    else:
        for k in ("use_pg_clip_range", "pg_clip_low", "pg_clip_high"):
            led.accept(k, "use_pg_clip_range is off: ROLL clips with pg_clip")
    led.map("pg_clip", f"{AC}.clip_ratio")
    if led.get("dual_clip_loss"):
        led.accept("dual_clip_loss", "verl-npu always applies dual clip (actor.clip_ratio_c 3.0)")
    else:
        led.not_mapped(
            "dual_clip_loss",
            "not mapped: verl-npu always applies dual clip (actor.clip_ratio_c); "
            "a very large clip_ratio_c turns it off in effect",
        )
    led.map("value_clip", "critic.cliprange_value")
    kp = led.get("kl_penalty")
    if kp is not None:
        if str(kp) in KL_PENALTY:
            led.map("kl_penalty", "algorithm.kl_penalty", KL_PENALTY[str(kp)])
        else:
            led.not_mapped("kl_penalty", f"not mapped: verl-npu has no {kp} KL penalty")
    in_reward = bool(led.get("add_token_level_kl", False))
    led.map("add_token_level_kl", "algorithm.use_kl_in_reward")
    if in_reward:
        if led.has("init_kl_coef"):
            led.map("init_kl_coef", "algorithm.kl_ctrl.kl_coef")
        else:
            led.default("init_kl_coef", "algorithm.kl_ctrl.kl_coef", 0.2, "ROLL's init_kl_coef is 0.2 (verl: 0.001)")
        if led.get("target_kl") is not None:
            led.map("target_kl", "algorithm.kl_ctrl.target_kl")
            led.set("backend_config.algorithm.kl_ctrl.type", "adaptive", "roll: target_kl set -> adaptive KL control")
            led.map("kl_horizon", "algorithm.kl_ctrl.horizon")
    for k in ("init_kl_coef", "target_kl", "kl_horizon"):
        led.accept(k, "read with add_token_level_kl only, which is off")
    use_kl_loss = bool(led.get("use_kl_loss", False))
    led.map("use_kl_loss", f"{AC}.use_kl_loss")
    if use_kl_loss and not led.has("kl_loss_coef"):
        led.default("kl_loss_coef", f"{AC}.kl_loss_coef", 0.0, "ROLL's kl_loss_coef is 0 (verl: 0.001)")
    led.map("kl_loss_coef", f"{AC}.kl_loss_coef")
    led.map("entropy_loss_coef", f"{AC}.entropy_coeff")
    if led.has("loss_agg_mode"):
        led.map("loss_agg_mode", f"{AC}.loss_agg_mode")
    else:
        led.default(
            "loss_agg_mode",
            f"{AC}.loss_agg_mode",
            "seq-mean-token-mean",
            "ROLL averages per sequence then over sequences (verl: token-mean)",
        )
    led.map("critic_warmup", "trainer.critic_warmup")
    _norm(led)
    led.map("reward_clip", "algorithm.reward_norm.clip", how="verl-npu's ROLL reward clip")
    led.map("val_n_sample", f"{RO}.val_kwargs.n")
    if led.has("val_greedy"):
        led.map("val_greedy", f"{RO}.val_kwargs.do_sample", transform=lambda v: not v, how="do_sample = not greedy")
    led.accept("enable_reference", "verl-npu builds the reference model when a KL term needs it")
    for k in (
        "use_reward_scaling",
        "use_reward_norm",
        "add_len_reward",
        "whiten_rewards",
        "whiten_advantages",
        "advantage_clip",
        "difficulty_loss_weight",
        "length_loss_weight",
        "sft_loss_coef",
        "use_topr_loss",
        "rl_loss_coef",
        "postive_loss_coef",
        "use_policy_loss_type",
        "max_len_mask",
        "difficulty_mask",
        "difficulty_low_threshold",
        "difficulty_high_threshold",
        "error_max_len_clip",
        "balance_length",
        "dataset_filter",
        "train_infer_correction",
    ):
        led.not_mapped_under(
            k,
            "not mapped: ROLL's own loss/reward shaping; verl-npu has no such key "
            "(train-inference mismatch: algorithm.rollout_correction.*)",
        )


def _norm(led: Ledger) -> None:
    """ROLL's norm_mean_type / norm_std_type (and the older reward_norm / reward_shift / reward_scale)."""
    mean, std = led.get("norm_mean_type"), led.get("norm_std_type")
    old = led.get("reward_norm")
    if old is not None and mean is None and std is None:
        mean = None if led.get("reward_scale") else old
        std = None if led.get("reward_shift") else old
        for k in ("reward_norm", "reward_shift", "reward_scale"):
            led.mapped_into(k, "algorithm.reward_norm", "ROLL's older spelling of norm_mean_type/norm_std_type")
    if mean is None and std is None:
        return
    grouping = {"group": "state", "batch": "batch"}.get(str(mean or std))
    if grouping is None or (mean and std and mean != std):
        for k in ("norm_mean_type", "norm_std_type", "reward_norm"):
            led.not_mapped(
                k,
                "not mapped: verl-npu normalises within a group (state) or the batch; "
                "running statistics have no counterpart",
            )
        return
    method = "mean_std" if mean and std else ("mean" if mean else None)
    if method is None:
        led.not_mapped(
            "norm_std_type", "not mapped: dividing by the std without subtracting the mean has no verl-npu counterpart"
        )
        return
    led.set("backend_config.algorithm.reward_norm.method", method, f"roll: norm_mean_type {mean} / norm_std_type {std}")
    led.set("backend_config.algorithm.reward_norm.grouping", grouping, f"roll: {mean or std} -> {grouping}")
    for k in ("norm_mean_type", "norm_std_type"):
        led.mapped_into(k, "algorithm.reward_norm.method/grouping", f"{method} over {grouping}")


def _validation(led: Ledger) -> None:
    g = "validation.generating_args"
    for k in ("temperature", "top_p", "top_k", "do_sample"):
        led.map(f"{g}.{k}", f"{RO}.val_kwargs.{k}")
    led.map(f"{g}.num_return_sequences", f"{RO}.val_kwargs.n")
    led.not_mapped_under("validation", "not mapped: verl-npu validates with val_kwargs and data.val_files only")


def _agentic(led: Ledger, n: int) -> None:
    tm = "train_env_manager"
    groups = led.get(f"{tm}.num_env_groups")
    if groups is not None:
        led.mapped_into(
            f"{tm}.num_env_groups",
            "data.train_batch_size",
            "environment seeds per step = rollout_batch_size / group_size",
        )
    led.map(f"{tm}.max_env_num_per_worker", f"{RO}.agent.num_workers", how="parallel environments per worker")
    envs = _custom_envs(led)
    tags = led.get(f"{tm}.tags") or []
    matched = [envs[t] for t in tags if t in envs]
    for key in [k for k in led.under(f"{tm}.tags")]:
        led.mapped_into(key, "data_prep/grid_env.py --env", "the environments the train rows are written for")
    led.not_mapped_under(tm, "not mapped: ROLL's environment-manager plumbing (worker classes, group partitions)")
    led.not_mapped_under(
        "val_env_manager",
        "not mapped: verl-npu validates on data.val_files rows (write them "
        "with data_prep/grid_env.py for the same environments)",
    )
    penalty = led.get(f"{tm}.format_penalty")
    interaction = {"name": "grid_env", "class_name": "grid_env", "config": {}}
    if matched:
        env, options, env_key, env_steps = matched[0]
        interaction["config"] = {"env": env, **({"env_config": options} if options else {})}
        if env_steps is not None:
            interaction["config"]["max_steps"] = int(env_steps)
        led.mapped_into(env_key, f"{RO}.multi_turn.interaction_config_path", f"grid_env interaction, env {env}")
    for key, grid_key in (("max_actions_per_traj", "max_steps"), ("max_tokens_per_step", "max_tokens_per_step")):
        if led.has(key):
            interaction["config"][grid_key] = led.get(key)
            led.mapped_into(key, f"{RO}.multi_turn.interaction_config_path", f"grid_env {grid_key}")
    if led.has("max_actions_per_traj"):
        led.set(
            f"backend_config.{RO}.multi_turn.max_assistant_turns",
            int(led.get("max_actions_per_traj")),
            "roll: max_actions_per_traj (one action per model turn)",
        )
    if penalty is not None:
        interaction["config"]["format_penalty"] = penalty
        led.mapped_into(f"{tm}.format_penalty", f"{RO}.multi_turn.interaction_config_path", "grid_env format_penalty")
    if matched:
        led.extra_files["interaction.yaml"] = {"interaction": [interaction]}
        led.set(f"backend_config.{RO}.multi_turn.enable", True, "roll: agentic pipeline (multi-turn episodes)")
        led.set(
            f"backend_config.{RO}.multi_turn.interaction_config_path",
            "<interaction.yaml>",
            "roll: custom_envs -> the grid_env interaction file written beside this recipe",
        )
        led.set(f"backend_config.{RO}.agent.default_agent_loop", "tool_agent", "roll: multi-turn agent loop")
        env = matched[0][0]
        led.notes.append(
            f"write the episodes with: python data_prep/grid_env.py --env {env} "
            f"--max-steps {interaction['config'].get('max_steps', 8)} --local-save-dir data/{env} "
            f"and point data.train_files / val_files at data/{env}/train.parquet / test.parquet"
        )
        if not led.recipe.get("backend_config.data.train_files"):
            led.set("backend_config.data.train_files", f"data/{env}/train.parquet", "roll: data_prep/grid_env.py rows")
            led.set("backend_config.data.val_files", f"data/{env}/test.parquet", "roll: data_prep/grid_env.py rows")
    rn = "reward_normalization"
    led.map_choice(
        f"{rn}.grouping",
        "algorithm.reward_norm.grouping",
        GROUPINGS,
        "verl-npu groups by state, batch or inductive, not {}",
    )
    led.map_choice(f"{rn}.method", "algorithm.reward_norm.method", METHODS, "verl-npu has no {} normalisation")
    led.not_mapped_under(rn, "not mapped: verl-npu's reward_norm has method, grouping and clip")
    # ROLL's env manager class drives an episode itself, as verl's custom agent loops do
    led.not_mapped_under(
        "env_manager_cls",
        "not mapped: a ROLL env manager class; port its episode loop as a verl "
        "custom agent loop (an AgentLoopBase subclass named in actor_rollout_ref.rollout.agent."
        "agent_loop_config_path, docs/agents.md 'Custom agent loops') or an interaction",
    )
    for k in (
        "episode_reward_weight",
        "step_reward_weight",
        "step_reward_gamma",
        "ratio_type",
        "batch_adjust_mode",
        "use_token_reward",
        "dirty_data_mask",
        "env_monitor",
        "max_actions_per_traj",
        "max_tokens_per_step",
    ):
        led.not_mapped_under(
            k, "not mapped: ROLL's trajectory shaping; the grid_env interaction scores each step (docs/agents.md)"
        )


def _custom_envs(led: Ledger) -> dict[str, tuple[str, dict, str, int | None]]:
    """ROLL env tag -> (grid env, its options, the env_type key, its max_steps) for every custom env we have."""
    out = {}
    names = sorted({k.split(".")[1] for k in led.under("custom_envs")})
    for name in names:
        p = f"custom_envs.{name}"
        kind = str(led.get(f"{p}.env_type", "")).lower()
        if kind not in GRID_ENVS:
            led.not_mapped_under(
                p,
                f"not mapped: verl-npu's environments are {', '.join(sorted(set(GRID_ENVS.values())))}"
                f", not {kind or 'this one'}; write an interaction (docs/agents.md)",
            )
            continue
        env = GRID_ENVS[kind]
        options: dict = {}
        c = f"{p}.env_config"
        size = led.get(f"{c}.size") or led.get(f"{c}.dim_x")
        if size is not None and (led.get(f"{c}.dim_y") in (None, size)):
            options["size"] = int(size)
            for k in ("size", "dim_x", "dim_y"):
                led.mapped_into(f"{c}.{k}", "grid_env env_config.size", "a square grid")
        if env == "sokoban" and int(led.get(f"{c}.num_boxes", 1)) == 1:
            led.accept(f"{c}.num_boxes", "one box: verl-npu's Sokoban")
        led.mapped_into(f"{p}.max_steps", "grid_env max_steps", "environment steps per episode")
        led.not_mapped_under(c, f"not mapped: verl-npu's {env} options are size (and hole_ratio for frozen_lake)")
        led.not_mapped_under(
            p, "not mapped: the grid_env interaction writes its own prompts and parses one move per turn"
        )
        out[name] = (env, options, f"{p}.env_type", led.get(f"{p}.max_steps"))
    return out


def _rewards(led: Ledger) -> None:
    led.not_mapped_under(
        "rewards",
        "not mapped: ROLL's per-domain reward workers; verl-npu scores by the rows' "
        "data_source (built-in rewards) or one compute_score in custom_reward_function.path that "
        "dispatches on data_source (data_prep keeps ROLL's tag there)",
    )
    led.not_mapped_under(
        "reward_model",
        "not mapped: an LLM judge; verl-npu's reward model is a sequence classifier (reward_model.model.path)",
    )
