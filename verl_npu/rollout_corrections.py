"""Rollout correction (`algorithm.rollout_correction.*`) by name: the modes the config may name (read from
the `ROLLOUT_CORRECTIONS` registry) and the parsing of its threshold strings, torch-free.

The config schema and rules take their choices and checks from here without importing torch; the tensor
functions (`verl_npu.algorithms.rollout_correction`) parse their arguments with the same functions, so a
value the config accepts is a value the trainer can use, and the other way round.

Threshold spellings (upstream verl 0.9.1's):
- `rollout_is_threshold`: a positive number (or a string holding one), the upper bound U of a truncated
  importance weight (TIS: weights clamped to at most U); or the string `"L_U"` (0 < L <= U): IcePop,
  weights outside [L, U] set to 0.
- `rollout_rs_threshold`: one entry, or one per option of `rollout_rs` (a comma-separated string), each a
  positive number; a k1 option (`*_k1`) also takes `"L_U"` (ratio bounds, 0 < L <= U), and a single
  number U there means L = 1/U.
"""

from __future__ import annotations

from verl_npu.registry import ROLLOUT_CORRECTIONS, correction_modes

#: the modes each key names, declared with `@ROLLOUT_CORRECTIONS.register` beside their tensor code
#: (verl_npu/algorithms/rollout_correction.py), read here without importing it: name -> what it does.
#: `rollout_is`: how the importance weight of a response is aggregated (null: no weights, metrics only)
ROLLOUT_IS_LEVELS: dict[str, str] = {name: spec.doc for name, spec in correction_modes("rollout_is").items()}
#: `rollout_rs` options: the statistic each rejects on (k1 = -d, k2 = d²/2, k3 = exp(d) - 1 - d, with d = old -
#: rollout log-prob per token, clamped to ±20) and whether it judges each token or a whole response
ROLLOUT_RS_OPTIONS: dict[str, str] = {
    name: f"{spec.doc} of {spec.statistic}, kept when " + ("log(L) <= it <= log(U)" if spec.ratio_bounds else "it <= U")
    for name, spec in correction_modes("rollout_rs").items()
}
#: `loss_type` of bypass mode
BYPASS_LOSS_TYPES: dict[str, str] = {name: spec.doc for name, spec in correction_modes("loss_type").items()}


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{what}: {text!r} is not a finite number")
    return value


def parse_is_threshold(spec) -> tuple[float, float | None]:
    """(upper, lower or None) of a `rollout_is_threshold`; ValueError saying what is wrong."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"must be a positive number or a 'lower_upper' string, got {spec!r}")
    text = str(spec).strip()
    if not text:
        raise ValueError("must not be an empty string")
    lower = None
    if isinstance(spec, str) and "_" in text:
        low_text, up_text = text.split("_", 1)
        lower, upper = _number(low_text, "the lower bound"), _number(up_text, "the upper bound")
    else:
        upper = _number(text, "the threshold")
    if upper <= 0:
        raise ValueError(f"the upper bound must be positive, got {upper:g}")
    if lower is not None and lower <= 0:
        raise ValueError(f"the lower bound must be positive, got {lower:g}")
    if lower is not None and lower > upper:
        raise ValueError(f"the lower bound {lower:g} is above the upper bound {upper:g}")
    return upper, lower


def parse_rs_options(spec) -> list[str]:
    """The distinct options of a `rollout_rs` string, in order; ValueError naming an unknown one."""
    if not isinstance(spec, str):
        raise ValueError(f"must be a string of comma-separated options, got {spec!r}")
    options = list(dict.fromkeys(part.strip() for part in spec.split(",") if part.strip()))
    if not options:
        raise ValueError("names no option")
    unknown = [opt for opt in options if opt not in ROLLOUT_RS_OPTIONS]
    if unknown:
        raise ValueError(
            f"{', '.join(map(repr, unknown))} is not an option; the options are: " + ", ".join(ROLLOUT_RS_OPTIONS)
        )
    return options


def parse_rs_thresholds(options: list[str], spec) -> dict[str, tuple[float, float | None]]:
    """{option: (upper, lower)} for the `rollout_rs` options; lower is None except for k1 options
    (whose single-number spelling U means lower = 1/U). ValueError saying what is wrong."""
    if spec is None:
        raise ValueError("is null, but rollout_rs is set: every option needs a threshold")
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ValueError(f"must be a number or a string of comma-separated thresholds, got {spec!r}")
    entries = [str(spec)] if not isinstance(spec, str) else [p.strip() for p in spec.split(",") if p.strip()]
    if not entries:
        raise ValueError("holds no threshold")
    if len(entries) not in (1, len(options)):
        raise ValueError(
            f"has {len(entries)} thresholds for {len(options)} rollout_rs options: give one "
            f"shared by all, or one per option ({', '.join(options)})"
        )
    entries = entries * len(options) if len(entries) == 1 else entries
    out: dict[str, tuple[float, float | None]] = {}
    for option, entry in zip(options, entries):
        what = f"the threshold {entry!r} of {option}"
        if ROLLOUT_CORRECTIONS.spec(option).ratio_bounds:
            if "_" in entry:
                low_text, up_text = entry.split("_", 1)
                lower, upper = _number(low_text, what), _number(up_text, what)
            else:
                upper = _number(entry, what)
                lower = 1.0 / upper if upper > 0 else upper
            if lower <= 0 or upper <= 0:
                raise ValueError(f"{what}: ratio bounds must be positive")
            if lower > upper:
                raise ValueError(f"{what}: the lower bound is above the upper bound")
            out[option] = (upper, lower)
        else:
            if "_" in entry:
                raise ValueError(f"{what}: {option} takes one upper bound (a 'lower_upper' pair is for k1 options)")
            upper = _number(entry, what)
            if upper <= 0:
                raise ValueError(f"{what}: it must be positive")
            out[option] = (upper, None)
    return out
