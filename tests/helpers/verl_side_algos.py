"""Upstream verl 0.9.1's own policy losses and advantage estimators on given inputs (run in the verl side
venv by tests/algorithms/test_verl_algorithms.py; verl-npu is not importable there).

    python tests/helpers/verl_side_algos.py INPUTS.pt OUTPUTS.pt

INPUTS.pt (torch.save of a dict) holds `losses`: a list of cases, each with the tensors `log_prob`,
`old_log_prob`, `advantages`, `response_mask`, the `mode`, `loss_agg_mode`, `seed`, the actor settings
(`actor`: clip ratios, tau_pos/tau_neg, `policy_loss`: the mode's keys) and `global_batch_info` (verl's
dict: dp_size, batch_num_tokens, global_batch_size, loss_scale_factor; empty for a plain call) and optionally
`rollout_is_weights` (rollout correction's IS weights, which verl applies inside each loss); and
`estimators`: a list of cases with `name`, the tensors, `uids`, `algorithm` (AlgoConfig fields) and
`kwargs` (extra keyword arguments, e.g. values / reward_baselines / non_tensor_batch / batch); and
`variance_proxy` (optional): cases of batch tensors (`tensors`) and a `gradient_norm` for verl's
`compute_variance_proxy_metrics`.

For each loss case verl's `get_policy_loss_fn(mode)` is called as verl's `ppo_loss` calls it, with an
`ActorConfig` built from the settings (torch's global generator seeded with `seed` first: clip_cov draws
from it), and OUTPUTS gets `pg_loss`, the gradient of pg_loss with respect to log_prob, and the metrics
(verl's names without the `actor/` prefix). For each estimator case `get_adv_estimator_fn(name)` gives
(advantages, returns). For each variance-proxy case the metrics verl logs.
"""

from __future__ import annotations

import sys

import numpy as np
import torch


def run_loss(case: dict) -> dict:
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    settings = dict(case["actor"])
    policy_loss = PolicyLossConfig(loss_mode=case["mode"], **settings.pop("policy_loss"))
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        policy_loss=policy_loss,
        loss_agg_mode=case["loss_agg_mode"],
        global_batch_info=dict(case["global_batch_info"]),
        **settings,
    )
    log_prob = case["log_prob"].clone().requires_grad_(True)
    torch.manual_seed(case["seed"])
    pg_loss, metrics = get_policy_loss_fn(case["mode"])(
        old_log_prob=case["old_log_prob"],
        log_prob=log_prob,
        advantages=case["advantages"],
        response_mask=case["response_mask"],
        loss_agg_mode=case["loss_agg_mode"],
        config=config,
        rollout_is_weights=case.get("rollout_is_weights"),
    )
    pg_loss.backward()
    return {
        "pg_loss": pg_loss.detach(),
        "grad": log_prob.grad.detach(),
        "metrics": {k.removeprefix("actor/"): float(v) for k, v in metrics.items()},
    }


def run_estimator(case: dict) -> dict:
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    kwargs = dict(case["kwargs"])
    if "non_tensor_batch" in kwargs:
        kwargs["non_tensor_batch"] = {k: np.asarray(v) for k, v in kwargs["non_tensor_batch"].items()}
    if case["uids"] is not None:
        kwargs["index"] = np.array(case["uids"], dtype=object)
    if case["algorithm"] is not None:  # gae takes gamma / lam as arguments, not a config
        kwargs["config"] = AlgoConfig(**case["algorithm"])
    advantages, returns = get_adv_estimator_fn(case["name"])(
        token_level_rewards=case["token_level_rewards"].clone(), response_mask=case["response_mask"], **kwargs
    )
    return {"advantages": advantages, "returns": returns}


def run_variance_proxy(case: dict) -> dict:
    from verl import DataProto
    from verl.trainer.ppo.metric_utils import compute_variance_proxy_metrics

    batch = DataProto.from_dict(tensors=dict(case["tensors"]))
    return {k: float(v) for k, v in compute_variance_proxy_metrics(batch, case["gradient_norm"]).items()}


def main(inputs: str, outputs: str) -> None:
    torch.set_num_threads(1)
    cases = torch.load(inputs, weights_only=False)
    torch.save(
        {
            "losses": [run_loss(c) for c in cases["losses"]],
            "estimators": [run_estimator(c) for c in cases["estimators"]],
            "variance_proxy": [run_variance_proxy(c) for c in cases.get("variance_proxy", [])],
        },
        outputs,
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])
