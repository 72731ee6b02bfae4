"""Nothing lost, nothing run that should not be (issue 13, part A): verified checkpoints, loading
that never unpickles code, one run per output folder, a full disk, preemption by SIGTERM.

Real checkpoints of a tiny model, real processes, real signals; a real small file system (tmpfs)
where this user may mount one, else those tests skip and the simulated ENOSPC tests stand."""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from run_helpers import run_overrides

from verl_npu.config import load_recipe
from verl_npu.data.geometry3k import prepare_synthetic
from verl_npu.errors import UserError
from verl_npu.trainer import preempt
from verl_npu.trainer.checkpoint import (
    MANIFEST_FILE,
    TRAINER_STATE_FILE,
    CheckpointManager,
    DiskFull,
    UnsafeCheckpointFile,
    load_torch,
    load_trainer_state,
    rng_state_from_json,
    rng_state_to_json,
    save_rng_state,
    verify_checkpoint,
    write_manifest,
)
from verl_npu.trainer.entry import run_training
from verl_npu.trainer.runlock import LOCK_FILE, OutputFolderBusy, RunLock

REPO = Path(__file__).resolve().parents[2]
COMPARED = [
    "critic/score/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/grad_norm",
    "response_length/mean",
    "actor/lr",
    "actor/entropy",
]
MODEL = "actor/model_world_size_1_rank_0.pt"
OPTIM = "actor/optim_world_size_1_rank_0.pt"
EXTRA = "actor/extra_state_world_size_1_rank_0.pt"

