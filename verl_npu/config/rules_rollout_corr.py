"""Cross-key rules of rollout correction (`algorithm.rollout_correction.*`, verl 0.9.1), registered in `rules.RULES`.

The threshold strings are read by `verl_npu.rollout_corrections` (torch-free), the same functions the trainer's
tensor code uses, so a value accepted here is one the run can use. Kept apart from `rules.py` so that each file
stays small; `paths` (and so `loader`) imports this module, which registers its rules.
"""

from __future__ import annotations

from collections.abc import Iterator

from verl_npu.config.rules import Ctx, _rule
from verl_npu.config.schema import SCHEMA
from verl_npu.config.tree import ACTOR, ALGO, BC, ROLL
from verl_npu.errors import Problem
from verl_npu.registry import POLICY_LOSSES
from verl_npu.rollout_corrections import parse_is_threshold, parse_rs_options, parse_rs_thresholds

RC = ALGO + "rollout_correction."
IS, IS_T, IS_NORM = RC + "rollout_is", RC + "rollout_is_threshold", RC + "rollout_is_batch_normalize"
RS, RS_T, BYPASS, LOSS_TYPE = RC + "rollout_rs", RC + "rollout_rs_threshold", RC + "bypass_mode", RC + "loss_type"
LOSS_MODE, LOG_PROBS = ACTOR + "policy_loss.loss_mode", ROLL + "calculate_log_probs"


def _short(key: str) -> str:
    return key.removeprefix(BC)


def active(c: Ctx) -> bool:
    """Rollout correction changes the training (weights, rejection or bypass mode), not only the metrics."""
    return c(IS) is not None or c(RS) is not None or c(BYPASS) is True


@_rule(
    "rollout_correction_thresholds",
    (IS, IS_T, IS_NORM, RS, RS_T),
    "rollout_is_threshold: a number > 0 or 'lower_upper' (0 < lower <= upper), not null with rollout_is; "
    "rollout_rs: comma-separated known options; rollout_rs_threshold: required with rollout_rs, one value or "
    "one per option, k1 options a number or 'lower_upper', the others a number > 0",
)
def _thresholds(c: Ctx) -> Iterator[Problem]:
    threshold = c(IS_T)
    if threshold is None:
        if c(IS) is not None:
            yield Problem(
                IS_T,
                f"is null, but rollout_is={c(IS)} needs it (verl would then apply no weights)",
                f"set {_short(IS_T)}=2.0 (TIS) or a 'lower_upper' IcePop range like '0.5_5.0', or {_short(IS)}=null",
            )
    else:
        try:
            parse_is_threshold(threshold)
        except ValueError as exc:
            yield Problem(
                IS_T,
                f"{threshold!r}: {exc}",
                "set a positive number such as 2.0 (truncate the weights "
                "at it) or 'lower_upper' with 0 < lower <= upper, e.g. '0.5_5.0' (zero the weights "
                "outside)",
            )
    if c(IS) is None and c(IS_NORM):
        c.warnings.append(f"{_short(IS_NORM)}=true has no effect with {_short(IS)}=null (there are no weights)")
    spec, rs_threshold = c(RS), c(RS_T)
    if spec is None:
        if rs_threshold is not None:
            c.warnings.append(f"{_short(RS_T)}={rs_threshold} has no effect with {_short(RS)}=null")
        return
    try:
        options = parse_rs_options(spec)
    except ValueError as exc:
        yield Problem(
            RS,
            f"{spec!r}: {exc}",
            "set one option or several separated by commas, e.g. "
            "'token_k1' or 'seq_mean_k3,token_k1', or null for no rejection",
        )
        return
    try:
        parse_rs_thresholds(options, rs_threshold)
    except ValueError as exc:
        yield Problem(
            RS_T,
            f"{rs_threshold!r}: {exc}" if rs_threshold is not None else str(exc),
            f"set {_short(RS_T)} for rollout_rs={spec!r}: one value for all options or one per option, "
            "comma-separated; k2/k3 options take an upper bound > 0 (e.g. 0.01), k1 options ratio bounds "
            "'lower_upper' (e.g. '0.5_2.0') or one upper bound",
        )


@_rule(
    "rollout_correction_log_probs",
    (IS, RS, BYPASS, LOG_PROBS),
    "rollout correction (rollout_is, rollout_rs or bypass_mode) needs rollout.calculate_log_probs=true",
)
def _log_probs(c: Ctx) -> Iterator[Problem]:
    if active(c) and c(LOG_PROBS) is False:
        on = [f"{_short(k)}={c(k)}" for k in (IS, RS, BYPASS) if c(k) not in (None, False)]
        yield Problem(
            LOG_PROBS,
            f"is false, but {', '.join(on)} needs the rollout engine's own log-probs",
            f"set {_short(LOG_PROBS)}=true (or leave it unset), or turn rollout correction off",
        )


@_rule(
    "rollout_correction_bypass",
    (BYPASS, LOSS_TYPE, LOSS_MODE),
    "bypass_mode=true replaces the policy loss (actor.policy_loss.loss_mode vanilla or bypass_mode only); "
    "loss_mode=bypass_mode needs bypass_mode=true; loss_type is read only in bypass mode",
)
def _bypass(c: Ctx) -> Iterator[Problem]:
    mode = c(LOSS_MODE)
    spec = POLICY_LOSSES.find(mode)
    if c(BYPASS):
        if spec is not None and not (spec.rollout_correction or spec.bypass_replaces):
            yield Problem(
                LOSS_MODE,
                f"is {mode!r}, but algorithm.rollout_correction.bypass_mode=true replaces the "
                "policy loss with the bypass_mode loss (loss_type ppo_clip: vanilla's dual clip; reinforce)",
                f"set {_short(LOSS_MODE)}=bypass_mode (or vanilla), or {_short(BYPASS)}=false to keep "
                f"{mode} with decoupled rollout correction",
            )
        return
    if spec is not None and spec.rollout_correction:
        yield Problem(
            LOSS_MODE,
            "is bypass_mode, which uses the rollout's log-probs as the old policy, but "
            "algorithm.rollout_correction.bypass_mode is false (the old log-probs would be recomputed)",
            f"set {_short(BYPASS)}=true, or another loss_mode (e.g. vanilla)",
        )
    if c(LOSS_TYPE) != SCHEMA[LOSS_TYPE].default:
        c.warnings.append(f"{_short(LOSS_TYPE)}={c(LOSS_TYPE)} has no effect without {_short(BYPASS)}=true")
