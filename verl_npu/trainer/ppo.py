"""The single-controller PPO/GRPO loop.

One training step, in order (verl's order, verl's names):

1. sample `data.train_batch_size` prompts from the resumable loader;
2. generate `rollout.n` responses per prompt (workers, rollout engine);
3. score every response with the reward function (controller, CPU), or with the reward model
   (workers, `reward_model.enable`: its scores replace the rule reward, which is only logged);
   with `algorithm.filter_groups.enable` (DAPO's dynamic sampling) steps 1-3 repeat over batches of
   `data.gen_batch_size` prompts until `data.train_batch_size` groups of non-zero metric variance are
   kept (`verl_npu.trainer.dynamic_sampling`);
4. old log-probs from the actor (skipped when provably redundant: then the update's own forward
   gives them, see `workers.actor.old_log_prob_pass_needed`; in rollout correction's bypass
   mode the rollout's own log-probs are the old ones), reference log-probs when a KL term needs them (workers);
5. the critic's values (with a critic role: gae), the scores normalised (`algorithm.reward_norm`,
   ROLL's reward normalisation), optional KL penalty in the reward, rollout correction
   (`algorithm.rollout_correction`, decoupled mode: IS weights and rejected tokens), then
   advantages (`algorithm.adv_estimator`);
6. `critic.ppo_epochs` passes of critic updates (with a critic), then `actor.ppo_epochs` passes
   of actor mini-batch updates (workers; none during the first `trainer.critic_warmup` steps);
7. metrics; validation every `trainer.test_freq` steps; a checkpoint every `trainer.save_freq`
   steps and on the last step.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import cast

import torch

from verl_npu import algorithms
from verl_npu.batch import Batch
from verl_npu.config import RecipeConfig
from verl_npu.config.sections import BackendConfigSection
from verl_npu.errors import UserError
from verl_npu.registry import ADVANTAGE_ESTIMATORS, REWARD_MANAGERS, ROLES, ROLLOUT_ENGINES, role_with_method
from verl_npu.rollout.base import SamplingParams
from verl_npu.trainer import preempt
from verl_npu.trainer.checkpoint import (
    TRAINER_STATE_FILE,
    CheckpointManager,
    load_rng_state,
    load_trainer_state,
    save_rng_state,
    save_trainer_state,
)
from verl_npu.trainer.dynamic_sampling import DynamicSampler
from verl_npu.trainer.metrics import (
    data_metrics,
    multi_turn_metrics,
    rollout_probs_diff_metrics,
    timed,
    timing_metrics,
    variance_proxy_metrics,
)
from verl_npu.trainer.profiling import StepProfiling
from verl_npu.trainer.readable import quoted_sample, readable_text
from verl_npu.trainer.tracking import CurveRedraws, ProgressBar, Tracker, dump_jsonl
from verl_npu.trainer.verl_resume import is_verl_checkpoint, trainer_state_from_verl
from verl_npu.workers.actor import OldLogProbs, needs_reference
from verl_npu.workers.balance import balance_for_ranks
from verl_npu.workers.engine import TrainResult
from verl_npu.workers.group import WorkerGroup
from verl_npu.workers.roles import checkpointed_roles

log = logging.getLogger("verl_npu")


def multi_turn_extra_info(batch: Batch) -> list:
    """Each row's extra_info for the reward function; a multi-turn row's gets what its trajectory
    collected, as verl's reward managers add its agent loop's extra fields: `turn_scores` (the
    interaction's score of each of its turns), `tool_rewards` (the tools' step rewards), `interaction`
    (the interaction's last metadata) and `num_turns`."""
    extra = list(batch["extra_info"])
    if "agent_turns" not in batch:
        return extra
    fields = {
        "turn_scores": batch.get("turn_scores"),
        "tool_rewards": batch.get("tool_rewards"),
        "interaction": batch.get("interaction_info"),
        "num_turns": batch.get("__num_turns__"),
    }
    out = []
    for i, info in enumerate(extra):
        added = {k: v[i] for k, v in fields.items() if v is not None}
        out.append({**(info or {}), **added})
    # a custom agent loop's extra_fields reach the reward function as verl's do (custom_loops)
    for i, fields_of_row in enumerate(batch.get("agent_extra_fields") or []):
        if fields_of_row:
            out[i] = {**(out[i] or {}), **fields_of_row}
    return out


def with_agent_scores(rule, batch: Batch):
    """The rows' rule rewards, each replaced by its custom agent loop's own `reward_score` where the loop gave one
    (column `agent_reward_score`, verl_npu/rollout/custom_loops.py; verl uses a loop's score instead of computing
    one)."""
    if rule is None or "agent_reward_score" not in batch:
        return rule
    return [r if s is None else float(s) for r, s in zip(rule, batch["agent_reward_score"])]


class EngineOutOfSync(UserError):
    """The rollout engine's probabilities left `rollout.max_probs_diff` of the actor's."""


class PPOTrainer:
    def __init__(
        self,
        rc: RecipeConfig,
        workers: WorkerGroup,
        tokenizer,
        train_loader,
        val_loader,
        reward_scorer,
        tracker: Tracker,
        checkpoints: CheckpointManager,
        total_training_steps: int,
    ):
        self.rc = rc
        self.cfg: BackendConfigSection = rc.typed  # the typed backend config (verl_npu.config.sections)
        self.last_saved: tuple[int, Path] | None = None  # (step, folder) of this run's newest save (`fit`)
        self.out_dir = Path(rc.cfg.af_output_dir)
        self.workers = workers
        self.tokenizer = tokenizer
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.reward_scorer = reward_scorer
        self.tracker = tracker
        self.checkpoints = checkpoints
        self.total_training_steps = total_training_steps
        self.global_step = 0
        self.kl_ctrl = algorithms.make_kl_controller(self.cfg.algorithm.kl_ctrl)
        rollout_cfg = self.cfg.actor_rollout_ref.rollout
        self.train_sampling = SamplingParams.for_training(rollout_cfg)
        self.val_sampling = SamplingParams.for_validation(rollout_cfg)
        self.old_log_prob_reasons: list[str] | None = None  # asked of the workers on the first step
        self.dynamic_sampler = DynamicSampler.from_config(self.cfg)  # None without filter_groups.enable

    # ---- resume ----------------------------------------------------------------------------
    def resume(self, ckpt: Path | None) -> None:
        """Continue from checkpoint `ckpt` (already resolved from trainer.resume_mode): weights,
        optimizer, LR schedule, RNG, the loader's position and the KL coefficient."""
        if ckpt is None:
            return
        if is_verl_checkpoint(ckpt):  # written by upstream verl's trainer: no trainer_state.json
            state = trainer_state_from_verl(ckpt, self.train_loader, float(self.kl_ctrl.value))
        else:
            state = load_trainer_state(ckpt)  # read (and check) before the workers change anything
        roles = checkpointed_roles(self.workers.roles)  # the frozen reward model has no folder
        absent = [role for role in roles if not (Path(ckpt) / role).is_dir()]
        if absent:
            raise UserError(
                f"checkpoint {ckpt} has no {', '.join(r + '/' for r in absent)} folder, which this run needs "
                f"(roles: {', '.join(roles)}): it was saved by a run without that role. Resume it with "
                f"the config that wrote it, or start fresh (trainer.resume_mode=disable)"
            )
        for role in roles:  # one folder per role: actor/, critic/
            self.workers.load_checkpoint(str(Path(ckpt) / role), role=role)
        self.train_loader.load_state_dict(state["dataloader"])
        if state["rng"] is not None:
            load_rng_state(state["rng"])
        self.kl_ctrl.value = state["kl_coef"]
        self.global_step = CheckpointManager.step_of(ckpt)
        self.read_extra_state(Path(ckpt))
        log.info("resumed from %s at step %d (next batch: %s)", ckpt, self.global_step, state["dataloader"])

    def save_checkpoint(self) -> Path:
        step = self.global_step

        def write(tmp_dir: Path) -> None:
            for role in checkpointed_roles(self.workers.roles):
                self.workers.save_checkpoint(str(tmp_dir / role), role=role)
            save_trainer_state(
                tmp_dir / TRAINER_STATE_FILE,
                dataloader=self.train_loader.state_dict(),
                global_step=step,
                kl_coef=float(self.kl_ctrl.value),
                rng=save_rng_state(),
            )
            self.write_extra_state(tmp_dir)

        path = self.checkpoints.save(step, write)
        self.last_saved = (step, path)
        return path

    def write_extra_state(self, folder: Path) -> None:
        """What a subclass keeps in a checkpoint besides the roles and trainer_state.json (none here)."""

    def read_extra_state(self, ckpt: Path) -> None:
        """Read back what `write_extra_state` wrote into checkpoint `ckpt` (none here)."""

    def step_batches(self):
        """What each step of the loop is handed: the loader's prompt batches, one epoch per iteration."""
        return self.train_loader

    def stop_for_signal(self, signum: int, save_timing: dict[str, float]) -> None:
        """The end of a run stopped by a signal after a complete step: save it (unless this step
        was just saved, or trainer.save_on_preempt is false) and raise `Preempted` naming the
        checkpoint a rerun continues from."""
        name = preempt.signal_name(signum)
        step = self.global_step
        path: Path | None
        if self.last_saved is not None and self.last_saved[0] == step:
            path, how = self.last_saved[1], "saved"
        elif self.cfg.trainer.save_on_preempt:
            log.warning("%s: saving a checkpoint of step %d before stopping", name, step)
            with timed("save_checkpoint", save_timing):
                path = self.save_checkpoint()
            how = "saved"
        else:
            path, how = self.checkpoints.latest(), "not saved (trainer.save_on_preempt=false)"
        if how == "saved":
            where = f"saved checkpoint {path}"
        elif path is not None:
            where = f"{how}; the last complete checkpoint is {path} (step {CheckpointManager.step_of(path)})"
        else:
            where = f"{how}; there is no complete checkpoint in {self.checkpoints.root}"
        raise preempt.Preempted(
            f"stopped by {name} after step {step} of {self.total_training_steps}: {where}. Rerun the same "
            f"command (trainer.resume_mode=auto) to continue from it",
            preempt.exit_code_for(signum),
        )

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self, resume_from: Path | None = None) -> dict[str, float]:
        trainer_cfg = self.cfg.trainer
        self.last_saved = None  # (step, folder) of this run's newest save
        self.resume(resume_from)
        self.tracker.total_steps = self.total_training_steps
        # a resumed run already logged its validation at this step: validating again would add a row
        fresh = self.global_step == 0
        if self.val_loader is not None and (trainer_cfg.val_only or (trainer_cfg.val_before_train and fresh)):
            val_metrics = self.validate()
            self.tracker.log(val_metrics, step=self.global_step)
            if trainer_cfg.val_only:
                return val_metrics
        if self.global_step >= self.total_training_steps:
            log.warning(
                "nothing to do: the run in %s is already complete at step %d of %d "
                "(trainer.total_training_steps). To train further, raise trainer.total_training_steps "
                "(or trainer.total_epochs); to start over, set trainer.resume_mode=disable or use "
                "another af_output_dir",
                self.out_dir,
                self.global_step,
                self.total_training_steps,
            )
            return {}
        progress = ProgressBar(total=self.total_training_steps, initial=self.global_step)
        profiling = StepProfiling(self.cfg, self.out_dir, self.workers)
        metrics: dict[str, float] = {}
        save_timing: dict[str, float] = {}  # reported in the row of the step after the save
        curves = CurveRedraws()
        # a SIGTERM from here on lets the step in progress finish (verl_npu.trainer.preempt)
        preempt.set_phase("training")
        try:
            while self.global_step < self.total_training_steps:
                for prompts in self.step_batches():  # a Batch of data.train_batch_size prompts
                    self.global_step += 1
                    is_last = self.global_step >= self.total_training_steps
                    profiling.before_step(self.global_step)
                    metrics = self.train_step(prompts)
                    profiling.after_step(self.global_step, is_last)
                    test_freq = trainer_cfg.test_freq
                    if self.val_loader is not None and test_freq > 0 and (self.global_step % test_freq == 0 or is_last):
                        metrics.update(self.validate())
                    if save_timing:
                        metrics["timing_s/save_checkpoint"] = save_timing.pop("save_checkpoint")
                    # the row is written before the checkpoint: a crash in between never loses a row
                    self.tracker.log(metrics, step=self.global_step)
                    save_freq = trainer_cfg.save_freq
                    if save_freq > 0 and (self.global_step % save_freq == 0 or is_last):
                        with timed("save_checkpoint", save_timing):
                            self.save_checkpoint()
                    progress.update(self.global_step, metrics.get("critic/score/mean"))
                    if curves.due(self.global_step, is_last):
                        curves.draw(
                            self.out_dir / "metrics.jsonl",
                            self.out_dir / "training_curves.png",
                            builtin_rewards=not self.cfg.custom_reward_function.path,
                        )
                    if is_last:
                        break
                    signum = preempt.stop_requested()
                    if signum is not None:
                        self.stop_for_signal(signum, save_timing)
        finally:
            preempt.set_phase("finishing")
            progress.close()
            profiling.close()
        return metrics

    def train_step(self, prompts: Batch) -> dict[str, float]:
        cfg = self.cfg
        timings: dict[str, float] = {}
        sampling_metrics: dict[str, float] = {}
        with timed("step", timings):
            if self.dynamic_sampler is None:
                batch = self.generate(prompts, 0, timings)
                if cfg.trainer.balance_batch:
                    batch = batch.select(balance_for_ranks(batch["attention_mask"], self.workers.dp_size))
                with timed("reward", timings):
                    self.score(batch)
            else:  # DAPO's dynamic sampling: scored batches until train_batch_size groups are kept
                batch, sampling_metrics = self.dynamic_sampler.collect(
                    prompts, self.next_prompts, lambda p, k: self.generate(p, k, timings, score=True), self.global_step
                )
                if cfg.trainer.balance_batch:
                    batch = batch.select(balance_for_ranks(batch["attention_mask"], self.workers.dp_size))
            has_critic = self.workers.serves("compute_values")
            # a critic-warmup step does not update the actor: the update's forward cannot give the old log-probs
            update_actor = self.global_step > cfg.trainer.critic_warmup
            # rollout correction's bypass mode: the rollout's log-probs are the old ones (verl: apply_bypass_mode)
            old = (
                OldLogProbs.ROLLOUT
                if cfg.algorithm.rollout_correction.bypass_mode
                else OldLogProbs.UPDATE_FORWARD
                if update_actor and not self.old_log_prob_pass_needed()
                else OldLogProbs.PASS
            )
            with timed("old_log_prob", timings):
                if old is OldLogProbs.ROLLOUT:
                    batch.set("old_log_probs", self.rollout_log_probs(batch))
                elif old is OldLogProbs.PASS:
                    batch.update(self.workers.compute_log_prob(batch))
            sync_metrics = {} if old is OldLogProbs.ROLLOUT else self.check_rollout_sync(batch)
            entropy = (
                algorithms.masked_mean(batch["entropys"], batch["response_mask"].float())
                if old is OldLogProbs.PASS
                else None
            )
            if needs_reference(cfg):
                with timed("ref", timings):
                    batch.update(self.workers.compute_ref_log_prob(batch))
            teacher = role_with_method("compute_teacher_log_probs")
            if teacher in self.workers.roles:  # on-policy distillation: the teacher scores these samples
                with timed("teacher", timings):
                    batch.update(self.workers.dispatch("compute_teacher_log_probs", batch, role=teacher))
            if has_critic:
                with timed("values", timings):
                    batch.update(self.workers.compute_values(batch))
            with timed("adv", timings):
                kl_metrics = self.compute_advantages(batch)
            critic_metrics: dict[str, float] = {}
            if has_critic:
                with timed("update_critic", timings):
                    critic_metrics = self.workers.update_critic(batch)
            actor_metrics: dict[str, float] = {}
            if update_actor:
                with timed("update_actor", timings):
                    actor_metrics = self.workers.update_actor(batch, old)
            if old is OldLogProbs.UPDATE_FORWARD:  # the pass skipped: the update's forward's entropies
                kept = cast(TrainResult, actor_metrics).columns["entropys"]
                entropy = algorithms.masked_mean(kept, batch["response_mask"].float())
            if self.cfg.trainer.rollout_data_dir:
                self.dump_generations(batch, Path(self.cfg.trainer.rollout_data_dir))
        metrics = {
            "training/global_step": float(self.global_step),
            "training/epoch": float((self.global_step - 1) // max(len(self.train_loader), 1)),
        }
        if entropy is not None:  # bypass mode has no forward of the weights that sampled (as in verl)
            metrics["actor/entropy_before_update"] = float(entropy)
        self.stop_if_updates_keep_failing({**critic_metrics, **actor_metrics})
        metrics.update(critic_metrics)
        metrics.update(actor_metrics)
        metrics.update(sync_metrics)
        metrics.update(sampling_metrics)
        metrics.update(kl_metrics)
        metrics.update(data_metrics(batch, cfg.data.max_response_length))
        metrics.update(timing_metrics(timings, batch, self.workers.world_size))
        metrics.update(variance_proxy_metrics(batch, actor_metrics.get("actor/grad_norm")))  # with sum_pi_squared
        return metrics

    # ---- pieces of a step ---------------------------------------------------------------------
    def generate(self, prompts: Batch, k: int, timings: dict[str, float], score: bool = False) -> Batch:
        """`rollout.n` responses per prompt (uids `<step>-<i>`, `<step>-<k>-<i>` for the k-th generation
        batch of a dynamic-sampling step), ReMax's baseline, and with `score` the scores."""
        tag = f"{self.global_step}" if k == 0 else f"{self.global_step}-{k}"
        prompts.set("uid", [f"{tag}-{i}" for i in range(len(prompts))])
        with timed("gen", timings):
            batch = self.workers.generate_sequences(prompts, self.train_sampling)
        if ADVANTAGE_ESTIMATORS.spec(self.cfg.algorithm.adv_estimator).needs_greedy_baseline:
            with timed("gen_max", timings):
                batch.set("baseline_rewards", self.greedy_baseline(prompts))
        if score:
            with timed("reward", timings):
                self.score(batch)
        return batch

    def next_prompts(self) -> Batch:
        """The loader's next batch, into the next epoch when this one is used up (dynamic sampling)."""
        for _ in range(2):
            for prompts in self.train_loader:
                return prompts
        raise UserError(
            "the training loader yields no batch: data.train_files has fewer usable rows than "
            "data.gen_batch_size; lower data.gen_batch_size or add data"
        )

    def stop_if_updates_keep_failing(self, update_metrics: dict[str, float]) -> None:
        """Raise a UserError when a role's optimizer steps were skipped (non-finite gradients)
        `trainer.max_consecutive_skipped_updates` times in a row, before anything of this step is logged
        or saved: the weights have diverged."""
        limit = self.cfg.trainer.max_consecutive_skipped_updates
        for role in (spec.metrics for spec in ROLES.specs.values() if spec.trains):
            in_a_row = int(update_metrics.get(f"{role}/skipped_updates_in_a_row", 0))
            if limit is not None and in_a_row >= limit:
                latest = self.checkpoints.latest()
                raise UserError(
                    f"step {self.global_step}: the last {in_a_row} optimizer steps of the {role} were skipped for "
                    f"non-finite gradients (trainer.max_consecutive_skipped_updates={limit}): the run has "
                    f"diverged. Lower the {role}'s optim.lr, check the rewards, or lower grad_clip; "
                    + (
                        f"the last complete checkpoint, {latest}, is intact (resume from it after the change)"
                        if latest is not None
                        else "no checkpoint was saved"
                    )
                )

    def old_log_prob_pass_needed(self) -> bool:
        """Whether the separate old-log-prob pass runs (asked of the workers once, logged once)."""
        if self.old_log_prob_reasons is None:
            self.old_log_prob_reasons = list(self.workers.old_log_prob_pass_reasons())
            if self.old_log_prob_reasons:
                log.info("old-log-prob pass: runs (%s)", "; ".join(self.old_log_prob_reasons))
            else:
                log.info(
                    "old-log-prob pass: skipped, the update's own forward gives the old log-probs "
                    "(hf rollout, one epoch of one mini-batch, no KL in reward, no dropout)"
                )
        return bool(self.old_log_prob_reasons)

    def rollout_log_probs(self, batch: Batch) -> torch.Tensor:
        """The rollout engine's own log-probs (bypass mode's old log-probs); the config makes every engine
        return them (rollout.calculate_log_probs), so their absence is a bug of the engine."""
        if "rollout_log_probs" not in batch:
            raise RuntimeError(
                f"algorithm.rollout_correction.bypass_mode: the {self.cfg.actor_rollout_ref.rollout.name}"
                " rollout returned no rollout_log_probs although rollout.calculate_log_probs is true"
            )
        return batch["rollout_log_probs"]

    def rollout_correction(self, batch: Batch) -> dict[str, float]:
        """Decoupled rollout correction (verl's `compute_rollout_correction_and_add_to_batch`), once per step
        between the in-reward KL and the advantages: with the rollout's log-probs (rollout.calculate_log_probs),
        the rejected tokens leave `response_mask` and the IS weights go in as `rollout_is_weights` (the policy
        loss multiplies them in); the `rollout_corr/*` metrics. Nothing in bypass mode (the loss does it)."""
        settings = self.cfg.algorithm.rollout_correction
        if settings.bypass_mode or not self.cfg.actor_rollout_ref.rollout.calculate_log_probs:
            return {}
        if "rollout_log_probs" not in batch:
            raise RuntimeError(
                f"rollout.calculate_log_probs: the {self.cfg.actor_rollout_ref.rollout.name} rollout "
                "returned no rollout_log_probs"
            )
        out = algorithms.compute_rollout_correction(
            batch["old_log_probs"],
            batch["rollout_log_probs"],
            batch["response_mask"],
            rollout_is=settings.rollout_is,
            rollout_is_threshold=settings.rollout_is_threshold,
            rollout_is_batch_normalize=settings.rollout_is_batch_normalize,
            rollout_rs=settings.rollout_rs,
            rollout_rs_threshold=settings.rollout_rs_threshold,
        )
        batch.set("response_mask", out.response_mask)
        if out.weights is not None:
            batch.set("rollout_is_weights", out.weights.float())
        return out.metrics

    def check_rollout_sync(self, batch: Batch) -> dict[str, float]:
        """verl's rollout-vs-actor probability metrics, for engines that return log-probs; stops the
        run when the mean difference passes `rollout.max_probs_diff` (an engine sampling from other
        weights than the actor's must never be trained on)."""
        if "rollout_log_probs" not in batch:
            return {}
        metrics = rollout_probs_diff_metrics(batch["rollout_log_probs"], batch["old_log_probs"], batch["response_mask"])
        limit = self.cfg.actor_rollout_ref.rollout.max_probs_diff
        if ROLLOUT_ENGINES.spec(self.cfg.actor_rollout_ref.rollout.name).on_actor_module:
            limit = None  # it samples from the actor's own module: only top-k / top-p make the probabilities differ
        mean = metrics.get("training/rollout_probs_diff_mean", 0.0)
        if limit is not None and mean > limit:
            raise EngineOutOfSync(
                f"step {self.global_step}: the rollout engine is out of sync with the actor: mean |p_rollout - "
                f"p_actor| over response tokens is {mean:.4g} (max {metrics['training/rollout_probs_diff_max']:.4g}), "
                f"above actor_rollout_ref.rollout.max_probs_diff={limit:g}. The engine is sampling from "
                f"other weights than the actor's (a failed weight sync), or the rollout dtype is too coarse for "
                f"this limit: compare rollout.dtype with the actor's, raise max_probs_diff for bf16 / fp16 "
                f"rollouts, or set it to null to only log the difference. Nothing of this step was trained on; "
                f"the last complete checkpoint in {self.checkpoints.root} is intact."
            )
        return metrics

    def greedy_baseline(self, prompts: Batch) -> torch.Tensor:
        """ReMax's baseline: the score of one greedy response per prompt, repeated for its n samples."""
        greedy = self.workers.generate_sequences(prompts, replace(self.train_sampling, n=1, do_sample=False))
        self.score(greedy)
        return greedy["token_level_scores"].sum(-1).repeat_interleave(self.train_sampling.n)

    def decode_responses(self, batch: Batch) -> list[str]:
        # every response token the sequence holds (attention mask): a multi-turn response's tool turns too
        texts = []
        shown = batch["attention_mask"][:, -batch["responses"].shape[1] :]
        for ids, mask in zip(batch["responses"], shown):
            texts.append(self.tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True))
        return texts

    def score(self, batch: Batch, scorer=None) -> list[str]:
        """token_level_scores: the sequence score on the last response token, zeros elsewhere.

        With a reward model (reward_model.enable) the score is the model's (`rm_scores`, as in
        verl's reward managers, which return the model's scores when there are any); the rule
        reward is then computed only for logging, as the reward extra `rule_reward`
        (critic/score/rule_reward/mean, val-aux/<source>/rule_reward/mean@n), when every row's
        data source has a rule reward (custom_reward_function, or a built-in one)."""
        texts = self.decode_responses(batch)  # the one decode of the responses: the reward model reads it too
        scorer = scorer or self.reward_scorer
        with_rm = self.workers.serves("compute_rm_score")
        rule, extras = None, {}
        if not with_rm or scorer.covers(batch["data_source"]):
            rule, extras = scorer.score(
                texts,
                batch["data_source"],
                batch["ground_truth"],
                multi_turn_extra_info(batch),
                rows=batch["data_row"] if "data_row" in batch else None,  # errors name the dataset row
            )
        mask = batch["response_mask"]
        batch.set("response_text", texts)
        if with_rm:
            token_scores = self.workers.compute_rm_score(batch)["rm_scores"].float()
            if rule is not None:
                extras = {**extras, "rule_reward": list(rule)}
        else:
            rule = with_agent_scores(rule, batch)
            manager = REWARD_MANAGERS.load(self.cfg.reward_model.reward_manager)  # dapo: the overlong penalty, acc
            rule, extras = manager(
                rule,
                extras,
                mask.sum(-1).tolist(),
                self.cfg.reward_model.reward_kwargs,
                self.cfg.data.max_response_length,
            )
            token_scores = algorithms.scores_on_last_token(torch.tensor(rule, dtype=torch.float32), mask)
        batch.set("token_level_scores", token_scores)
        batch.meta["reward_extras"] = extras
        return texts

    def compute_advantages(self, batch: Batch) -> dict[str, float]:
        algo = self.cfg.algorithm
        # ROLL's reward normalisation (algorithm.reward_norm, verl-npu's keys): before the KL penalty and the
        # estimator, as in ROLL; token_level_scores stays the raw score (critic/score/*)
        scores, metrics = algorithms.apply_reward_norm(
            batch["token_level_scores"],
            batch["response_mask"],
            algo.reward_norm,
            uids=batch["uid"],
            data_sources=batch["data_source"],
        )
        if algo.use_kl_in_reward:
            rewards, kl_metrics = algorithms.apply_kl_in_reward(
                scores,
                batch["old_log_probs"],
                batch["ref_log_prob"],
                batch["response_mask"].float(),
                self.kl_ctrl,
                algo.kl_penalty,
            )
            metrics.update(kl_metrics)
        else:
            rewards = scores
        batch.set("token_level_rewards", rewards)
        metrics.update(self.rollout_correction(batch))  # may remove rejected tokens from response_mask
        advantages, returns = algorithms.compute_advantages(
            algo.adv_estimator,
            token_level_rewards=rewards,
            response_mask=batch["response_mask"].float(),
            group_ids=batch["uid"],
            config=algo,
            reward_components=batch.meta.get("reward_extras"),  # gdpo's per-component rewards
            # remax's baseline, gae's values; the optimal token baseline's old log-probs and sum of squared
            # probabilities (actor.calculate_sum_pi_squared), and rollout importance weights when there are any
            **{
                k: batch[k]
                for k in ("baseline_rewards", "values", "old_log_probs", "sum_pi_squared", "rollout_is_weights")
                if k in batch
            },
        )
        batch.set("advantages", advantages)
        batch.set("returns", returns)
        return {k: float(v) for k, v in metrics.items()}

    def dump_generations(self, batch: Batch, folder: Path, uids: list | None = None) -> None:
        """Append the batch's rows to `folder/<step>.jsonl`; `uids` names rows that have no uid (validation's)."""
        scores = batch["token_level_scores"].sum(-1).tolist()
        uids = batch.get("uid") or uids or [None] * len(batch)
        rows = [
            {
                "step": self.global_step,
                "uid": uid,
                "response": text,
                "ground_truth": gt,
                "score": score,
                "data_source": src,
            }
            for uid, text, gt, score, src in zip(
                uids, batch["response_text"], batch["ground_truth"], scores, batch["data_source"]
            )
        ]
        if "agent_turns" in batch:  # multi-turn: each trajectory's turns (role, text, tokens, trained, tool calls)
            for row, turns, rewards in zip(rows, batch["agent_turns"], batch["tool_rewards"]):
                row.update(turns=turns, tool_rewards=rewards)
            for row, scores in zip(rows, batch.get("turn_scores") or []):  # interactions' per-turn scores
                row["turn_scores"] = scores
        dump_jsonl(folder / f"{self.global_step}.jsonl", rows)

    # ---- validation ----------------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """Generate with `rollout.val_kwargs` over the whole validation set; mean reward per data source."""
        n = self.val_sampling.n
        per_source: dict[str, list[float]] = {}
        extras_per_source: dict[str, dict[str, list[float]]] = {}
        samples: list[str] = []
        turns: list[int] = []  # multi-turn: turns per trajectory (verl's val-aux/num_turns/*)
        dumped = 0  # validation prompts so far (validation_data_dir names rows by their place)
        for prompts in self.val_loader:  # one pass: the loader yields one epoch per iteration
            pad = (-len(prompts)) % self.workers.rollout_dp_size  # every rollout group needs an equal chunk
            if pad:
                prompts = Batch.concat([prompts, prompts.select([0] * pad)])
            batch = self.workers.generate_sequences(prompts, self.val_sampling)
            if pad:
                batch = batch.slice(0, len(batch) - pad * n)
            texts = self.score(batch)
            turns += list(batch.get("__num_turns__") or [])
            scores = batch["token_level_scores"].sum(-1).tolist()
            for i, (src, score) in enumerate(zip(batch["data_source"], scores)):
                per_source.setdefault(src, []).append(score)
                for name, values in batch.meta["reward_extras"].items():
                    extras_per_source.setdefault(src, {}).setdefault(name, []).append(values[i])
            budget = self.cfg.trainer.log_val_generations - len(samples)
            for i, (text, gt) in enumerate(list(zip(texts, batch["ground_truth"]))[: max(budget, 0)]):
                shown = batch["attention_mask"][i, -batch["responses"].shape[1] :].bool()  # tool turns too
                ids = batch["responses"][i][shown].tolist()
                samples.append(f"[ground truth: {gt}] {quoted_sample(readable_text(self.tokenizer, ids, text))}")
            if self.cfg.trainer.validation_data_dir:  # validation rows have no uid: name them by their place
                names = [f"val-{dumped + i // n}-{i % n}" for i in range(len(batch))]
                self.dump_generations(batch, Path(self.cfg.trainer.validation_data_dir), uids=names)
            dumped += len(batch) // n
        metrics = {}
        for src, values in per_source.items():
            metrics[f"val-core/{src}/reward/mean@{n}"] = sum(values) / len(values)
            for name, values_ in extras_per_source.get(src, {}).items():
                metrics[f"val-aux/{src}/{name}/mean@{n}"] = sum(values_) / len(values_)
        if turns:
            metrics.update(multi_turn_metrics(Batch(lists={"__num_turns__": turns}), prefix="val-aux/"))
        if samples:
            # one block in the log (the tracker prints it), TensorBoard and every experiment tracker
            self.tracker.log_text("val/generations", "\n".join(samples), step=self.global_step)
        return metrics