# A dense reward, so that every step moves the weights and a wrong resume shows in the metrics.
DENSE_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(sum(map(ord, solution_str)) % 7) / 6.0
"""


def overrides(out: Path, data: Path, **extra) -> list[str]:
    reward = data / "dense_reward.py"
    if not reward.exists():
        reward.write_text(DENSE_REWARD)
    return run_overrides(
        out,
        data,
        {
            "custom_reward_function.path": reward,
            "data.train_batch_size": 4,
            "data.max_response_length": 3,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
            "actor_rollout_ref.actor.use_kl_loss": "true",
            "actor_rollout_ref.actor.kl_loss_coef": 0.05,
            "actor_rollout_ref.rollout.n": 2,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
            "trainer.total_training_steps": 3,
            "trainer.save_freq": 1,
            "trainer.test_freq": -1,
            "trainer.val_before_train": "false",
            "trainer.max_actor_ckpt_to_keep": "null",
            "trainer.logger": "[console]",
            "ray_init.num_cpus": 2,
        },
        extra,
    )


def metrics(out: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), f"duplicate rows: {steps}"
    return {r["step"]: r for r in rows}


def assert_rows_match(got: dict, ref: dict, steps) -> None:
    for step in steps:
        for key in COMPARED:
            assert got[step][key] == pytest.approx(ref[step][key], rel=1e-4, abs=1e-6), (step, key)


def cli(args: list[str], cache: Path, **popen) -> subprocess.Popen:
    env = dict(os.environ, VERL_NPU_CACHE=str(cache), OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "verl_npu.cli", "run", "tiny_geo3k", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def wait_for(predicate, proc: subprocess.Popen | None = None, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended early ({proc.returncode}): {proc.stdout.read()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError("timed out")


def rows_written(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture(scope="module")
def geo_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("geo")
    prepare_synthetic(folder, n_train=12, n_test=4, seed=0, image_size=56)
    return folder


@pytest.fixture(scope="module")
def reference(tmp_path_factory, geo_data, tiny_vl_path):
    """An uninterrupted 3-step run with a checkpoint at every step (global_step_1..3)."""
    out = tmp_path_factory.mktemp("reference") / "out"
    assert run_training(load_recipe("tiny_geo3k", overrides(out, geo_data))) == 0
    return out


def copy_run(reference: Path, dest: Path) -> Path:
    shutil.copytree(reference, dest)
    return dest


# ---- 1. manifests ------------------------------------------------------------------------------
def test_every_checkpoint_has_a_manifest_of_all_its_files(reference):
    ckpt = reference / "checkpoints" / "global_step_3"
    manifest = json.loads((ckpt / MANIFEST_FILE).read_text())
    files = manifest["files"]
    for rel in (MODEL, OPTIM, EXTRA, TRAINER_STATE_FILE, "actor/huggingface/model.safetensors"):
        assert files[rel]["size"] == (ckpt / rel).stat().st_size, rel
    assert "COMPLETE" not in files and MANIFEST_FILE not in files
    assert manifest["total_bytes"] == sum(f["size"] for f in files.values())
    assert "manifest=manifest.json" in (ckpt / "COMPLETE").read_text()
    check = verify_checkpoint(ckpt)
    assert check.verified and check.ok, check.problems
    assert not (ckpt / "data.pt").exists()  # the trainer's state is JSON now


def _damage(ckpt: Path, how: str) -> tuple[str, str]:
    """Damage one file of `ckpt`; (its relative path, the words the report must use)."""
    if how == "truncate":
        path = ckpt / MODEL
        with open(path, "r+b") as fh:
            fh.truncate(path.stat().st_size // 2)
        return MODEL, "truncated"
    if how == "zero-4k":
        path = ckpt / OPTIM
        data = bytearray(path.read_bytes())
        start = len(data) // 2
        assert any(data[start : start + 4096]), "pick a block that is not already zero"
        data[start : start + 4096] = bytes(4096)
        path.write_bytes(bytes(data))
        assert path.stat().st_size == len(data)  # same size: only the checksum can tell
        return OPTIM, "contents changed"
    if how == "delete":
        (ckpt / OPTIM).unlink()
        return OPTIM, "missing"
    raise ValueError(how)


@pytest.mark.parametrize("how", ["truncate", "zero-4k", "delete"])
def test_damaged_latest_is_reported_by_name_and_auto_falls_back(tmp_path, reference, how, caplog):
    root = copy_run(reference / "checkpoints", tmp_path / "ckpt")
    latest = root / "global_step_3"
    rel, words = _damage(latest, how)
    check = verify_checkpoint(latest)
    assert not check.ok and len(check.problems) == 1, check.problems
    assert check.problems[0].startswith(rel) and words in check.problems[0]

    mgr = CheckpointManager(root)
    assert mgr.latest() == latest  # COMPLETE alone still trusts it: the manifest is what catches it
    with caplog.at_level(logging.WARNING):
        assert mgr.resolve_resume("auto", None) == root / "global_step_2"
    assert f"{latest} is damaged" in caplog.text and rel in caplog.text and "falling back" in caplog.text

    with pytest.raises(UserError) as info:
        mgr.resolve_resume("resume_path", str(latest))
    assert "is damaged" in str(info.value) and rel in str(info.value) and words in str(info.value)
    assert mgr.resolve_resume("resume_path", str(root / "global_step_2")) == root / "global_step_2"


def test_every_checkpoint_damaged_stops_instead_of_starting_over(tmp_path, reference):
    root = copy_run(reference / "checkpoints", tmp_path / "ckpt")
    for step in (1, 2, 3):
        (root / f"global_step_{step}" / EXTRA).unlink()
    (root / "global_step_2" / "notes.txt").write_text("added later")
    with pytest.raises(UserError) as info:
        CheckpointManager(root).resolve_resume("auto", None)
    text = str(info.value)
    assert "every checkpoint" in text and "resume_mode=disable" in text
    assert text.count(EXTRA) == 3 and "notes.txt: not in the manifest" in text


def test_resume_path_to_a_damaged_checkpoint_is_a_clean_cli_error(tmp_path, reference, geo_data, capsys):
    from verl_npu.cli import main

    out = copy_run(reference, tmp_path / "out")
    _damage(out / "checkpoints" / "global_step_3", "zero-4k")
    code = main(
        [
            "run",
            "tiny_geo3k",
            *overrides(
                out,
                geo_data,
                **{
                    "trainer.resume_mode": "resume_path",
                    "trainer.resume_from_path": out / "checkpoints" / "global_step_3",
                    "trainer.total_training_steps": 4,
                },
            ),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1, err
    assert "global_step_3 is damaged" in err and OPTIM in err and "Traceback" not in err
    assert not (out / LOCK_FILE).exists()  # released on the way out


@pytest.mark.parametrize("case", ["damaged-latest", "no-manifest-legacy-state"])
def test_resume_after_fallback_or_from_an_unverified_checkpoint_matches(tmp_path, reference, geo_data, case, caplog):
    """auto skips a damaged global_step_3 for global_step_2; a checkpoint of an older verl-npu (no
    manifest, the trainer state in data.pt) resumes with a warning. Either way step 3 is trained
    again exactly as the uninterrupted run trained it."""
    out = copy_run(reference, tmp_path / "out")
    ckpts = out / "checkpoints"
    if case == "damaged-latest":
        _damage(ckpts / "global_step_3", "zero-4k")
    else:
        shutil.rmtree(ckpts / "global_step_3")
        (ckpts / "latest_checkpointed_iteration.txt").write_text("2\n")
        old = ckpts / "global_step_2"
        state = load_trainer_state(old)
        # what verl-npu wrote before: one torch pickle holding numpy arrays and Python tuples
        torch.save(
            {"dataloader": state["dataloader"], "global_step": 2, "kl_coef": state["kl_coef"], "rng": state["rng"]},
            old / "data.pt",
        )
        (old / TRAINER_STATE_FILE).unlink()
        (old / MANIFEST_FILE).unlink()
    with caplog.at_level(logging.INFO, logger="verl_npu"):
        assert run_training(load_recipe("tiny_geo3k", overrides(out, geo_data))) == 0
    assert f"resumed from {ckpts / 'global_step_2'} at step 2" in caplog.text
    if case == "damaged-latest":
        assert "global_step_3 is damaged" in caplog.text and OPTIM in caplog.text
    else:
        assert "cannot be verified" in caplog.text and "data.pt" in caplog.text
    got = metrics(out)
    assert sorted(got) == [1, 2, 3]
    assert_rows_match(got, metrics(reference), [3])
    assert verify_checkpoint(ckpts / "global_step_3").ok  # saved again, whole


# ---- 2. loading never runs code -----------------------------------------------------------------
class Payload:
    """Unpickling this creates a marker file: what a planted object in a checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _plant(path: Path, marker: Path) -> None:
    torch.save({"weight": torch.zeros(2), "payload": Payload(marker)}, path)
    # the payload is live: an unrestricted torch.load runs it (so the test below can fail)
    torch.load(path, weights_only=False)
    assert marker.exists()
    marker.unlink()


