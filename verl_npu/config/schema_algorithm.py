"""The schema's keys of two algorithm features (`schema.SCHEMA` holds them with the rest): verl 0.9.1's
rollout correction (`algorithm.rollout_correction.*`, verl_npu/algorithms/rollout_correction.py) and
verl-npu's own ROLL reward normalisation (`algorithm.reward_norm.*`, verl_npu/algorithms/reward_norm.py).
Kept apart so that schema.py stays one readable file."""

from __future__ import annotations

from typing import Any

from verl_npu.config.key import BOOL, FLOAT, FLOAT_OR_STR, STR, Key
from verl_npu.rollout_corrections import BYPASS_LOSS_TYPES, ROLLOUT_IS_LEVELS, ROLLOUT_RS_OPTIONS  # names only

# A table: one call per key, kept one per line so that the keys read as rows (ruff format would put each
# argument on a line of its own).
# fmt: off

#: ROLL's reward normalisation (`algorithm.reward_norm.*`, a verl-npu extension; tensor code in
#: `verl_npu.algorithms.reward_norm`): which rows are normalised together, and how.
REWARD_NORM_GROUPINGS = {
    "state": "the rollout.n responses of one prompt (the same uid; ROLL: state / traj_group_id)",
    "batch": "every response of the step (ROLL: batch)",
    "inductive": "every response with the same data_source (ROLL: inductive / tags, the environment tag)",
}
REWARD_NORM_METHODS = {
    "identity": "scores unchanged (the default: no normalisation)",
    "mean": "score minus the group mean",
    "mean_std": "(score - group mean) / (group std + 1e-6); 0 for a group whose std is at most 1e-6",
    "asym_clip": "mean_std, then clamped to [-1, 3]",
}

AL = "algorithm"
KEYS: list[Key] = []


def _k(path: str, default: Any, type_: str, doc: str, **kw: Any) -> None:
    KEYS.append(Key(f"backend_config.{path}", default, type_, doc, **kw))


RC = f"{AL}.rollout_correction"
_k(f"{RC}.rollout_is", None, STR, "Rollout correction (verl 0.9.1): importance weights w = pi_old / pi_rollout "
   "(the actor's old log-probs against the rollout engine's own, which needs rollout.calculate_log_probs=true) "
   "that multiply the policy loss of every token: " + "; ".join(f"{k}: {v}" for k, v in ROLLOUT_IS_LEVELS.items())
   + ". null: no weights (with rollout.calculate_log_probs=true the rollout_corr/* diagnostics are still logged).",
   choices=tuple(ROLLOUT_IS_LEVELS))
_k(f"{RC}.rollout_is_threshold", 2.0, FLOAT_OR_STR, "Truncation of the importance weights (with rollout_is): a "
   "number U > 0 clamps every weight to at most U (TIS); the string 'L_U' (0 < L <= U, e.g. '0.5_5.0') sets the "
   "weights outside [L, U] to 0 (IcePop). Typical U: 1.5-5 (token), 2-10 (sequence). Write 'L_U' with a decimal "
   "point on both sides or quoted: unquoted, 0.5_5 is the number 0.55 (YAML and Hydra read _ in numbers).",
   nullable=True)
_k(f"{RC}.rollout_is_batch_normalize", False, BOOL, "Divide the importance weights by their batch mean (tokens for "
   "token, responses for sequence) so they average 1 (rollout_corr/rollout_is_batch_norm_factor).")
_k(f"{RC}.rollout_rs", None, STR, "Rejection sampling: tokens or whole responses whose divergence between the "
   "old and the rollout policy passes rollout_rs_threshold get no loss (their response_mask is 0). "
   "Comma-separated options, all of which must keep a token: " + "; ".join(
       f"{k}: {v}" for k, v in ROLLOUT_RS_OPTIONS.items()) + " (k1 = -d, k2 = d²/2, k3 = exp(d) - 1 - d, with d = "
   "old - rollout log-prob, clamped to +-20). "
   "null: no rejection.")
_k(f"{RC}.rollout_rs_threshold", None, FLOAT_OR_STR, "Thresholds of rollout_rs (required with it): one value for "
   "every option, or comma-separated, one per option in order. k2/k3 options: an upper bound U > 0; k1 options: "
   "ratio bounds 'L_U' (0 < L <= U; kept when log L <= k1 <= log U), or one number U meaning L = 1/U.")
_k(f"{RC}.bypass_mode", False, BOOL, "Bypass mode: the rollout engine's log-probs are used as the old log-probs "
   "(the actor's old-log-prob pass is skipped) and the policy loss becomes policy_loss.loss_mode=bypass_mode "
   "(importance weights and rejection computed in the loss from the current policy, by loss_type). false: "
   "decoupled mode: the old log-probs are recomputed and the weights / rejection applied to them once per step.")
_k(f"{RC}.loss_type", "ppo_clip", STR, "The loss of bypass mode: " + "; ".join(f"{k}: {v}" for k, v in
   BYPASS_LOSS_TYPES.items()) + ". Read only with bypass_mode=true.", choices=tuple(BYPASS_LOSS_TYPES))
RN = f"{AL}.reward_norm"  # verl-npu's own keys: ROLL's reward normalisation (verl_npu/algorithms/reward_norm.py)
_k(f"{RN}.method", "identity", STR, "verl-npu: (ROLL's reward_normalization.method) how each response's score is "
   "normalised within its group before the KL penalty and the advantage estimator: " + "; ".join(
       f"{name}: {doc}" for name, doc in REWARD_NORM_METHODS.items()) + ". The result replaces the score on the "
   "last response token (critic/rewards/* shows it; critic/score/* stays the raw score).",
   choices=tuple(REWARD_NORM_METHODS))
_k(f"{RN}.grouping", "state", STR, "verl-npu: (ROLL's reward_normalization.grouping) which responses are normalised "
   "together: " + "; ".join(f"{name}: {doc}" for name, doc in REWARD_NORM_GROUPINGS.items()) + ".",
   choices=tuple(REWARD_NORM_GROUPINGS))
_k(f"{RN}.clip", None, FLOAT, "verl-npu: (ROLL's reward_clip) after reward_norm.method, clamp each score to "
   "[-clip, clip] (the share clamped is logged as critic/reward_clip_frac); null: no clip.", gt=0)
