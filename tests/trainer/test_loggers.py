"""wandb / mlflow / swanlab through their real libraries in offline / local-store mode: what the
Tracker logs is read back from the files each library wrote. A missing library is refused at
validation, naming the extra to install."""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path

import pytest

from verl_npu.config import load_recipe
from verl_npu.errors import ConfigErrors
from verl_npu.trainer.tracking import Tracker

CONFIG = {
    "af_output_dir": "/tmp/x",
    "backend_config": {"data": {"train_batch_size": 8}, "trainer": {"project_name": "proj"}},
}
METRICS = {
    1: {"critic/score/mean": 0.25, "actor/pg_loss": -0.5, "val-core/synthetic/reward/mean@1": 0.5},
    2: {"critic/score/mean": 0.75, "actor/pg_loss": -0.25},
}
GENERATIONS = "[ground truth: 4] '\\\\boxed{4}'\n[ground truth: 3] 'five'"


def _log_two_steps(out: Path, name: str) -> None:
    with Tracker(out, ["file", name], "proj", "exp-1", run_config=CONFIG) as tracker:
        for step, values in METRICS.items():
            if step == 1:
                tracker.log_text("val/generations", GENERATIONS, step)
            tracker.log(values, step)


# ---- wandb -----------------------------------------------------------------------------------
def _leveldb_records(path: Path, header_len: int = 7, block: int = 32768) -> list[bytes]:
    """Records of a wandb run file (LevelDB log format after a 7-byte header)."""
    data = path.read_bytes()
    pos, records, pending = header_len, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer: skip to the next block
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            break
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending += chunk
        if kind in (1, 4):  # FULL or LAST
            records.append(pending)
            pending = b""
    return records


def _record(raw: bytes):
    from wandb.proto import wandb_internal_pb2 as pb

    record = pb.Record()
    record.ParseFromString(raw)
    return record


def _wandb_records(out_dir: Path):
    """(run record, {step: history row}) of the one offline wandb run under out_dir."""
    import json

    files = list((out_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, list(out_dir.rglob("*"))
    # wandb's service process writes the file behind finish(); on a loaded machine it can lag
    # behind, so wait (bounded) until the run's closing `exit` record is on disk.
    deadline = time.monotonic() + 120
    while True:
        raws = _leveldb_records(files[0])
        kinds = [_record(raw).WhichOneof("record_type") for raw in raws]
        if "exit" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    history, run = {}, None
    for raw in raws:
        record = _record(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.setdefault(row["_step"], {}).update(row)
        elif kind == "run":
            run = record.run
    assert run is not None, kinds
    return run, history


def test_wandb_offline_run_holds_metrics_names_and_config(tmp_path):
    pytest.importorskip("wandb")
    import json

    _log_two_steps(tmp_path, "wandb")
    run, history = _wandb_records(tmp_path)
    assert run.project == "proj" and run.display_name == "exp-1"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["backend_config"]["data"]["train_batch_size"] == 8
    for step, values in METRICS.items():
        for key, value in values.items():
            assert history[step][key] == pytest.approx(value)
    # a table is logged as nested keys (val/generations, _type) ... and a json file beside the run
    assert history[1]["val/generations/_type"] == "table-file"
    (table_file,) = (tmp_path / "wandb").glob(f"offline-run-*/files/{history[1]['val/generations/path']}")
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["step", "sample"]
    assert table["data"] == [[1, line] for line in GENERATIONS.splitlines()]


# ---- mlflow ----------------------------------------------------------------------------------
def test_mlflow_local_store_holds_metrics_params_and_config(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _log_two_steps(tmp_path, "mlflow")
    db = tmp_path / "mlflow" / "mlflow.db"
    assert db.is_file()
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("proj")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "exp-1" and run.info.status == "FINISHED"
    assert run.data.params["backend_config.data.train_batch_size"] == "8"
    history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "critic/score/mean")]
    assert sorted(history) == [(1, 0.25), (2, 0.75)]
    # '@' is not allowed in MLflow metric names
    (val,) = client.get_metric_history(run.info.run_id, "val-core/synthetic/reward/mean_at_1")
    assert (val.step, val.value) == (1, 0.5)
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert artifacts.is_relative_to(tmp_path) and (artifacts / "config.yaml").is_file()
    assert (artifacts / "val" / "generations" / "step_00000001.txt").read_text() == GENERATIONS


# ---- swanlab ---------------------------------------------------------------------------------
def test_swanlab_offline_run_holds_metrics_names_and_config(tmp_path, monkeypatch):
    pytest.importorskip("swanlab")
    import yaml
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    monkeypatch.delenv("SWANLAB_MODE", raising=False)
    monkeypatch.delenv("SWANLAB_API_KEY", raising=False)
    _log_two_steps(tmp_path, "swanlab")
    (run_dir,) = (tmp_path / "swanlog").glob("run-*")
    (run_file,) = run_dir.glob("run-*.swanlab")
    reader = DataStoreReader()
    reader.open(run_file)
    scalars, start = {}, None
    for raw in reader:
        record = Record()
        record.ParseFromString(raw)
        if record.HasField("start"):
            start = record.start
        if record.HasField("scalar"):
            scalars[(record.scalar.key, record.scalar.step)] = record.scalar.value.number
    reader.close()
    assert start is not None and start.project == "proj" and start.name == "exp-1"
    for step, values in METRICS.items():
        for key, value in values.items():
            assert scalars[(key, step)] == pytest.approx(value)
    # the text sample is a media file of the run
    media = [f for f in (run_dir / "media").rglob("*.txt")]
    assert [f.read_text() for f in media] == [GENERATIONS], sorted(p.name for p in run_dir.rglob("*"))
    config = yaml.safe_load((run_dir / "files" / "config.yaml").read_text())
    assert config["backend_config"]["value"]["data"]["train_batch_size"] == 8


# ---- a missing library -----------------------------------------------------------------------
FILLED = [
    "af_output_dir=/tmp/verl_npu_out",
    "data.train_files=/data/t.parquet",
    "data.val_files=/data/v.parquet",
    "actor_rollout_ref.model.path=/models/m",
]


@pytest.mark.parametrize("name", ["wandb", "mlflow", "swanlab"])
def test_a_missing_logger_library_is_refused_at_validation_naming_the_extra(name, monkeypatch):
    monkeypatch.setitem(sys.modules, name, None)  # as if the library were not installed
    with pytest.raises(ConfigErrors) as info:
        load_recipe("qwen25vl_geo3k", FILLED + [f"trainer.logger=[console,{name}]"])
    (problem,) = [p for p in info.value.problems if p.key == "backend_config.trainer.logger"]
    assert name in problem.message and f"pip install 'verl-npu[{name}]'" in problem.fix


def test_an_installed_logger_library_validates():
    pytest.importorskip("wandb")
    rc = load_recipe("qwen25vl_geo3k", FILLED + ["trainer.logger=[console,wandb]"])
    assert list(rc.backend.trainer.logger) == ["console", "wandb"]