@pytest.mark.parametrize("rel", [MODEL, OPTIM, EXTRA, "data.pt"])
def test_a_planted_pickle_payload_never_runs(tmp_path, reference, rel):
    ckpt = copy_run(reference / "checkpoints" / "global_step_3", tmp_path / "global_step_3")
    marker = tmp_path / "pwned"
    _plant(ckpt / rel, marker)
    with pytest.raises(UnsafeCheckpointFile) as info:
        if rel == "data.pt":
            (ckpt / TRAINER_STATE_FILE).unlink()
            load_trainer_state(ckpt)  # an old-format checkpoint's trainer state
        else:
            load_torch(ckpt / rel)
    assert str(ckpt / rel) in str(info.value) and "refers to getattr" in str(info.value)
    assert not marker.exists()


def test_a_planted_payload_with_a_forged_manifest_stops_the_resume(tmp_path, reference, geo_data):
    """The attacker also rewrote the manifest, so verification passes; the worker still refuses."""
    out = copy_run(reference, tmp_path / "out")
    ckpt = out / "checkpoints" / "global_step_3"
    marker = tmp_path / "pwned"
    _plant(ckpt / MODEL, marker)
    write_manifest(ckpt, 3)
    assert verify_checkpoint(ckpt).ok
    rc = load_recipe("tiny_geo3k", overrides(out, geo_data, **{"trainer.total_training_steps": 4}))
    with pytest.raises(UnsafeCheckpointFile, match="model_world_size_1_rank_0.pt"):
        run_training(rc)
    assert not marker.exists()


def test_sharded_and_legacy_states_load_with_weights_only(tmp_path):
    """What the allow-list is for: numpy RNG states of old data.pt files, and DTensor shards."""
    import numpy as np
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    legacy = tmp_path / "data.pt"
    torch.save({"rng": save_rng_state(), "dataloader": {"epoch": 0}, "kl_coef": 0.1}, legacy)
    loaded = load_torch(legacy)
    assert isinstance(loaded["rng"]["numpy"][1], np.ndarray)

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        shard = distribute_tensor(torch.arange(6.0).reshape(3, 2), mesh, [Shard(0)])
        torch.save(
            {
                "w": shard,
                "opt": {
                    "state": {"w": {"exp_avg": shard, "step": torch.tensor(3.0)}},
                    "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": ["w"]}],
                },
            },
            tmp_path / "shard.pt",
        )
        back = load_torch(tmp_path / "shard.pt")
        assert isinstance(back["w"], DTensor) and torch.equal(back["w"].full_tensor(), shard.full_tensor())
    finally:
        if owned:
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def test_trainer_state_is_json_and_restores_rng_exactly(tmp_path):
    import random

    import numpy as np

    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    random.gauss(0, 1)  # a cached gaussian in both generators
    np.random.standard_normal()
    state = save_rng_state()
    restored = rng_state_from_json(json.loads(json.dumps(rng_state_to_json(state))))
    expected = (random.random(), random.gauss(0, 1), np.random.rand(), np.random.standard_normal(), torch.rand(3))
    from verl_npu.trainer.checkpoint import load_rng_state

    load_rng_state(restored)
    got = (random.random(), random.gauss(0, 1), np.random.rand(), np.random.standard_normal(), torch.rand(3))
    assert got[:4] == expected[:4] and torch.equal(got[4], expected[4])
    with pytest.raises(pickle.UnpicklingError):  # JSON: nothing a pickle reader would accept
        pickle.loads(json.dumps(rng_state_to_json(state)).encode())


