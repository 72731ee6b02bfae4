"""`verl-npu run`: from a validated recipe to a finished (or cleanly stopped) training run."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import cast

from verl_npu.config import RecipeConfig
from verl_npu.config.sections import BackendConfigSection
from verl_npu.errors import UserError, is_disk_full
from verl_npu.registry import REWARD_MANAGERS

log = logging.getLogger("verl_npu")


def total_steps(cfg: BackendConfigSection, steps_per_epoch: int) -> int:
    """epochs x batches per epoch, or trainer.total_training_steps when set and smaller (as in
    verl, the run ends at whichever limit comes first)."""
    by_epochs = cfg.trainer.total_epochs * steps_per_epoch
    if cfg.trainer.total_training_steps:
        return min(cfg.trainer.total_training_steps, by_epochs)
    return by_epochs


def _oom_advice(rc: RecipeConfig) -> str:
    ckpt = rc.backend.trainer.default_local_dir
    return (
        "the device ran out of memory. Lower one of: "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (or ppo_max_token_len_per_gpu with use_dynamic_bsz), "
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu, "
        "actor_rollout_ref.rollout.gpu_memory_utilization, data.max_response_length; or turn on "
        "actor_rollout_ref.actor.fsdp_config.param_offload / optimizer_offload. "
        f"The last complete checkpoint (if any) in {ckpt} is intact; rerun with trainer.resume_mode=auto."
    )


def _run_config(rc: RecipeConfig) -> dict:
    """The resolved recipe as plain data: the run config that experiment trackers record."""
    from omegaconf import OmegaConf

    return cast(dict, OmegaConf.to_container(rc.cfg, resolve=True))


def checkpoints_to_keep(cfg: BackendConfigSection) -> int | None:
    """How many `global_step_N` folders to keep: the smallest limit of the roles this run trains
    (`trainer.max_actor_ckpt_to_keep`, and `max_critic_ckpt_to_keep` with a critic; null: no limit).
    A step folder resumes only with every role's files, so a role's limit removes whole steps."""
    from verl_npu.registry import roles_needed

    limits = [
        getattr(cfg.trainer, spec.keep_key.removeprefix("trainer.")) for spec in roles_needed(cfg) if spec.keep_key
    ]
    limits = [n for n in limits if n is not None]
    return min(limits) if limits else None


def build_workers(rc: RecipeConfig, total_training_steps: int, device):
    """In-process workers (one per role) for a single device; Ray workers (one per device, each hosting
    every role) otherwise. `device` is the run's `DeviceInfo`, resolved once from trainer.device by the
    driver and handed to every worker."""
    cfg = rc.typed
    if rc.world_size == 1:
        from verl_npu.workers import parallel
        from verl_npu.workers.group import LocalWorkerGroup
        from verl_npu.workers.roles import build_workers as build_role_workers

        # offloading is FSDP2's: one worker then shards over a group of itself, as verl does
        sharded = parallel.offloads_parameters(cfg)
        if sharded:
            parallel.start_one_rank_group(device.dist_backend)
        try:
            return LocalWorkerGroup(build_role_workers(cfg, total_training_steps, device), one_rank_group=sharded)
        except BaseException:
            if sharded:
                parallel.stop_one_rank_group()
            raise
    from verl_npu.trainer.preempt import sigterm_blocked
    from verl_npu.workers.ray_group import RayWorkerGroup

    # Ray's processes (started here when no cluster is running) inherit a blocked SIGTERM: a
    # scheduler's SIGTERM to the whole process group then reaches only this controller, which
    # finishes the step and saves before it stops the workers (docs/reliability.md)
    with sigterm_blocked():
        return RayWorkerGroup(rc, total_training_steps, device)


def run_training(rc: RecipeConfig, after_fit=None, device=None) -> int:
    """Train as the recipe says. Returns the process exit code. `after_fit(workers)`, if given, is
    called once training has finished, while the workers are still up (tests inspect every rank).
    `device`: the `DeviceInfo` the caller resolved from trainer.device (`verl-npu run` prints it);
    None resolves it here. Either way it is resolved once, and every worker is handed it.
    The output folder is locked for the whole run (one run per folder: verl_npu.trainer.runlock),
    before anything is written into it."""
    from verl_npu.trainer import preempt
    from verl_npu.trainer.runlock import RunLock

    preempt.reset()  # a stop asked of an earlier run in this process is not this run's
    with RunLock(Path(rc.cfg.af_output_dir)):
        return _run_training_locked(rc, after_fit, device)


def _run_training_locked(rc: RecipeConfig, after_fit=None, device=None) -> int:
    from verl_npu.data import RLDataset, StatefulBatchLoader
    from verl_npu.device import apply_env_defaults, detect_device, set_torch_threads
    from verl_npu.models.loading import load_tokenizer_and_processor
    from verl_npu.rewards import RewardScorer, load_reward_fn
    from verl_npu.rewards.prime import ParallelRewardScorer, build_scorer
    from verl_npu.trainer.async_ppo import AsyncPPOTrainer, check_layout, rollout_processes, start_rollout_side
    from verl_npu.trainer.checkpoint import CheckpointManager
    from verl_npu.trainer.ppo import PPOTrainer
    from verl_npu.trainer.preempt import Preempted
    from verl_npu.trainer.tracking import Tracker, keep_aside, setup_run_logging
    from verl_npu.workers.distillation import check_teacher_tokenizer

    cfg = rc.typed
    out_dir = Path(os.path.abspath(os.path.expanduser(str(rc.cfg.af_output_dir))))  # said absolute everywhere
    out_dir.mkdir(parents=True, exist_ok=True)
    setup_run_logging(out_dir)
    exp_config, resolved = out_dir / "exp-config.yaml", rc.to_yaml()
    if exp_config.exists() and exp_config.read_bytes() != resolved.encode():
        keep_aside(exp_config, "another config")  # an earlier run's (or the user's own) file is kept
    exp_config.write_text(resolved)
    if device is None:  # the one detection of the run: the workers are handed it
        device = detect_device(cfg.trainer.device)
    if cfg.trainer.nnodes == 1 and not os.environ.get("RAY_ADDRESS"):  # a cluster brings its own nodes
        problem = device.workers_problem(cfg.trainer.n_gpus_per_node, cfg.trainer.device, cfg.ray_init.num_cpus)
        if problem:
            raise UserError(problem)
    check_layout(cfg, device)  # separate_async's layout, before any worker starts
    for var, value, reason in apply_env_defaults(device.kind):
        log.info("env %s=%s (%s)", var, value, reason)
    # separate_async's rollout processes (none in sync mode) share the node's cores with the workers
    threads = device.thread_policy(rc.world_size + rollout_processes(cfg), cfg.trainer.cpu_threads)
    if threads is not None:  # every process of the run: this one, Ray's workers, spawned ranks
        device.before_torch()  # too late for this process when torch is already in, not for its children
        os.environ.update(threads.env())
        set_torch_threads(threads.intra_op, threads.inter_op)
        log.info("cpu threads: %s", threads.describe())
    log.info("device: %s; workers: %d; output: %s", device.kind, rc.world_size, out_dir)

    tokenizer, processor = load_tokenizer_and_processor(
        cfg.actor_rollout_ref.model.path,
        trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code,
        custom_chat_template=cfg.actor_rollout_ref.model.custom_chat_template,
    )
    check_teacher_tokenizer(cfg, tokenizer)  # distillation: the teacher reads the student's token ids
    tools = _tool_schemas(cfg)  # multi-turn: the tools are built (and checked) before any data or worker
    raw_chat = bool(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)  # custom loops read raw_prompt
    train_set = RLDataset(cfg.data.train_files, tokenizer, processor, cfg.data, tools=tools, raw_chat=raw_chat)
    _check_agent_names(cfg, train_set)
    # DAPO's dynamic sampling reads batches of data.gen_batch_size prompts (verl_npu/trainer/dynamic_sampling.py)
    gen_batch = cfg.data.gen_batch_size
    dynamic = cfg.algorithm.filter_groups.enable and gen_batch is not None
    loader_batch = gen_batch if dynamic and gen_batch is not None else cfg.data.train_batch_size
    train_loader = StatefulBatchLoader(
        train_set,
        loader_batch,
        cfg.data.shuffle,
        cfg.data.seed,
        drop_last=True,
        num_workers=cfg.data.dataloader_num_workers,
    )
    if len(train_loader) == 0:
        raise UserError(
            f"data.train_files has {len(train_set)} usable rows, fewer than "
            f"{'data.gen_batch_size' if dynamic else 'data.train_batch_size'}={loader_batch}: lower it or add data"
        )
    val_loader = None
    if cfg.data.val_files and (cfg.trainer.test_freq > 0 or cfg.trainer.val_before_train or cfg.trainer.val_only):
        val_set = RLDataset(cfg.data.val_files, tokenizer, processor, cfg.data, tools=tools, raw_chat=raw_chat)
        _check_agent_names(cfg, val_set)
        if len(val_set) == 0:
            raise UserError(
                f"data.val_files ({', '.join(map(str, _as_list(cfg.data.val_files)))}) has no usable "
                "row: add rows, point data.val_files at another file, or turn validation off "
                "(data.val_files=null, or trainer.test_freq=-1 with trainer.val_before_train=false)"
            )
        val_batch = min(len(val_set), 256)
        val_loader = StatefulBatchLoader(
            val_set,
            val_batch,
            cfg.data.validation_shuffle,
            cfg.data.seed,
            drop_last=False,
            num_workers=cfg.data.dataloader_num_workers,
        )
    steps = total_steps(cfg, len(train_loader))
    log.info(
        "%d steps (%d per epoch); %d prompts x %d responses per step",
        steps,
        len(train_loader),
        cfg.data.train_batch_size,
        cfg.actor_rollout_ref.rollout.n,
    )

    reward_scorer: RewardScorer | ParallelRewardScorer
    if REWARD_MANAGERS.spec(cfg.reward_model.reward_manager).parallel_scoring:  # prime: worker processes
        reward_scorer = build_scorer(cfg)
    else:
        reward_scorer = RewardScorer(load_reward_fn(cfg.custom_reward_function))
    assert cfg.trainer.default_local_dir is not None, "derived by the config loader when unset"
    checkpoints = CheckpointManager(cfg.trainer.default_local_dir, checkpoints_to_keep(cfg))
    resume_step = 0
    latest = checkpoints.resolve_resume(cfg.trainer.resume_mode, cfg.trainer.resume_from_path)
    if latest is not None:
        resume_step = CheckpointManager.step_of(latest)
    tracker = Tracker(
        out_dir,
        list(cfg.trainer.logger),
        cfg.trainer.project_name,
        cfg.trainer.experiment_name,
        resume_step=resume_step,
        tensorboard_dir=cfg.trainer.tensorboard_dir,
        run_config=_run_config(rc),
    )
    separate = cfg.trainer.v1.trainer_mode == "separate_async"
    # the rollout processes start first: their start (imports, model, engine) overlaps the workers' model build
    rollout_side = start_rollout_side(cfg, device, wait=False) if separate else None
    try:
        workers = build_workers(rc, steps, device)
    except BaseException:
        if rollout_side is not None:
            rollout_side.close()
        raise
    trainer = None
    try:
        info = workers.init_model()
        log.info("model: %s", info)
        trainer_class, extra = (
            (AsyncPPOTrainer, {"device": device, "rollout": rollout_side}) if separate else (PPOTrainer, {})
        )
        trainer = trainer_class(
            rc, workers, tokenizer, train_loader, val_loader, reward_scorer, tracker, checkpoints, steps, **extra
        )
        final = trainer.fit(resume_from=latest)
        if after_fit is not None:
            after_fit(workers)
    except KeyboardInterrupt:
        log.warning("%s", _interrupted_message(checkpoints, trainer.global_step if trainer is not None else None))
        return 130
    except Preempted as stop:  # SIGTERM (verl_npu.trainer.preempt); the message names the checkpoint
        text = str(stop)
        if "checkpoint" not in text:
            latest = checkpoints.latest()
            text += (
                f"; the last complete checkpoint, {latest}, is intact: rerun the same command to resume"
                if latest is not None
                else f"; no complete checkpoint exists in {checkpoints.root}"
            )
        log.warning("%s", text)
        return stop.exit_code
    except Exception as exc:  # noqa: BLE001 - turn device OOM and a full disk into advice, re-raise the rest
        if is_disk_full(exc) and not isinstance(exc, UserError):  # a checkpoint's DiskFull says more itself
            latest = checkpoints.latest()
            raise UserError(
                f"no space left on device while writing the run's files under {out_dir} (logs, metrics, "
                f"TensorBoard, curves). Fix: free space there or point af_output_dir at a larger disk, then rerun "
                f"the same command: "
                + (
                    f"the last complete checkpoint, {latest}, is intact and the run resumes from it"
                    if latest is not None
                    else f"no checkpoint was complete yet in {checkpoints.root}"
                )
            ) from None
        cause: BaseException | None = exc
        while cause is not None:  # a worker's OOM arrives wrapped in the worker group's error
            if device.is_oom_error(cause):
                raise UserError(_oom_advice(rc)) from exc
            cause = cause.__cause__
        raise
    finally:
        if trainer is None and rollout_side is not None:  # the trainer (whose fit closes it) never started
            rollout_side.close()
        tracker.close()
        workers.shutdown()
        reward_scorer.close()  # prime: its worker processes
    if final:  # an already complete run trained nothing and said so
        score = final.get("critic/score/mean")
        log.info(
            "done: %d steps; last mean score %s; outputs in %s",
            trainer.global_step,
            f"{score:.3f}" if score is not None and math.isfinite(score) else "n/a",
            out_dir,
        )
    _log_summary(cfg, out_dir, tracker, threads)
    return 0


def _interrupted_message(checkpoints, step: int | None) -> str:
    """What a Ctrl-C that stopped the run at once says: what is kept, what is lost (never a
    checkpoint that does not exist). `step`: the step in progress (None: training had not started)."""
    from verl_npu.trainer.checkpoint import CheckpointManager

    latest = checkpoints.latest()
    saved = CheckpointManager.step_of(latest) if latest is not None else 0
    if step is None or step <= saved:
        lost = "no training step was lost"
    elif step - saved == 1:
        lost = f"step {step} (in progress) is lost"
    else:
        lost = f"steps {saved + 1}-{step} are lost (step {step} was in progress)"
    kept = (
        f"the last complete checkpoint, {latest} (step {saved}), is intact: rerun the same command to resume from it"
        if latest is not None
        else f"there is no complete checkpoint in {checkpoints.root}: a rerun starts from step 1"
    )
    return f"interrupted by Ctrl-C: stopped at once; {lost}; {kept}"


def _log_summary(cfg: BackendConfigSection, out_dir: Path, tracker, threads=None) -> None:
    """Log the end-of-run summary (verl_npu.trainer.summary); a summary that fails only warns."""
    from verl_npu.trainer.summary import run_summary

    try:
        lines = run_summary(
            out_dir,
            tensorboard_dir=tracker.tensorboard_dir if tracker.writes_tensorboard else None,
            builtin_rewards=not cfg.custom_reward_function.path,
        )
    except Exception as exc:  # noqa: BLE001 - the run itself succeeded
        log.warning("could not write the end-of-run summary: %s", exc)
        return
    if threads is not None:
        lines.append(f"  cpu threads: {threads.describe()}")
    log.info("%s", "\n".join(lines))


def _tool_schemas(cfg: BackendConfigSection) -> list[dict] | None:
    """With multi-turn rollout and a tool config: the tools built once here (a bad file, an unknown class
    or a schema that does not match its class is a UserError naming the file and key, before anything
    starts), and their OpenAI schemas for the prompts."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable or not (mt.tool_config_path or mt.function_tool_path):
        return None
    from verl_npu.tools.loading import load_tools, tool_schema_dict

    return [tool_schema_dict(t) for t in load_tools(mt.tool_config_path, mt.function_tool_path).values()]


