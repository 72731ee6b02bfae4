"""Rule rewards keyed by ``data_source``, custom reward loading, and batch scoring.

A reward function has verl's signature::

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

``ground_truth`` is the row's ``reward_model.ground_truth`` as the parquet stores it, as verl passes it: a
string, or a number, list or dict (a parquet struct) for data that stores one; the built-in rewards that
compare text read a number as its text.

A dict result has a ``"score"`` (the reward) and any named sub-scores (e.g. ``accuracy``,
``format``); ``RewardScorer`` returns every numeric sub-score so the trainer can log it.

Shipped rewards (``register_reward`` adds more):

==================== =========================================== ===============================
data_source          score                                       module
==================== =========================================== ===============================
hiyouga/geometry3k   0.9 * accuracy + 0.1 * format               ``verl_npu.rewards.geo3k``
openai/gsm8k         strict ``#### n`` match (flexible logged)   ``verl_npu.rewards.gsm8k``
synthetic_geometry   accuracy * (0.8 + 0.2 * clean)             ``verl_npu.rewards.synthetic_geometry``
synthetic_arithmetic 0.9 * accuracy + 0.1 * format               ``verl_npu.rewards.synthetic_arithmetic``
grid_env             the episode's return (sum of turn scores)   ``verl_npu.rewards.grid_env``
tool_lookup          1 if the last ``#### n`` is the looked-up code ``verl_npu.rewards.tool_lookup``
searchR1_*           exact match of the last <answer>...</answer> ``verl_npu.rewards.search_r1``
==================== =========================================== ===============================

(``searchR1_*``: verl's seven Search-R1 sources, ``searchR1_nq`` ... ``searchR1_bamboogle``, and
``searchR1_synthetic``, the set ``data_prep/search_r1.py --synthetic`` writes.)
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import math
import numbers
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_npu.config.typed import defaults, section
from verl_npu.errors import UserError
from verl_npu.registry import REWARD_MANAGERS
from verl_npu.rewards import geo3k, grid_env, gsm8k, search_r1, synthetic_arithmetic, synthetic_geometry, tool_lookup

RewardFn = Callable[..., "float | dict"]

#: seconds one reward call may take (custom_reward_function.timeout_s; null: no limit)
DEFAULT_TIMEOUT_S = defaults("custom_reward_function").timeout_s  # the schema's
#: alarms a timed-out reward may swallow (one a second) before the process is ended
STUCK_ALARMS = 5
_BUILTIN = "verl_npu.rewards.default_compute_score (the built-in rewards)"

_REGISTRY: dict[str, RewardFn] = {}

#: the largest finite float32: rewards are trained as float32 tensors
FLOAT32_MAX = 3.4028234663852886e38


@REWARD_MANAGERS.register("naive", doc="one reward call per response")
def naive_scores(scores, extras, valid_response_lengths, reward_kwargs, max_response_length):
    """The naive manager's `(scores, extras)`: the reward function's, unchanged."""
    return list(scores), extras


def register_reward(data_source: str, fn: RewardFn | None = None):
    """Register ``fn`` as the reward of ``data_source`` (replacing any earlier one); usable as a decorator."""
    if fn is None:
        return lambda f: register_reward(data_source, f)
    _REGISTRY[data_source] = fn
    return fn


def registered_data_sources() -> list[str]:
    """The data sources that ``default_compute_score`` knows, sorted."""
    return sorted(_REGISTRY)


register_reward("hiyouga/geometry3k", geo3k.compute_score)
register_reward("openai/gsm8k", gsm8k.compute_score)
register_reward("synthetic_geometry", synthetic_geometry.compute_score)
register_reward("synthetic_arithmetic", synthetic_arithmetic.compute_score)
register_reward("grid_env", grid_env.compute_score)
register_reward("tool_lookup", tool_lookup.compute_score)
for _source in search_r1.DATA_SOURCES:
    register_reward(_source, search_r1.compute_score)

#: data source -> (best expected score of a policy that ignores its input, what it ignores): the
#: demo tasks' answers are balanced, so a score above this means the policy reads its input
BLIND_CEILINGS: dict[str, tuple[float, str]] = {
    "synthetic_geometry": (synthetic_geometry.BLIND_BEST_SCORE, "picture"),
    "synthetic_arithmetic": (synthetic_arithmetic.BLIND_BEST_SCORE, "question"),
    "grid_env": (grid_env.BLIND_BEST_SCORE, "grid"),
}


def blind_ceiling(data_source: str) -> tuple[float, str] | None:
    """``(score, "picture" | "question")`` for a built-in demo task (``BLIND_CEILINGS``), else None."""
    return BLIND_CEILINGS.get(data_source)


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float | dict:
    """The registered reward of ``data_source`` applied to one response.

    Raises:
        UserError: no reward is registered for ``data_source``.
    """
    fn = _REGISTRY.get(data_source)
    if fn is None:
        raise UserError(
            f"no reward function for data_source {data_source!r} (known: {', '.join(registered_data_sources())}); "
            "set custom_reward_function.path (and .name) to a file with your "
            "compute_score(data_source, solution_str, ground_truth, extra_info=None), or fix the data_source column"
        )
    return fn(data_source, solution_str, ground_truth, extra_info)


def _timeout_of(cfg: Any) -> float | None:
    """``custom_reward_function.timeout_s`` of the typed section: null -> None (no limit).

    Raises:
        UserError: the value is not a positive number.
    """
    value = cfg.timeout_s
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value) > 0:
        raise UserError(
            f"custom_reward_function.timeout_s must be a positive number of seconds or null (no limit), got {value!r}"
        )
    return float(value)


class RewardFunction:
    """A reward function with what errors call it (``name``) and its per-call limit (``timeout_s``,
    None: none). Calling it calls the function."""

    def __init__(self, fn: RewardFn, name: str, timeout_s: float | None = DEFAULT_TIMEOUT_S):
        self.fn = fn
        self.name = name
        self.timeout_s = timeout_s

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"RewardFunction({self.name}, timeout_s={self.timeout_s})"


def load_reward_fn(custom_reward_function_cfg: Any = None) -> RewardFunction:
    """The user's reward (``custom_reward_function.path`` / ``.name``), else ``default_compute_score``,
    as a `RewardFunction` carrying its name and ``custom_reward_function.timeout_s``.

    `custom_reward_function_cfg` is that section: typed, or a dict / OmegaConf node (its other keys, or
    all of them for None, at the schema's defaults). ``reward_kwargs`` (a mapping), when set, is bound
    as extra keyword arguments of the user's function.

    Raises:
        UserError: the file is missing, fails to import, or has no callable of that name (the
            message names the file and the function); ``timeout_s`` is not a positive number.
    """
    cfg = section("custom_reward_function", custom_reward_function_cfg)
    timeout_s = _timeout_of(cfg)
    if not cfg.path:
        return RewardFunction(default_compute_score, _BUILTIN, timeout_s)
    name = cfg.name
    file = Path(cfg.path).expanduser()
    if not file.is_file():
        raise UserError(f"custom_reward_function.path: file {file} does not exist; give the path to a .py file")
    module_name = f"verl_npu_custom_reward_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise UserError(f"custom_reward_function.path: {file} cannot be loaded as a Python module; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # lets the user's module pickle its own objects (Ray workers)
    try:
        spec.loader.exec_module(module)
    except SystemExit as e:
        sys.modules.pop(module_name, None)
        raise UserError(f"custom_reward_function.path: importing {file} called sys.exit({e.code!r})") from None
    except Exception as e:
        sys.modules.pop(module_name, None)
        raise UserError(f"custom_reward_function.path: importing {file} failed ({type(e).__name__}: {e})") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        funcs = [n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")]
        raise UserError(
            f"custom_reward_function.name: {file} has no function {name!r} "
            f"(functions there: {', '.join(funcs) or 'none'}); set custom_reward_function.name"
        )
    if cfg.reward_kwargs:
        fn = functools.partial(fn, **dict(cfg.reward_kwargs))
    return RewardFunction(fn, f"{name} in {file}", timeout_s)


# ------------------------------------------------------------------ calling a reward safely
class RewardTimeout(BaseException):
    """Raised inside a reward function that passed its deadline. A BaseException, so that the
    function's own ``except Exception`` does not swallow it."""


def numeric_subscores(result: dict) -> dict[str, float]:
    """A reward dict's entries other than 'score' that are numbers (`as_score`): logged per key."""
    return {str(k): sub for k, v in result.items() if k != "score" and (sub := as_score(v)) is not None}


def as_score(value: Any) -> float | None:
    """``value`` as a float when it is a real number, else None.

    Accepted: int, float, bool (True = 1.0, False = 0.0, as verl's reward managers store a bool
    into a float tensor), numpy / torch scalars and one-element arrays. Refused (None): str
    (``"1"`` included), None, lists, dicts, complex numbers, anything else.
    """
    if type(value).__module__.split(".")[0] in ("numpy", "torch") and hasattr(value, "item"):
        try:
            value = value.item()
        except (ValueError, RuntimeError):  # more than one element
            return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return None


def _call_with_alarm(fn: Callable, args: tuple, timeout_s: float, stuck_message: str) -> tuple[bool, Any]:
    """``(True, result)``, or ``(False, None)`` when ``fn`` ran past ``timeout_s``.

    Main thread only: SIGALRM interrupts Python code, sleeps and I/O, and C loops that check for
    signals (a catastrophic regular expression included). The alarm repeats every second until
    the call returns, so a reward that catches the first one gets another; one that swallows
    `STUCK_ALARMS` of them (a bare ``except:`` in a loop) cannot be stopped from inside the
    process, so the process ends (exit status 1) after printing ``stuck_message``. A timer that
    was already running (e.g. pytest-timeout's) is put back with its remaining time.
    """
    state = {"done": False, "fired": 0}

    def on_alarm(signum, frame):  # noqa: ARG001
        if state["done"]:
            return
        state["fired"] += 1
        if state["fired"] > STUCK_ALARMS:
            _die(stuck_message)
        raise RewardTimeout()

    start = time.monotonic()
    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    previous_timer = signal.setitimer(signal.ITIMER_REAL, timeout_s, 1.0)
    try:
        try:
            result = fn(*args)
        finally:
            state["done"] = True
    except RewardTimeout:
        return False, None
    except (Exception, SystemExit):
        if state["fired"]:  # the function turned the timeout into an error of its own
            return False, None
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler if previous_handler is not None else signal.SIG_DFL)
        if previous_timer[0] > 0:
            left = previous_timer[0] - (time.monotonic() - start)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), previous_timer[1])
    if state["fired"]:  # caught the alarm and returned late: still a timeout
        return False, None
    return True, result


