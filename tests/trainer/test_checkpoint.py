"""CheckpointManager on real folders: atomic saves, marker, rotation, crash recovery, resume modes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from verl_npu.errors import UserError
from verl_npu.trainer.checkpoint import (
    COMPLETE_FILE,
    MARKER_FILE,
    CheckpointManager,
    load_rng_state,
    load_torch,
    save_rng_state,
    save_torch,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _writer(payload: str):
    def write(tmp_dir: Path) -> None:
        (tmp_dir / "actor").mkdir()
        (tmp_dir / "actor" / "model.txt").write_text(payload)
        save_torch({"payload": payload, "t": torch.arange(3)}, tmp_dir / "data.pt")

    return write


def _visible(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def _hidden(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def test_save_writes_layout_marker_and_content(tmp_path):
    mgr = CheckpointManager(tmp_path / "ckpt")
    assert mgr.latest() is None
    for step in (1, 2, 3):
        path = mgr.save(step, _writer(f"w{step}"))
        assert path == tmp_path / "ckpt" / f"global_step_{step}"
        assert (tmp_path / "ckpt" / MARKER_FILE).read_text().strip() == str(step)
    root = tmp_path / "ckpt"
    assert _visible(root) == ["global_step_1", "global_step_2", "global_step_3", MARKER_FILE]
    assert _hidden(root) == []  # no temp folder or temp marker left behind
    latest = mgr.latest()
    assert latest == root / "global_step_3"
    assert (latest / COMPLETE_FILE).is_file()
    assert (latest / "actor" / "model.txt").read_text() == "w3"
    loaded = load_torch(latest / "data.pt")
    assert loaded["payload"] == "w3" and torch.equal(loaded["t"], torch.arange(3))
    assert [CheckpointManager.step_of(p) for p in mgr.list_complete()] == [1, 2, 3]


def test_step_of():
    assert CheckpointManager.step_of("/a/b/global_step_42") == 42
    assert CheckpointManager.step_of(Path("global_step_0")) == 0
    for bad in ("global_step_", "global_step_x", "step_3", "global_step_3.bak"):
        with pytest.raises(ValueError):
            CheckpointManager.step_of(bad)


def test_rotation_keeps_newest_max_to_keep(tmp_path):
    mgr = CheckpointManager(tmp_path, max_to_keep=2)
    for step in (2, 4, 6, 8):
        mgr.save(step, _writer(str(step)))
    assert [p.name for p in mgr.list_complete()] == ["global_step_6", "global_step_8"]
    assert _hidden(tmp_path) == []
    assert mgr.latest().name == "global_step_8"


def test_rotation_never_deletes_the_checkpoint_just_saved(tmp_path):
    mgr = CheckpointManager(tmp_path, max_to_keep=1)
    mgr.save(10, _writer("10"))
    # Saving an older step (e.g. after resume_path to an early checkpoint) keeps that one.
    mgr.save(5, _writer("5"))
    assert [p.name for p in mgr.list_complete()] == ["global_step_5"]
    assert mgr.latest().name == "global_step_5"


def test_none_or_zero_max_to_keep_keeps_everything(tmp_path):
    for max_to_keep in (None, 0):
        root = tmp_path / str(max_to_keep)
        mgr = CheckpointManager(root, max_to_keep=max_to_keep)
        for step in range(1, 5):
            mgr.save(step, _writer(str(step)))
        assert len(mgr.list_complete()) == 4


def test_resave_same_step_replaces_it(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.save(3, _writer("old"))
    mgr.save(3, _writer("new"))
    assert (tmp_path / "global_step_3" / "actor" / "model.txt").read_text() == "new"
    assert _hidden(tmp_path) == []


def test_write_fn_raising_leaves_previous_checkpoint_intact(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, _writer("good"))

    def failing(tmp_dir: Path) -> None:
        (tmp_dir / "actor").mkdir()
        (tmp_dir / "actor" / "model.txt").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        mgr.save(2, failing)
    assert _visible(tmp_path) == ["global_step_1", MARKER_FILE]
    assert _hidden(tmp_path) == []
    assert (tmp_path / MARKER_FILE).read_text().strip() == "1"
    assert mgr.latest() == tmp_path / "global_step_1"
    assert (mgr.latest() / "actor" / "model.txt").read_text() == "good"

    # A failed re-save of an existing step must not damage that step either.
    with pytest.raises(RuntimeError):
        mgr.save(1, failing)
    assert (tmp_path / "global_step_1" / "actor" / "model.txt").read_text() == "good"


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from verl_npu.trainer import checkpoint as ck

    root, where = Path(sys.argv[1]), sys.argv[2]
    mgr = ck.CheckpointManager(root)
    mgr.save(1, lambda d: (d / "model.txt").write_text("one"))

    def die(*_a, **_k):
        os.kill(os.getpid(), signal.SIGKILL)

    def write_then_die(d):
        (d / "model.txt").write_text("two-partial")
        die()

    if where == "write_fn":
        mgr.save(2, write_then_die)
    elif where == "before_marker":
        ck._write_text_atomic = die  # killed after the rename, before the marker moves
        mgr.save(2, lambda d: (d / "model.txt").write_text("two"))
    elif where == "replace_between_renames":
        real_rename = os.rename
        def rename_then_die(src, dst):
            real_rename(src, dst)
            if str(src).endswith("global_step_1"):  # old one moved aside, new not yet in place
                die()
        ck.os.rename = rename_then_die
        mgr.save(1, lambda d: (d / "model.txt").write_text("one-new"))
    print("not killed")
    """
)