# ---- 3. one run per output folder ---------------------------------------------------------------
def _holder(tmp_path: Path, folder: Path) -> subprocess.Popen:
    code = (
        "import sys, time; from verl_npu.trainer.runlock import RunLock\n"
        "lock = RunLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_lock_refuses_a_live_holder_and_takes_over_a_dead_ones(tmp_path, caplog):
    folder = tmp_path / "out"
    holder = _holder(tmp_path, folder)
    try:
        with pytest.raises(OutputFolderBusy) as info:
            RunLock(folder).acquire()
        assert f"pid {holder.pid} on host {socket.gethostname()}" in str(info.value)
    finally:
        holder.kill()
        holder.wait()
    # killed (-9): the file stays, with the dead pid in it; the kernel dropped its flock
    assert json.loads((folder / LOCK_FILE).read_text())["pid"] == holder.pid
    with caplog.at_level(logging.WARNING, logger="verl_npu"):
        lock = RunLock(folder).acquire()
    assert "no longer running" in caplog.text and f"pid {holder.pid}" in caplog.text
    assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (folder / LOCK_FILE).exists()

    # a lock from another machine (a shared file system) is not guessed about
    (folder / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "node-7", "started_at": "yesterday"}))
    with pytest.raises(OutputFolderBusy, match="pid 1 on host node-7.*rm "):
        RunLock(folder).acquire()


@pytest.mark.slow
def test_a_second_run_in_the_same_folder_stops_and_writes_nothing(tmp_path, geo_data, tiny_cache):
    out = tmp_path / "out"
    first = cli(overrides(out, geo_data, **{"trainer.total_training_steps": 200, "trainer.save_freq": -1}), tiny_cache)
    try:
        wait_for(lambda: rows_written(out) >= 1, first)
        config_before = (out / "exp-config.yaml").read_text()
        rows_before = rows_written(out)
        second = cli(overrides(out, geo_data, **{"trainer.total_training_steps": 2}), tiny_cache)
        output, _ = second.communicate(timeout=120)
        assert second.returncode == 1, output
        assert f"is in use by another run (pid {first.pid} on host {socket.gethostname()}" in output, output
        assert "Traceback" not in output
        assert (out / "exp-config.yaml").read_text() == config_before  # not overwritten
        assert first.poll() is None  # the first run goes on
        assert rows_written(out) >= rows_before
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=120)
    assert first.returncode == 130
    assert not (out / LOCK_FILE).exists()  # released at exit
    metrics(out)  # one row per step: nothing of the second run's in it


# ---- 4. disk space --------------------------------------------------------------------------------
def _writer(size: int):
    def write(tmp_dir: Path) -> None:
        (tmp_dir / "actor").mkdir()
        (tmp_dir / "actor" / "model.bin").write_bytes(os.urandom(size))

    return write


def _enospc_writer(wrap: str):
    def write(tmp_dir: Path) -> None:
        (tmp_dir / "actor").mkdir()
        (tmp_dir / "actor" / "model.bin").write_bytes(b"x" * 5000)  # written before the disk filled
        err = OSError(errno.ENOSPC, "No space left on device", str(tmp_dir / "actor" / "optim.pt"))
        if wrap == "oserror":
            raise err
        if wrap == "worker-group":  # how RayWorkerGroup re-raises a worker's error
            raise RuntimeError(f"worker rank 1 failed: {err!r}") from err
        if wrap == "torch-writer":  # torch's stream writer, the OSError only in the context
            try:
                raise err
            except OSError:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
        raise ValueError(wrap)

    return write


