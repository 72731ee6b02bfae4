"""Policy losses by name (`actor.policy_loss.loss_mode`): what the config may name.

Names and one-line meanings only (nothing heavy is imported), so the config schema takes its
choices from here; the tensor functions are registered under the same names in
`verl_npu.algorithms.POLICY_LOSSES` (a test checks the two agree). Adding a loss: register its
name here and its function there.
"""

from __future__ import annotations

#: loss_mode -> what it computes
POLICY_LOSS_MODES: dict[str, str] = {
    "vanilla": "dual-clip PPO",
}

#: loss modes upstream verl has and verl-npu does not: refused by name.
UNSUPPORTED_POLICY_LOSSES = ("gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo", "dppo_tv", "dppo_kl",
                             "dro", "bypass_mode")
