"""Rule rewards keyed by ``data_source``, custom reward loading, and batch scoring.

A reward function has verl's signature::

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

A dict result has a ``"score"`` (the reward) and any named sub-scores (e.g. ``accuracy``,
``format``); ``RewardScorer`` returns every numeric sub-score so the trainer can log it.

Shipped rewards (``register_reward`` adds more):

==================== =========================================== ===============================
data_source          score                                       module
==================== =========================================== ===============================
hiyouga/geometry3k   0.9 * accuracy + 0.1 * format               ``verl_npu.rewards.geo3k``
openai/gsm8k         strict ``#### n`` match (flexible logged)   ``verl_npu.rewards.gsm8k``
synthetic_geometry   0.9 * accuracy + 0.1 * format               ``verl_npu.rewards.synthetic_geometry``
==================== =========================================== ===============================
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import math
import sys
from pathlib import Path
from typing import Any, Callable

from verl_npu.errors import UserError
from verl_npu.rewards import geo3k, gsm8k, synthetic_geometry

RewardFn = Callable[..., "float | dict"]

_REGISTRY: dict[str, RewardFn] = {}


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


def default_compute_score(data_source: str, solution_str: str, ground_truth: str,
                          extra_info: dict | None = None) -> float | dict:
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


def _cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    if cfg is None:
        return default
    value = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    return default if value is None else value


def load_reward_fn(custom_reward_function_cfg: Any = None) -> RewardFn:
    """The user's reward (``custom_reward_function.path`` / ``.name``), else ``default_compute_score``.

    ``name`` defaults to ``compute_score``; ``reward_kwargs`` (a mapping), when set, is bound as
    extra keyword arguments of the user's function.

    Raises:
        UserError: the file is missing, fails to import, or has no callable of that name (the
            message names the file and the function).
    """
    path = _cfg_get(custom_reward_function_cfg, "path")
    if not path:
        return default_compute_score
    name = _cfg_get(custom_reward_function_cfg, "name", "compute_score") or "compute_score"
    file = Path(str(path)).expanduser()
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
    kwargs = _cfg_get(custom_reward_function_cfg, "reward_kwargs") or {}
    if kwargs:
        fn = functools.partial(fn, **dict(kwargs))
    return fn


class RewardScorer:
    """Scores a batch of responses with one reward function, row by row.

    ``score(responses, data_sources, ground_truths, extra_infos)`` returns ``(scores, extras)``:
    ``scores[i]`` is row i's reward (a float result, or the ``"score"`` of a dict result) and
    ``extras[name][i]`` each numeric sub-score of dict results (NaN for rows whose result lacks
    that name; booleans count as 0/1; non-numeric values are not returned).

    Raises (from ``score``):
        UserError: the function raised (naming the row, its data source and the exception),
            returned a dict without ``"score"``, or returned a non-numeric or non-finite score.
    """

    def __init__(self, fn: RewardFn | None = None):
        self.fn = fn or default_compute_score

    def score(self, responses: list[str], data_sources: list[str], ground_truths: list[str],
              extra_infos: list[dict] | None = None) -> tuple[list[float], dict[str, list[float]]]:
        n = len(responses)
        if extra_infos is None:
            extra_infos = [None] * n
        if not (len(data_sources) == len(ground_truths) == len(extra_infos) == n):
            raise ValueError(
                f"RewardScorer.score: lengths differ (responses {n}, data_sources {len(data_sources)}, "
                f"ground_truths {len(ground_truths)}, extra_infos {len(extra_infos)})"
            )
        scores: list[float] = []
        extras: dict[str, list[float]] = {}
        for i, (resp, src, gt, info) in enumerate(zip(responses, data_sources, ground_truths, extra_infos)):
            where = f"reward of row {i} (data_source {src!r})"
            try:
                result = self.fn(src, resp, gt, info)
            except UserError as e:
                raise UserError(f"{where}: {e}") from e
            except Exception as e:
                raise UserError(f"{where}: the reward function raised {type(e).__name__}: {e}") from e
            subs: dict[str, float] = {}
            if isinstance(result, dict):
                if "score" not in result:
                    raise UserError(f"{where}: the reward function returned a dict without 'score' "
                                    f"(keys: {', '.join(map(str, result))}); add a 'score' entry")
                value = result["score"]
                for k, v in result.items():
                    if k != "score" and isinstance(v, (int, float)):  # bool is an int
                        subs[str(k)] = float(v)
            else:
                value = result
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise UserError(f"{where}: the reward function returned {value!r}, not a number") from None
            if not math.isfinite(value):
                raise UserError(f"{where}: the reward function returned a non-finite score ({value})")
            scores.append(value)
            for k, v in subs.items():
                if k not in extras:
                    extras[k] = [math.nan] * i
                extras[k].append(v)
            for k, column in extras.items():
                if len(column) < i + 1:
                    column.append(math.nan)
        return scores, extras


__all__ = ["RewardScorer", "default_compute_score", "load_reward_fn", "register_reward", "registered_data_sources"]