def _hidden(root: Path) -> list[str]:
    return [p.name for p in root.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("wrap", ["oserror", "worker-group", "torch-writer"])
def test_enospc_during_a_save_keeps_the_previous_checkpoints(tmp_path, wrap):
    root = tmp_path / "ckpt"
    mgr = CheckpointManager(root, max_to_keep=2)
    mgr.save(1, _writer(3000))
    mgr.save(2, _writer(3000))
    with pytest.raises(DiskFull) as info:
        mgr.save(3, _enospc_writer(wrap))
    text = str(info.value)
    assert text.startswith(f"no space left on {root}: needed ~") and ", free " in text
    assert "(the size of global_step_2)" in text and "global_step_2, is intact" in text
    assert [p.name for p in mgr.list_complete()] == ["global_step_1", "global_step_2"]
    assert _hidden(root) == []  # the half-written temp folder is gone
    assert (root / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert all(verify_checkpoint(p).ok for p in mgr.list_complete())


def test_enospc_on_the_first_save_says_what_was_written(tmp_path):
    with pytest.raises(DiskFull, match=r"needed more than 4\.9 KiB .*no complete checkpoint exists yet"):
        CheckpointManager(tmp_path).save(1, _enospc_writer("oserror"))
    assert list(tmp_path.iterdir()) == []


def test_save_is_refused_before_writing_when_free_space_is_short(tmp_path, monkeypatch):
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, _writer(50_000))
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=20_000))
    called = []
    with pytest.raises(DiskFull, match=r"needed ~4\d\.\d KiB \(the size of global_step_1\), free 19\.5 KiB"):
        mgr.save(2, lambda d: called.append(d))
    assert called == [] and [p.name for p in mgr.list_complete()] == ["global_step_1"]


