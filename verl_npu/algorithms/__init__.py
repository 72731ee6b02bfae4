"""RL algorithms as pure tensor functions (``core``: advantages, the PPO policy loss, KL, loss
aggregation) and verl's further policy losses and advantage estimators (``policy_loss_modes``,
``advantage_modes``: each declared with ``@POLICY_LOSSES.register`` / ``@ADVANTAGE_ESTIMATORS.register``,
``verl_npu.registry``, and bound when this package imports it), and rollout correction (``rollout_correction``: IS weights, rejection
masks, off-policy metrics, the bypass_mode loss). Look names up here: ``policy_loss_fn(mode)``,
``compute_advantages(name, ...)``. ROLL's reward normalisation of the scores before the estimator
(``algorithm.reward_norm``) is ``reward_norm``."""

from verl_npu.algorithms import advantage_modes, policy_loss_modes, rollout_correction  # noqa: F401 - registers
from verl_npu.algorithms.core import (  # noqa: F401 - the package's face
    ADVANTAGE_ESTIMATORS,
    GRPO_EPS,
    KL_KINDS,
    LOG_RATIO_CLAMP,
    LOSS_AGG_MODES,
    LOW_VAR_KL_CLAMP,
    POLICY_LOSSES,
    WHITEN_EPS,
    AdaptiveKLController,
    FixedKLController,
    agg_loss,
    apply_kl_in_reward,
    clipped_value_loss,
    compute_advantages,
    kl_penalty,
    last_trained_token,
    make_kl_controller,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    policy_loss_fn,
    ppo_policy_loss,
    scores_on_last_token,
)
from verl_npu.algorithms.reward_norm import apply_reward_norm, normalize_scores  # noqa: F401
from verl_npu.algorithms.rollout_correction import (  # noqa: F401 - rollout correction (algorithm.rollout_correction)
    RolloutCorrection,
    bypass_mode_policy_loss,
    rollout_is_weights,
    rollout_offpolicy_metrics,
    rollout_rejection_mask,
)
from verl_npu.algorithms.rollout_correction import rollout_correction as compute_rollout_correction  # noqa: F401
