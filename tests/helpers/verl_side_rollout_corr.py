"""Upstream verl 0.9.1's own rollout correction on given inputs (run in the verl side venv by
tests/algorithms/test_verl_rollout_correction.py; verl-npu is not importable there).

    python tests/helpers/verl_side_rollout_corr.py INPUTS.pt OUTPUTS.pt

INPUTS.pt (torch.save of a dict) holds
- `corrections`: cases with `old_log_prob`, `rollout_log_prob`, `response_mask` and `settings` (the keys of
  `algorithm.rollout_correction`); each is run through verl's `compute_rollout_correction_and_rejection_mask`,
  giving `weights` (None without rollout_is), `mask` and `metrics` (verl's names, `rollout_corr/` prefix);
- `bypass`: policy-loss cases (`log_prob`, `old_log_prob` = the rollout's, `advantages`, `response_mask`,
  `loss_agg_mode`, `actor` settings, `settings`) run through verl's `bypass_mode` policy loss with an
  `ActorConfig` whose `policy_loss.rollout_correction` holds the settings (where verl's trainer puts them);
- `losses`: cases of tests/helpers/verl_side_algos.py with `rollout_is_weights` (verl applies them inside each loss).
Loss outputs: `pg_loss`, its gradient with respect to log_prob, the metrics (`actor/` prefix removed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verl_side_algos import run_loss  # noqa: E402 - after the path is set


def run_correction(case: dict) -> dict:
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    s = case["settings"]
    proto, mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=case["old_log_prob"],
        rollout_log_prob=case["rollout_log_prob"],
        response_mask=case["response_mask"],
        rollout_is=s["rollout_is"],
        rollout_is_threshold=s["rollout_is_threshold"],
        rollout_is_batch_normalize=s["rollout_is_batch_normalize"],
        rollout_rs=s["rollout_rs"],
        rollout_rs_threshold=s["rollout_rs_threshold"],
    )
    return {
        "weights": None if proto is None else proto.batch["rollout_is_weights"],
        "mask": mask,
        "metrics": {k: float(v) for k, v in metrics.items()},
    }


def run_bypass(case: dict) -> dict:
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    settings = dict(case["actor"])
    policy_loss = PolicyLossConfig(
        loss_mode="bypass_mode",
        **settings.pop("policy_loss"),
        rollout_correction=RolloutCorrectionConfig(**case["settings"]),
    )
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        policy_loss=policy_loss,
        loss_agg_mode=case["loss_agg_mode"],
        global_batch_info={},
        **settings,
    )
    log_prob = case["log_prob"].clone().requires_grad_(True)
    pg_loss, metrics = get_policy_loss_fn("bypass_mode")(
        old_log_prob=case["old_log_prob"],
        log_prob=log_prob,
        advantages=case["advantages"],
        response_mask=case["response_mask"].bool(),
        loss_agg_mode=case["loss_agg_mode"],
        config=config,
    )
    pg_loss.backward()
    return {
        "pg_loss": pg_loss.detach(),
        "grad": log_prob.grad.detach(),
        "metrics": {k.removeprefix("actor/"): float(v) for k, v in metrics.items()},
    }


def main(inputs: str, outputs: str) -> None:
    torch.set_num_threads(1)
    cases = torch.load(inputs, weights_only=False)
    torch.save(
        {
            "corrections": [run_correction(c) for c in cases["corrections"]],
            "bypass": [run_bypass(c) for c in cases["bypass"]],
            "losses": [run_loss(c) for c in cases["losses"]],
        },
        outputs,
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])