@pytest.fixture
def small_fs(tmp_path):
    """A real tmpfs of the asked size (root only); skips where it cannot be mounted."""
    mounted = []

    def make(size_kib: int) -> Path:
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        if os.geteuid() != 0:
            pytest.skip("mounting a small file system needs root (the simulated ENOSPC tests cover the rest)")
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(point)], capture_output=True, text=True
        )
        if res.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_real_full_disk_stops_cleanly(tmp_path, geo_data, tiny_cache, small_fs, reference, workers):
    """1 worker: room for 1.5 checkpoints: step 1 is saved, step 2 is refused before writing.
    2 Ray workers: room for less than one: a worker's write hits ENOSPC."""
    size = json.loads((reference / "checkpoints" / "global_step_1" / MANIFEST_FILE).read_text())["total_bytes"]
    fs = small_fs(int(size * (1.5 if workers == 1 else 0.4)) // 1024)
    out = tmp_path / "out"
    proc = cli(
        overrides(out, geo_data, **{"trainer.default_local_dir": fs, "trainer.n_gpus_per_node": workers}), tiny_cache
    )
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, output
    assert f"no space left on {fs}: needed " in output and "free " in output, output
    assert "Traceback" not in output
    assert _hidden(fs) == []  # no half-written temp folder takes the space
    if workers == 1:
        assert "(the size of global_step_1)" in output
        assert [p.name for p in CheckpointManager(fs).list_complete()] == ["global_step_1"]
        assert verify_checkpoint(fs / "global_step_1").ok
    else:
        assert CheckpointManager(fs).list_complete() == []
    assert not (out / LOCK_FILE).exists()


@pytest.mark.slow
def test_a_full_disk_under_the_logs_stops_cleanly_and_keeps_the_checkpoints(tmp_path, geo_data, tiny_cache, small_fs):
    """af_output_dir (logs, metrics, curves) on a 40 KiB file system, checkpoints elsewhere: the run stops
    with one line naming the folder, no traceback, and every checkpoint it wrote is complete."""
    fs = small_fs(40)
    ckpt = tmp_path / "ckpt"
    proc = cli(overrides(fs / "out", geo_data, **{"trainer.default_local_dir": ckpt}), tiny_cache)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, output
    assert f"no space left on device while writing the run's files under {fs / 'out'}" in output, output[-3000:]
    assert "Traceback" not in output
    complete = CheckpointManager(ckpt).list_complete()
    assert complete and all(verify_checkpoint(p).ok for p in complete)
    assert f"the last complete checkpoint, {complete[-1]}, is intact" in output


# ---- 5. preemption -------------------------------------------------------------------------------
def test_signal_handlers_state_machine():
    preempt.reset()
    preempt.set_phase("startup")
    with pytest.raises(preempt.Preempted) as info:  # before training: stop at once
        preempt._on_sigterm(signal.SIGTERM, None)
    assert info.value.exit_code == 143
    preempt.reset()
    preempt.set_phase("training")
    preempt._on_sigterm(signal.SIGTERM, None)  # during training: only noted
    assert preempt.stop_requested() == signal.SIGTERM
    preempt._on_sigterm(signal.SIGTERM, None)  # a second one changes nothing
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C during the graceful stop: drop the step
        preempt._on_sigint(signal.SIGINT, None)
    preempt._on_sigint(signal.SIGINT, None)  # and further ones let the cleanup finish
    preempt.reset()
    with pytest.raises(KeyboardInterrupt):  # before training, a first Ctrl-C stops at once
        preempt._on_sigint(signal.SIGINT, None)
    preempt.reset()


def test_real_sigterm_in_training_is_only_noted():
    before = signal.getsignal(signal.SIGTERM)
    with preempt.handle_signals():
        preempt.set_phase("training")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert preempt.stop_requested() == signal.SIGTERM
    assert preempt.stop_requested() is None  # reset on the way out
    assert signal.getsignal(signal.SIGTERM) == before  # and the handler restored


def test_save_on_preempt_false_stops_without_saving(tmp_path, geo_data, tiny_vl_path, monkeypatch, caplog):
    from verl_npu.trainer.ppo import PPOTrainer

    real_step = PPOTrainer.train_step

    def step_then_signal(self, prompts):
        out = real_step(self, prompts)
        if self.global_step == 2:
            preempt.request_stop(signal.SIGTERM)  # what the SIGTERM handler does
        return out

    monkeypatch.setattr(PPOTrainer, "train_step", step_then_signal)
    preempt.reset()
    out = tmp_path / "out"
    rc = load_recipe(
        "tiny_geo3k",
        overrides(
            out,
            geo_data,
            **{"trainer.total_training_steps": 5, "trainer.save_freq": -1, "trainer.save_on_preempt": "false"},
        ),
    )
    try:
        with caplog.at_level(logging.WARNING, logger="verl_npu"):
            assert run_training(rc) == 143
    finally:
        preempt.reset()
    assert sorted(metrics(out)) == [1, 2]
    assert "stopped by SIGTERM after step 2 of 5: not saved (trainer.save_on_preempt=false)" in caplog.text
    assert CheckpointManager(out / "checkpoints").list_complete() == []


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2], ids=["1-worker", "2-ray-workers-group-signal"])
def test_sigterm_finishes_the_step_saves_and_resumes(tmp_path, geo_data, tiny_cache, tiny_vl_path, workers):
    """A real SIGTERM to a real run: the step in progress finishes, a checkpoint of it is saved,
    exit 143 naming it; the rerun continues from it. With 2 Ray workers the signal goes to the
    whole process group, as schedulers send it: the workers must not die of it first."""
    steps = {"trainer.total_training_steps": 4, "trainer.save_freq": -1, "trainer.n_gpus_per_node": workers}
    out = tmp_path / "out"
    args = overrides(out, geo_data, **steps)
    proc = cli(args, tiny_cache, start_new_session=True)
    wait_for(lambda: rows_written(out) >= 1, proc, timeout=240)
    if workers == 1:
        os.kill(proc.pid, signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGTERM)  # the driver, Ray's daemons (the workers have their own groups)
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode == 143, output
    saved = CheckpointManager(out / "checkpoints").list_complete()
    assert len(saved) == 1, output
    step = CheckpointManager.step_of(saved[0])
    assert 1 <= step < 4 and sorted(metrics(out)) == list(range(1, step + 1))
    assert f"stopped by SIGTERM after step {step} of 4: saved checkpoint {saved[0]}" in output
    assert "Traceback" not in output and not (out / LOCK_FILE).exists()
    assert verify_checkpoint(saved[0]).ok
    if workers == 2:
        with pytest.raises(ProcessLookupError):  # nothing of the run is left in its group
            os.killpg(proc.pid, 0)

    resumed = cli(args, tiny_cache)
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output[-3000:]
    assert f"resumed from {saved[0]} at step {step}" in output
    got = metrics(out)
    assert sorted(got) == [1, 2, 3, 4]
    if workers == 1:  # an uninterrupted run (in this process) trains the same steps
        straight = tmp_path / "straight"
        assert run_training(load_recipe("tiny_geo3k", overrides(straight, geo_data, **steps))) == 0
        assert_rows_match(got, metrics(straight), range(1, 5))
