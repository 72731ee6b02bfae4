"""Metric sinks by name (`trainer.logger`): the one registry of names.

Built-in sinks (`console`, `tensorboard`, `file`) are written by `verl_npu.trainer.tracking.Tracker`
itself; the experiment trackers (`wandb`, `mlflow`, `swanlab`) each go through their own library, an
optional extra (`pip install 'verl-npu[wandb]'`, ...), in `verl_npu.trainer.loggers`. Asking which
sinks exist, and whether a sink's library is installed, imports no tracker library and no torch:
this module imports only the standard library (the config validation asks before anything starts).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class LoggerSpec:
    name: str
    doc: str
    module: str = ""   # the library a tracker sink imports ("" for built-in sinks)
    extra: str = ""    # the pyproject extra that installs it
    sink: str = ""     # "module:Class" of the tracker sink ("" for built-in sinks)


LOGGERS: dict[str, LoggerSpec] = {}

#: loggers upstream verl has and verl-npu does not: refused by name.
UNSUPPORTED_LOGGERS = ("clearml", "trackio", "vemlp_wandb", "rl_insight")
#: verl's deprecated logger names and what they mean now: refused, naming the new one.
RENAMED_LOGGERS = (("tracking", "wandb"),)


def register_logger(spec: LoggerSpec) -> None:
    if spec.name in LOGGERS:
        raise ValueError(f"logger {spec.name!r} is registered twice")
    LOGGERS[spec.name] = spec


register_logger(LoggerSpec("console", "one line per step on the run log"))
register_logger(LoggerSpec("tensorboard", "TensorBoard events in <af_output_dir>/tensorboard"))
register_logger(LoggerSpec("file", "metrics.jsonl (always written)"))
register_logger(LoggerSpec("wandb", "Weights & Biases (offline files under <af_output_dir>/wandb unless "
                           "WANDB_MODE / WANDB_API_KEY)", "wandb", "wandb", "verl_npu.trainer.loggers:WandbSink"))
register_logger(LoggerSpec("mlflow", "MLflow (MLFLOW_TRACKING_URI, else a local store in "
                           "<af_output_dir>/mlflow)", "mlflow", "mlflow", "verl_npu.trainer.loggers:MlflowSink"))
register_logger(LoggerSpec("swanlab", "SwanLab (offline files under <af_output_dir>/swanlog unless "
                           "SWANLAB_MODE / SWANLAB_API_KEY)", "swanlab", "swanlab", "verl_npu.trainer.loggers:SwanlabSink"))


def library_available(module: str) -> bool:
    """True when `module` can be imported (a module set to None in sys.modules counts as missing,
    as Python's import does)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_library(name: str) -> str | None:
    """For a tracker logger whose library is not installed: what to do; else None."""
    spec = LOGGERS.get(name)
    if spec is None or not spec.module or library_available(spec.module):
        return None
    return (f"the {spec.module} library is not installed: pip install 'verl-npu[{spec.extra}]' "
            f"(or remove {name} from trainer.logger)")


def tracker_names(loggers: list[str]) -> list[str]:
    """The loggers in `loggers` that are tracker sinks (have their own library)."""
    return [name for name in loggers if name in LOGGERS and LOGGERS[name].sink]