def _check_agent_names(cfg: BackendConfigSection, dataset) -> None:
    from verl_npu.config.agent_loop_file import loop_names
    from verl_npu.config.schema_multiturn import AGENT_LOOPS
    from verl_npu.registry import ROLLOUT_ENGINES, image_engines

    mt = cfg.actor_rollout_ref.rollout.multi_turn
    dataset.check_agent_names(
        AGENT_LOOPS, mt.enable, tuple(loop_names(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path))
    )
    engine = cfg.actor_rollout_ref.rollout.name
    takes_images = ROLLOUT_ENGINES.spec(engine).images_in_multiturn
    with_images = dataset.image_files() if mt.enable and not takes_images else []
    if with_images:
        raise UserError(
            f"data file {with_images[0]} has images, but multi-turn rollout with images runs on the "
            f"{' / '.join(image_engines())} engine only (actor_rollout_ref.rollout.name is {engine!r}): "
            f"set actor_rollout_ref.rollout.name={image_engines()[0]}, or turn multi_turn off"
        )
    if mt.enable and mt.interaction_config_path:
        # the interactions are built (and checked) here, before any worker starts
        from verl_npu.tools.interactions.loading import load_interactions

        names = list(load_interactions(mt.interaction_config_path))
        dataset.check_interaction_names(names, cfg.actor_rollout_ref.rollout.agent.default_agent_loop)


def _as_list(files) -> list:
    """data.*_files as a list (one path, or a list of paths)."""
    return [files] if isinstance(files, str) else list(files)
