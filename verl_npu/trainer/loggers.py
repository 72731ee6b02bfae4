"""The experiment-tracker sinks of `trainer.logger` (declared with `@METRIC_SINKS.register`, `verl_npu.registry`).

Built-in sinks (`console`, `tensorboard`, `file`) are written by `verl_npu.trainer.tracking.Tracker`
itself. The experiment trackers (`wandb`, `mlflow`, `swanlab`) each go through their own library,
an optional extra (`pip install 'verl-npu[wandb]'`, ...), imported only when its sink opens.

Every tracker sink gets verl's metric names, `trainer.project_name` / `trainer.experiment_name`
as its project / run names, and the run's resolved recipe as the run config. Each launch (a
resume included) is a new run in the tracker; metrics.jsonl is the one continuous record. Where the tracker
writes when no server is configured (the default here, and what the tests use):

- `wandb`: offline mode (`WANDB_MODE=offline` unless `WANDB_MODE` is set or `WANDB_API_KEY` is
  present), files under `<af_output_dir>/wandb/`; `wandb sync <that folder>` uploads them later.
- `mlflow`: `MLFLOW_TRACKING_URI` if set, else a local SQLite store
  `<af_output_dir>/mlflow/mlflow.db` with artifacts in `<af_output_dir>/mlflow/artifacts/`
  (browse with `mlflow ui --backend-store-uri sqlite:///<af_output_dir>/mlflow/mlflow.db`).
  MLflow metric names allow only letters, digits, `_ - . / :` and spaces: `@` is written `_at_`
  (`val-core/x/reward/mean_at_1`), anything else not allowed becomes `_`.
- `swanlab`: `SWANLAB_MODE` if set, else `cloud` when `SWANLAB_API_KEY` is present, else
  `offline`; files under `<af_output_dir>/swanlog/` (`swanlab sync <run folder>` uploads them).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from verl_npu.registry import METRIC_SINKS

log = logging.getLogger("verl_npu")


def open_sink(name: str, out_dir: Path, project: str, experiment: str, config: dict) -> Sink:
    """Start tracker sink `name` (a run in its library); a missing library is a clear error."""
    problem = METRIC_SINKS.spec(name).missing_library()
    if problem:
        from verl_npu.errors import UserError

        raise UserError(f"backend_config.trainer.logger: {name}: {problem}")
    return METRIC_SINKS.load(name)(Path(out_dir), project, experiment, config)


def _tracker_mode(service: str, online: str) -> str:
    """The mode a hosted tracker's run starts in: ``<service>_MODE`` when set, else `online` (the tracker's word
    for uploading) when ``<service>_API_KEY`` is set, else "offline" (files only)."""
    return os.environ.get(f"{service}_MODE") or (online if os.environ.get(f"{service}_API_KEY") else "offline")


class Sink:
    """A tracker run: `log(values, step)` with float values, `close()` once."""

    def log(self, values: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def log_text(self, tag: str, text: str, step: int) -> None:
        """Record a text sample (validation generations, one per line) under `tag` at `step`."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


@METRIC_SINKS.register(
    "wandb",
    module="wandb",
    extra="wandb",
    doc="Weights & Biases (offline files under <af_output_dir>/wandb unless WANDB_MODE / WANDB_API_KEY)",
)
class WandbSink(Sink):
    """A wandb run named `experiment` in project `project`, config = the resolved recipe."""

    def __init__(self, out_dir: Path, project: str, experiment: str, config: dict):
        import wandb

        mode = _tracker_mode("WANDB", online="online")
        out_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            name=experiment,
            config=config,
            dir=str(out_dir),
            mode=mode,
            reinit="create_new",
            settings=wandb.Settings(silent=True),
        )
        if mode == "offline":
            log.info(
                "wandb: offline run in %s (upload later with: wandb sync %s)", self.run.dir, Path(self.run.dir).parent
            )

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def log_text(self, tag: str, text: str, step: int) -> None:
        import wandb

        table = wandb.Table(columns=["step", "sample"], data=[[step, line] for line in text.splitlines()])
        self.run.log({tag: table}, step=step)

    def close(self) -> None:
        self.run.finish()


_MLFLOW_BAD = re.compile(r"[^\w\-./: ]")


def mlflow_name(key: str) -> str:
    """A metric name MLflow accepts: `@` -> `_at_`, other characters it refuses -> `_`."""
    return _MLFLOW_BAD.sub("_", key.replace("@", "_at_"))


def _flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(tree, dict):
        out: dict[str, str] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: str(tree)}


@METRIC_SINKS.register(
    "mlflow",
    module="mlflow",
    extra="mlflow",
    doc="MLflow (MLFLOW_TRACKING_URI, else a local store in <af_output_dir>/mlflow)",
)
class MlflowSink(Sink):
    """An MLflow run named `experiment` in experiment `project`; the resolved recipe is logged as
    flattened params (`backend_config.data.train_batch_size` = ...) and as `config.yaml`."""

    def __init__(self, out_dir: Path, project: str, experiment: str, config: dict):
        import mlflow
        from mlflow.entities import Param

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        artifact_location = None
        if not uri:
            store = out_dir / "mlflow"
            store.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{(store / 'mlflow.db').resolve()}"
            artifact_location = (store / "artifacts").resolve().as_uri()
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(project)
        exp_id = (
            found.experiment_id
            if found
            else self.client.create_experiment(project, artifact_location=artifact_location)
        )
        self.run_id = self.client.create_run(exp_id, run_name=experiment).info.run_id
        params = [Param(k[:250], v[:6000]) for k, v in _flatten(config).items()]
        for start in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[start : start + 100])
        self.client.log_dict(self.run_id, config, "config.yaml")
        log.info("mlflow: run %s in experiment %r at %s", self.run_id, project, uri)

    def log(self, values: dict[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_name(k), float(v), now, int(step)) for k, v in values.items()]
        for start in range(0, len(metrics), 500):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 500])

    def log_text(self, tag: str, text: str, step: int) -> None:
        self.client.log_text(self.run_id, text, f"{tag}/step_{int(step):08d}.txt")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


@METRIC_SINKS.register(
    "swanlab",
    module="swanlab",
    extra="swanlab",
    doc="SwanLab (offline files under <af_output_dir>/swanlog unless SWANLAB_MODE / SWANLAB_API_KEY)",
)
class SwanlabSink(Sink):
    """A SwanLab experiment named `experiment` in project `project`, config = the resolved recipe."""

    def __init__(self, out_dir: Path, project: str, experiment: str, config: dict):
        import swanlab

        mode = _tracker_mode("SWANLAB", online="cloud")
        logdir = out_dir / "swanlog"
        logdir.mkdir(parents=True, exist_ok=True)
        self.run = swanlab.init(
            project=project, experiment_name=experiment, config=config, logdir=str(logdir), mode=mode
        )
        self._swanlab = swanlab

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def log_text(self, tag: str, text: str, step: int) -> None:
        self.run.log({tag: self._swanlab.Text(text)}, step=step)

    def close(self) -> None:
        self._swanlab.finish()