def _call_in_thread(fn: Callable, args: tuple, timeout_s: float) -> tuple[bool, Any]:
    """Like `_call_with_alarm`, for callers outside the main thread: the call runs in a daemon
    thread that is abandoned when it passes the deadline. (A C loop that holds the GIL, such as
    a catastrophic regular expression, cannot be timed out this way.)"""
    box: dict[str, Any] = {}

    def target():
        try:
            box["result"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            box["error"] = e

    thread = threading.Thread(target=target, name="verl-npu-reward", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return False, None
    if "error" in box:
        raise box["error"]
    return True, box["result"]


def _die(message: str) -> None:
    log = logging.getLogger("verl_npu")
    if log.handlers:  # a run's log: its console handler prints it too
        log.error("%s", message)
        logging.shutdown()
    else:
        print(f"error: {message}", file=sys.stderr, flush=True)
    os._exit(1)


def call_with_timeout(
    fn: Callable, args: tuple, timeout_s: float | None, stuck_message: str = "a reward function ignores its timeout"
) -> tuple[bool, Any]:
    """``fn(*args)`` with a deadline: ``(True, result)`` or ``(False, None)`` after ``timeout_s``
    seconds (None: no deadline). Exceptions of ``fn`` propagate."""
    if timeout_s is None:
        return True, fn(*args)
    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        return _call_with_alarm(fn, args, timeout_s, stuck_message)
    return _call_in_thread(fn, args, timeout_s)


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class RewardScorer:
    """Scores a batch of responses with one reward function, row by row.

    ``score(responses, data_sources, ground_truths, extra_infos, rows=None)`` returns
    ``(scores, extras)``: ``scores[i]`` is response i's reward (a float result, or the ``"score"``
    of a dict result) and ``extras[name][i]`` each numeric sub-score of dict results (NaN for
    responses whose result lacks that name; booleans count as 0/1; non-numeric values are not
    returned). ``rows[i]`` names response i's dataset row (the dataset's ``data_row``, e.g.
    ``"data file train.parquet row 5"``, or an int row index); every error names it.

    A score must be a real number: int, float, bool (True = 1, False = 0, as in verl), or a
    numpy / torch scalar. Each call has ``timeout_s`` seconds (None: no limit).

    Raises (from ``score``):
        UserError: naming the function, the dataset row, its data source and the value, when the
            function raised, called ``sys.exit``, passed ``timeout_s``, returned a dict without
            ``"score"``, or returned a non-numeric (``"1"``, None, a list, ...) or non-finite score.
    """

    def __init__(self, fn: RewardFn | RewardFunction | None = None, timeout_s: Any = "default"):
        fn = fn or default_compute_score
        if isinstance(fn, RewardFunction):
            self.fn, self.name, self.timeout_s = fn.fn, fn.name, fn.timeout_s
        else:
            self.fn, self.name, self.timeout_s = fn, _describe(fn), DEFAULT_TIMEOUT_S
        if timeout_s != "default":
            self.timeout_s = None if timeout_s is None else float(timeout_s)

    def _name_for(self, data_source: Any) -> str:
        if self.fn is default_compute_score:
            builtin = _REGISTRY.get(data_source)
            return f"{_describe(builtin)} (the built-in reward of {data_source!r})" if builtin is not None else _BUILTIN
        return self.name

    def covers(self, data_sources: list[str]) -> bool:
        """Whether every one of `data_sources` has a rule reward here (always, with your own function)."""
        return self.fn is not default_compute_score or all(src in _REGISTRY for src in data_sources)

    def close(self) -> None:
        """Nothing to end: it scores in the caller's process (the prime manager's scorer ends its workers)."""

    def score(
        self,
        responses: list[str],
        data_sources: list[str],
        ground_truths: list,
        extra_infos: list[dict] | None = None,
        rows: list | None = None,
    ) -> tuple[list[float], dict[str, list[float]]]:
        n = len(responses)
        if extra_infos is None:
            extra_infos = [None] * n
        if not (len(data_sources) == len(ground_truths) == len(extra_infos) == n) or (
            rows is not None and len(rows) != n
        ):
            raise ValueError(
                f"RewardScorer.score: lengths differ (responses {n}, data_sources {len(data_sources)}, "
                f"ground_truths {len(ground_truths)}, extra_infos {len(extra_infos)}"
                f"{'' if rows is None else f', rows {len(rows)}'})"
            )
        scores: list[float] = []
        extras: dict[str, list[float]] = {}
        for i, (resp, src, gt, info) in enumerate(zip(responses, data_sources, ground_truths, extra_infos)):
            row = rows[i] if rows is not None else None
            if row is None:
                row_text = "an unknown dataset row"
            elif isinstance(row, (int, numbers.Integral)):
                row_text = f"dataset row {int(row)}"
            else:
                row_text = str(row)
            where = f"reward of {row_text} (data_source {src!r}, response {i} of the batch)"
            name = self._name_for(src)
            timeout_text = (
                (
                    f"the reward function {name} did not return within custom_reward_function.timeout_s"
                    f"={self.timeout_s:g} s (response: {_short(resp, 120)})"
                )
                if self.timeout_s
                else ""
            )
            try:
                finished, result = call_with_timeout(
                    self.fn,
                    (src, resp, gt, info),
                    self.timeout_s,
                    f"{where}: {timeout_text} and ignores the timeout (it catches BaseException); the "
                    "process stops. Fix the function.",
                )
            except UserError as e:
                raise UserError(f"{where}: {e}") from e
            except SystemExit as e:
                raise UserError(
                    f"{where}: the reward function {name} called sys.exit({e.code!r}); a reward "
                    "function must return a score, not end the process"
                ) from None
            except Exception as e:
                raise UserError(f"{where}: the reward function {name} raised {type(e).__name__}: {e}") from e
            if not finished:
                raise UserError(
                    f"{where}: {timeout_text}; fix the hang or slowness, or raise custom_reward_function.timeout_s "
                    "(null disables the limit)"
                )
            subs: dict[str, float] = {}
            if isinstance(result, dict):
                if "score" not in result:
                    raise UserError(
                        f"{where}: the reward function {name} returned a dict without 'score' "
                        f"(keys: {', '.join(map(str, result))}); add a 'score' entry"
                    )
                value = result["score"]
                what = "a dict whose 'score' is "
                subs = numeric_subscores(result)
            else:
                value, what = result, ""
            number = as_score(value)
            if number is None:
                raise UserError(
                    f"{where}: the reward function {name} returned {what}{_short(value)} ({type(value).__name__}), "
                    "not a number; return a float (a bool counts as 0/1) or a dict with a numeric 'score'"
                )
            if not math.isfinite(number):
                raise UserError(f"{where}: the reward function {name} returned a non-finite score ({number})")
            if abs(number) > FLOAT32_MAX:  # finite in Python, infinite once stored as float32 for training
                raise UserError(
                    f"{where}: the reward function {name} returned {number:g}, beyond what float32 "
                    f"holds (|score| <= {FLOAT32_MAX:.4g}); scale your rewards to a few units"
                )
            scores.append(number)
            for k, v in subs.items():
                if k not in extras:
                    extras[k] = [math.nan] * i
                extras[k].append(v)
            for k, column in extras.items():
                if len(column) < i + 1:
                    column.append(math.nan)
        return scores, extras


def _describe(fn: Any) -> str:
    """``module.qualname`` of a function (through functools.partial), else its repr."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else repr(fn)


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "RewardFunction",
    "RewardScorer",
    "RewardTimeout",
    "as_score",
    "call_with_timeout",
    "default_compute_score",
    "load_reward_fn",
    "register_reward",
    "registered_data_sources",
]
