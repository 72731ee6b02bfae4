"""Policy losses by name (`actor.policy_loss.loss_mode`): what the config may name.

Names and one-line meanings only (nothing heavy is imported), so the config schema takes its
choices from here; the tensor functions are registered under the same names in
`verl_npu.algorithms.POLICY_LOSSES` (a test checks the two agree). Adding a loss: register its
name here and its function there.
"""

from __future__ import annotations

#: loss_mode -> what it computes (the formulas are in each function's docstring)
POLICY_LOSS_MODES: dict[str, str] = {
    "vanilla": "dual-clip PPO",
    "gspo": "GSPO: PPO clip on the sequence-level (length-normalised) ratio",
    "sapo": "SAPO: a smooth sigmoid gate of the ratio (actor.tau_pos / tau_neg) instead of a hard clip; "
            "always averaged per sequence (seq-mean-token-mean)",
    "gpg": "GPG: plain policy gradient -A x log-prob, no ratio or clip",
    "clip_cov": "Clip-Cov: PPO clip, plus no gradient for a random few tokens of high advantage/log-prob covariance "
                "(policy_loss.clip_cov_ratio / clip_cov_lb / clip_cov_ub)",
    "kl_cov": "KL-Cov: unclipped ratio loss, plus a |log-ratio| penalty on the tokens of highest covariance "
              "(policy_loss.kl_cov_ratio / ppo_kl_coef)",
    "geo_mean": "GMPO: the geometric mean of the token ratios per sequence, clipped token-wise",
    "cispo": "CISPO: -clip(ratio) x A x log-prob with the clipped ratio as a constant weight",
    "dppo_tv": "DPPO with a binary total-variation trust region (clip_ratio_low/high are the thresholds; "
               "clip_ratio_c truncates the weight)",
    "dppo_kl": "DPPO with a binary KL trust region (thresholds and truncation as dppo_tv)",
    "dro": "DRO: -(A x log-prob - dro_beta/2 x log-ratio^2) (policy_loss.dro_beta)",
    "bypass_mode": "rollout correction's bypass mode: the rollout engine's log-probs as the old policy (no "
                   "old-log-prob pass), IS weights and rejection from algorithm.rollout_correction.*, the loss "
                   "by its loss_type (ppo_clip or reinforce); selected by algorithm.rollout_correction.bypass_mode",
}

#: loss modes upstream verl has and verl-npu does not: refused by name.
UNSUPPORTED_POLICY_LOSSES: tuple[str, ...] = ()
