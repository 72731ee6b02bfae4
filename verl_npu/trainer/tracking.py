"""Run tracking: metrics.jsonl, TensorBoard, console lines, training-curves PNG, progress bar.

Everything here writes under `af_output_dir` (see docs/architecture.md):
`metrics.jsonl`, `tensorboard/`, `training_curves.png`, `logs/run.log`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from verl_npu.registry import METRIC_SINKS
from verl_npu.trainer.loggers import open_sink

logger = logging.getLogger(__name__)

SUPPORTED_LOGGERS = METRIC_SINKS.names()
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "training_curves.png"


def keep_aside(path: Path, why: str) -> Path | None:
    """Move an existing file that a run is about to replace to `<stem>.previous-<time><suffix>` beside
    it (a user's file is never overwritten silently) and say so; None when there is no such file."""
    if not path.exists():
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.stem}.previous-{stamp}{path.suffix}")
    n = 1
    while aside.exists():  # two fresh starts within a second: keep both earlier files
        aside, n = path.with_name(f"{path.stem}.previous-{stamp}-{n}{path.suffix}"), n + 1
    os.replace(path, aside)
    logger.warning("%s: moved the existing %s to %s", why, path, aside)
    return aside


TENSORBOARD_DIR = "tensorboard"

# (metric key, short label) shown on the console line, in this order, when present.
_CONSOLE_KEYS = (
    ("critic/score/mean", "score"),
    ("response_length/mean", "resp_len"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/kl_loss", "kl_loss"),
    ("actor/ppo_kl", "ppo_kl"),
    ("actor/entropy", "entropy"),
    ("actor/grad_norm", "grad_norm"),
    ("actor/lr", "lr"),
    ("timing_s/step", "step_s"),
    # an SFT run's (verl_npu/sft)
    ("train/loss", "loss"),
    ("val/loss", "val_loss"),
    ("train/grad_norm", "grad_norm"),
    ("train/lr", "lr"),
)


# ---- JSON helpers ----------------------------------------------------------------------------
def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _jsonable(value: Any) -> Any:
    """A JSON-safe copy: numpy/torch scalars -> Python numbers, arrays -> lists, NaN/inf -> None,
    Paths and other objects -> str."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return _finite_or_none(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays/scalars, torch tensors
        return _jsonable(value.tolist())
    return str(value)


def _to_float(key: str, value: Any) -> float:
    try:
        if hasattr(value, "item"):
            value = value.item()
        return float(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metric {key!r}: {value!r} is not a number (metrics must be floats)") from exc


def _read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file; lines that do not parse (a line cut by a kill) are skipped with a warning."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                logger.warning("%s:%d: not valid JSON (cut by a crash?); skipped", path, lineno)
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _write_lines_atomic(path: Path, lines: Iterable[str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def dump_jsonl(path: str | Path, rows: list[dict]) -> None:
    """Append `rows` to `path` as JSON lines (parents created; NaN/inf -> null; numpy/torch values
    converted to plain numbers/lists). Used for rollout_data_dir / validation_data_dir dumps."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(_jsonable(row), ensure_ascii=False, allow_nan=False) + "\n")


# ---- Tracker ---------------------------------------------------------------------------------
@METRIC_SINKS.register("console", doc="one line per step on the run log")
@METRIC_SINKS.register("tensorboard", doc="TensorBoard events in <af_output_dir>/tensorboard")
@METRIC_SINKS.register("file", doc="metrics.jsonl (always written)")
class Tracker:
    """Writes each `log(metrics, step)` call to every enabled sink.

    - `out_dir/metrics.jsonl` (always): one line `{"step": step, **metrics}` per call, floats,
      NaN/inf as null. Call `log` once per step with all of that step's metrics (training and
      validation merged) to keep one row per step.
      Resuming (`resume_step > 0`): rows with `step > resume_step` (written by the crashed run
      after its last checkpoint) are removed first. Fresh start (`resume_step == 0`): an existing
      non-empty metrics.jsonl is moved aside to `metrics.previous-<time>.jsonl`, and an existing
      training_curves.png to `training_curves.previous-<time>.png`.
    - `tensorboard`: `SummaryWriter(tensorboard_dir)` (default `out_dir/tensorboard`), `add_scalar(key, value, step)` per key.
      On resume, TensorBoard is told to drop the crashed run's events with step > resume_step
      (`purge_step`); on a fresh start, all earlier events in that folder.
    - `console`: one compact INFO line per step on the "verl_npu" logger.
    - `file`: accepted; it is metrics.jsonl.
    - `wandb`, `mlflow`, `swanlab`: a run in that tracker (verl_npu.trainer.loggers), project
      `project`, run name `experiment`, run config `run_config` (the resolved recipe).
    """

    def __init__(
        self,
        out_dir: str | Path,
        loggers: list[str],
        project: str,
        experiment: str,
        resume_step: int = 0,
        tensorboard_dir: str | Path | None = None,
        run_config: dict | None = None,
    ):
        unknown = [name for name in loggers if name not in SUPPORTED_LOGGERS]
        if unknown:
            raise ValueError(f"unknown logger(s) {unknown}; supported: {list(SUPPORTED_LOGGERS)}")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.loggers = list(loggers)
        self.project = project
        self.experiment = experiment
        self.resume_step = int(resume_step)
        # trainer.tensorboard_dir (derived as <af_output_dir>/tensorboard when unset)
        self.tensorboard_dir = Path(tensorboard_dir) if tensorboard_dir else self.out_dir / TENSORBOARD_DIR
        self.metrics_path = self.out_dir / METRICS_FILE
        self._prepare_metrics_file()
        self._metrics_fh = open(self.metrics_path, "a", encoding="utf-8")
        self._console = "console" in self.loggers
        #: the run's last step, set by the trainer: console lines then read `step k/N ... s/step, left`
        self.total_steps: int | None = None
        self._last_row_at: float | None = None  # time of the last training row (seconds per step)
        self._step_s: float | None = None  # a moving mean of the wall seconds between training rows
        self._writer = None
        self.writes_tensorboard = "tensorboard" in self.loggers
        if self.writes_tensorboard:
            self._writer = self._open_tensorboard()
        self._sinks = []
        self._closed = False
        try:
            for name in (n for n in self.loggers if METRIC_SINKS.spec(n).tracker):
                self._sinks.append(open_sink(name, self.out_dir, project, experiment, run_config or {}))
        except BaseException:
            self.close()
            raise

    def _prepare_metrics_file(self) -> None:
        path = self.metrics_path
        if self.resume_step == 0:  # a fresh start redraws the curves from its own rows only
            keep_aside(self.out_dir / CURVES_FILE, "fresh start")
        if not path.exists() or path.stat().st_size == 0:
            return
        if self.resume_step > 0:
            rows = _read_jsonl(path)
            kept = [r for r in rows if isinstance(r.get("step"), (int, float)) and r["step"] <= self.resume_step]
            dropped = len(rows) - len(kept)
            if dropped:
                logger.info("%s: dropped %d row(s) after step %d (resuming there)", path, dropped, self.resume_step)
            _write_lines_atomic(path, (json.dumps(_jsonable(r), allow_nan=False) for r in kept))
        else:
            keep_aside(path, "fresh start")

    def _open_tensorboard(self):
        from torch.utils.tensorboard import SummaryWriter

        tb_dir = self.tensorboard_dir
        had_events = tb_dir.is_dir() and any(tb_dir.glob("events.out.tfevents.*"))
        purge_step = None
        if self.resume_step > 0:
            purge_step = self.resume_step + 1
        elif had_events:
            purge_step = 0
        return SummaryWriter(log_dir=str(tb_dir), purge_step=purge_step)

    # ---- logging -------------------------------------------------------------------------
    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record `metrics` for `step` in every enabled sink (values must be numbers)."""
        if self._closed:
            raise RuntimeError("Tracker.log called after close()")
        step = int(step)
        values = {str(k): _to_float(str(k), v) for k, v in metrics.items()}
        row = {"step": step, **{k: _finite_or_none(v) for k, v in values.items()}}
        self._metrics_fh.write(json.dumps(row, allow_nan=False) + "\n")
        self._metrics_fh.flush()
        if self._writer is not None:
            for key, value in values.items():
                self._writer.add_scalar(key, value, global_step=step)
            self._writer.flush()
        for sink in self._sinks:
            sink.log({k: v for k, v in values.items() if math.isfinite(v)}, step)
        if self._console:
            logging.getLogger("verl_npu").info(format_console_line(values, step, self._progress(values, step)))

    def _progress(self, values: dict[str, float], step: int) -> str:
        """`step k/N`, and for training rows `1.8 s/step, 6m05s left` (wall time between training rows,
        validation and saving included, as a moving mean); `step k` when no total was set."""
        if self.total_steps is None:
            return f"step {step}"
        text = f"step {step}/{self.total_steps}"
        if "training/global_step" not in values:
            return text
        now = time.monotonic()
        elapsed = now - self._last_row_at if self._last_row_at is not None else values.get("timing_s/step")
        self._last_row_at = now
        if elapsed is None or not math.isfinite(elapsed):
            return text
        self._step_s = elapsed if self._step_s is None else 0.8 * self._step_s + 0.2 * elapsed
        left = max(self.total_steps - step, 0) * self._step_s
        return f"{text} | {self._step_s:.3g} s/step, {_duration(left)} left"

    def log_text(self, tag: str, text: str, step: int) -> None:
        """Record a text sample (e.g. validation generations): TensorBoard `add_text`, every experiment
        tracker (a wandb table, an MLflow text artifact, a SwanLab text) and the log."""
        if self._writer is not None:
            self._writer.add_text(tag, text, global_step=int(step))
            self._writer.flush()
        for sink in self._sinks:
            sink.log_text(tag, text, int(step))
        logging.getLogger("verl_npu").info("[%s] step %d:\n%s", tag, int(step), text)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._metrics_fh.close()
        if self._writer is not None:
            self._writer.close()
        for sink in self._sinks:
            try:
                sink.close()
            except Exception as exc:  # noqa: BLE001 - one tracker failing to finish must not hide the others
                logger.warning("closing the %s logger failed: %s", type(sink).__name__, exc)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _duration(seconds: float) -> str:
    """`45s`, `6m05s`, `2h03m`."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_console_line(metrics: dict[str, float], step: int, progress: str | None = None) -> str:
    """`step N | score 0.420 | resp_len 35.1 | ... | val <source> 0.500`: the key metrics present;
    `progress` replaces the leading `step N` (`step 97/300 | 1.8 s/step, 6m05s left`)."""
    parts = [progress or f"step {step}"]
    for key, label in _CONSOLE_KEYS:
        if key in metrics:
            parts.append(f"{label} {metrics[key]:.4g}")
    for key, value in metrics.items():
        if key.startswith("val-core/") and key.endswith("/reward/mean@1"):
            source = key[len("val-core/") : -len("/reward/mean@1")]
            parts.append(f"val {source} {value:.4g}")
    return " | ".join(parts)


# ---- training curves -------------------------------------------------------------------------
def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            x = row.get("training/global_step", row.get("step"))
            if isinstance(x, (int, float)):
                xs.append(float(x))
                ys.append(float(value))
    return xs, ys


#: the KL series a run may log, in the order the KL panel prefers them
KL_SERIES = ("actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl")


def kl_panel(rows: list[dict]) -> tuple[str, list[tuple[str, str]]]:
    """(title, [(key, label)]) of the curves' third panel: the first KL series of `KL_SERIES` that is
    not zero throughout; a run without any (no KL loss or penalty, and on-policy updates whose
    ppo_kl is exactly 0, as in the demos) gets its policy entropy instead, and the title says why."""
    for key in KL_SERIES:
        if any(y != 0 for y in _series(rows, key)[1]):
            return "KL", [(key, key)]
    return "entropy (no KL in this run)", [("actor/entropy", "actor/entropy")]


def curve_panels(rows: list[dict], builtin_rewards: bool = True) -> tuple[list, list[tuple[float, str]]]:
    """The curves' panels, [(title, [(metric key, legend label)])], and the reward panel's dashed lines,
    [(value, label)]: the blind ceiling of each validated built-in demo task (with `builtin_rewards`)."""
    from verl_npu.rewards import blind_ceiling

    val_keys = sorted({k for r in rows for k in r if k.startswith("val-core/") and k.endswith("/reward/mean@1")})
    sources = [k[len("val-core/") : -len("/reward/mean@1")] for k in val_keys]
    panels = [
        (
            "reward",
            [("critic/score/mean", "training reward (mean of the step's responses)")]
            + [(k, f"validation reward ({src})") for k, src in zip(val_keys, sources)],
        ),
        ("response length (tokens)", [("response_length/mean", "mean response length (tokens)")]),
        kl_panel(rows),
        ("policy loss", [("actor/pg_loss", "actor/pg_loss")]),
    ]
    ceilings = [
        (c[0], f"blind ceiling {c[0]:.2f}: a policy ignoring the {c[1]}")
        for c in (blind_ceiling(src) for src in sources if builtin_rewards)
        if c is not None
    ]
    return panels, ceilings


#: steps between refreshes of training_curves.png (RL and SFT; drawing it costs more than a tiny model's step)
CURVES_EVERY = 10
#: the most of a run's time redrawing training_curves.png may take (a redraw is ~0.3 s on a CPU core)
CURVES_SHARE = 0.05


class CurveRedraws:
    """When to redraw training_curves.png: at most every CURVES_EVERY steps and no more often than keeps the
    drawing under CURVES_SHARE of the run's time (a tiny model's step is shorter than a redraw: on the CPU demos,
    every 10 steps was ~10 % of the run, taken from the training core), and always at the last step."""

    def __init__(self) -> None:
        self.ready_at = 0.0  # perf_counter time from which the next redraw may start

    def due(self, step: int, is_last: bool) -> bool:
        return is_last or (step % CURVES_EVERY == 0 and time.perf_counter() >= self.ready_at)

    def draw(self, *args, **kwargs) -> None:
        """plot_training_curves(*args, **kwargs), timed: the next redraw waits cost / CURVES_SHARE."""
        started = time.perf_counter()
        plot_training_curves(*args, **kwargs)
        ended = time.perf_counter()
        self.ready_at = ended + (ended - started) / CURVES_SHARE


def plot_training_curves(
    metrics_jsonl: str | Path, out_png: str | Path, builtin_rewards: bool = True, panels=None
) -> None:
    """Draw a 2x2 PNG from metrics.jsonl over `training/global_step` (or `step`):
    reward (`critic/score/mean` and every `val-core/*/reward/mean@1`, labelled in words, and with
    `builtin_rewards` the image- or question-blind ceiling of a built-in demo task as a dashed line, the
    one the end-of-run summary quotes), `response_length/mean` in tokens, KL or entropy (`kl_panel`),
    `actor/pg_loss`; or `panels`, four (title, [(key, label)]) of another kind of run (an SFT run's loss, grad
    norm, LR, tokens), without a ceiling. Panels without data say so. Written to a temp file then
    `os.replace`d onto `out_png`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics_jsonl, out_png = Path(metrics_jsonl), Path(out_png)
    rows = _read_jsonl(metrics_jsonl) if metrics_jsonl.exists() else []
    panels, ceilings = (panels, []) if panels else curve_panels(rows, builtin_rewards)
    # Figure + Agg canvas directly: no pyplot global state, safe off the main thread.
    fig = Figure(figsize=(11, 7), dpi=90)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2)
    for ax, (title, series) in zip(axes.flat, panels):
        drawn = 0
        for key, label in series:
            xs, ys = _series(rows, key)
            if xs:
                marker = "o" if key.startswith("val-core/") or len(xs) < 20 else None
                ax.plot(xs, ys, label=label, marker=marker, markersize=3)
                drawn += 1
        if title == "reward" and drawn:
            for value, label in ceilings:
                ax.axhline(value, linestyle="--", color="grey", label=label)
        ax.set_title(title)
        ax.set_xlabel("training step")
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(f"{metrics_jsonl.parent.name}: {len(rows)} logged step(s)")
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_png.with_name(f".{out_png.name}.tmp-{os.getpid()}")
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, out_png)
    finally:
        if tmp.exists():
            tmp.unlink()


# ---- progress bar ----------------------------------------------------------------------------
class ProgressBar:
    """tqdm bar over training steps: starts at `initial` on resume, shows ETA and the latest
    reward. `disable=None` turns it off when the output is not a terminal; `file` defaults to
    stderr."""

    def __init__(self, total: int, initial: int = 0, disable: bool | None = None, file: Any = None):
        from tqdm import tqdm

        self._bar = tqdm(
            total=total, initial=initial, unit="step", desc="training", dynamic_ncols=True, disable=disable, file=file
        )
        self.step = initial
        self.reward: float | None = None

    def update(self, step: int, reward: float | None) -> None:
        """Move the bar to `step` (absolute) and show `reward` when given."""
        if step > self.step:
            self._bar.update(step - self.step)
            self.step = step
        if reward is not None and math.isfinite(reward):
            self.reward = reward
            self._bar.set_postfix(reward=f"{reward:.3f}", refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


# ---- run log ---------------------------------------------------------------------------------
class _TqdmConsoleHandler(logging.StreamHandler):
    """Console handler that prints through tqdm.write so log lines do not break the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # never let logging crash the run
            self.handleError(record)


def setup_run_logging(out_dir: str | Path) -> logging.Logger:
    """Configure the "verl_npu" logger (level INFO): appends to `out_dir/logs/run.log` and prints
    to stderr. Calling it again replaces the handlers it added before (no duplicate lines)."""
    out_dir = Path(out_dir)
    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    run_logger = logging.getLogger("verl_npu")
    for handler in list(run_logger.handlers):
        if getattr(handler, "_verl_npu_run_handler", False):
            run_logger.removeHandler(handler)
            handler.close()
    file_handler = logging.FileHandler(log_dir / "run.log", encoding="utf-8")
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"))
    console_handler = _TqdmConsoleHandler(sys.stderr)
    console_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    for handler in (file_handler, console_handler):
        handler._verl_npu_run_handler = True  # type: ignore[attr-defined]
        run_logger.addHandler(handler)
    run_logger.setLevel(logging.INFO)
    # Our handlers print everything; propagating would print each line twice when the root
    # logger also has a handler (Ray, notebooks, basicConfig).
    run_logger.propagate = False
    return run_logger