def _run_child_killed(root: Path, where: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), where], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)


def test_sigkill_mid_write_fn_keeps_previous_checkpoint(tmp_path):
    root = tmp_path / "ckpt"
    _run_child_killed(root, "write_fn")
    assert _visible(root) == ["global_step_1", MARKER_FILE]
    assert any(name.startswith(".tmp-global_step_2-") for name in _hidden(root))  # the half save
    mgr = CheckpointManager(root)  # init removes the dead process's leftovers
    assert _hidden(root) == []
    assert mgr.latest() == root / "global_step_1"
    assert (mgr.latest() / "model.txt").read_text() == "one"
    assert mgr.resolve_resume("auto", None) == root / "global_step_1"


def test_sigkill_before_marker_moves_keeps_marker_on_previous(tmp_path):
    root = tmp_path / "ckpt"
    _run_child_killed(root, "before_marker")
    mgr = CheckpointManager(root)
    assert (root / MARKER_FILE).read_text().strip() == "1"
    assert mgr.latest() == root / "global_step_1"
    # The finished step-2 folder is complete and listed, and the next save of step 2 replaces it.
    assert [p.name for p in mgr.list_complete()] == ["global_step_1", "global_step_2"]
    mgr.save(2, lambda d: (d / "model.txt").write_text("two-again"))
    assert mgr.latest() == root / "global_step_2"
    assert (root / "global_step_2" / "model.txt").read_text() == "two-again"


def test_sigkill_while_replacing_a_step_restores_the_old_copy(tmp_path):
    root = tmp_path / "ckpt"
    _run_child_killed(root, "replace_between_renames")
    assert not (root / "global_step_1").exists()  # the crash window between the two renames
    mgr = CheckpointManager(root)  # repairs it
    assert mgr.latest() == root / "global_step_1"
    assert (root / "global_step_1" / "model.txt").read_text() == "one"
    assert _hidden(root) == []


def test_latest_falls_back_when_marker_is_wrong(tmp_path, caplog):
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, _writer("1"))
    mgr.save(2, _writer("2"))
    (tmp_path / "global_step_3").mkdir()  # incomplete: no COMPLETE file
    (tmp_path / "global_step_3" / "model.txt").write_text("partial")
    (tmp_path / MARKER_FILE).write_text("3\n")
    with caplog.at_level("WARNING"):
        assert mgr.latest() == tmp_path / "global_step_2"
    assert "step 3" in caplog.text
    (tmp_path / MARKER_FILE).write_text("garbage")
    assert mgr.latest() == tmp_path / "global_step_2"
    (tmp_path / MARKER_FILE).unlink()
    assert mgr.latest() == tmp_path / "global_step_2"
    assert [p.name for p in mgr.list_complete()] == ["global_step_1", "global_step_2"]


def test_resolve_resume_modes(tmp_path, monkeypatch):
    root = tmp_path / "ckpt"
    mgr = CheckpointManager(root)
    assert mgr.resolve_resume("auto", None) is None  # fresh start
    mgr.save(4, _writer("4"))
    mgr.save(8, _writer("8"))
    assert mgr.resolve_resume("disable", str(root / "global_step_4")) is None
    assert mgr.resolve_resume("auto", None) == root / "global_step_8"
    assert mgr.resolve_resume("resume_path", str(root / "global_step_4")) == root / "global_step_4"
    monkeypatch.chdir(tmp_path)
    assert mgr.resolve_resume("resume_path", "ckpt/global_step_4") == root / "global_step_4"


@pytest.mark.parametrize(
    "mode,path,expected",
    [
        ("resume_path", None, "trainer.resume_from_path: empty"),
        ("resume_path", "ckpt", "not a checkpoint folder"),
        ("resume_path", "ckpt/global_step_99", "does not exist"),
        ("resume_path", "ckpt/global_step_7", "no COMPLETE file"),
        ("sometimes", None, "trainer.resume_mode"),
    ],
)
def test_resolve_resume_errors(tmp_path, monkeypatch, mode, path, expected):
    root = tmp_path / "ckpt"
    mgr = CheckpointManager(root)
    mgr.save(4, _writer("4"))
    (root / "global_step_7").mkdir()  # a folder whose save never finished
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as info:
        mgr.resolve_resume(mode, path)
    assert expected in str(info.value)
    if mode == "resume_path" and path and path.startswith("ckpt/"):
        assert "global_step_4" in str(info.value)  # names the usable checkpoints


def test_rng_state_roundtrip_through_checkpoint(tmp_path):
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    save_torch(save_rng_state(), tmp_path / "rng.pt")
    expected = (random.random(), np.random.rand(), torch.rand(2))
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    load_rng_state(load_torch(tmp_path / "rng.pt"))
    got = (random.random(), np.random.rand(), torch.rand(2))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])
    with pytest.raises(KeyError, match="numpy"):
        load_rng_state({"python": random.getstate(), "torch_cpu": torch.get_rng_state()})
