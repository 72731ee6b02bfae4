"""Bad places and bad files a user can hand the suite get a clean error or the documented safe
behaviour, and a user's own files are never replaced silently (issue 24; docs/reliability.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from recipe_loads import load_outcomes
from run_helpers import text_data, text_run_overrides

from verl_npu.data import geometry3k, gsm8k
from verl_npu.errors import UserError
from verl_npu.trainer.checkpoint import MARKER_FILE, CheckpointManager
from verl_npu.trainer.runlock import RunLock
from verl_npu.trainer.tracking import Tracker

CLI = [sys.executable, "-m", "verl_npu.cli"]


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


# ---- af_output_dir that cannot be a run folder -----------------------------------------------------
def test_output_dir_that_is_a_file_or_below_one_is_named(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with pytest.raises(UserError, match="is an existing file, not a folder"):
        RunLock(a_file).acquire()
    with pytest.raises(UserError, match="a part of this path is a file"):
        RunLock(a_file / "run1").acquire()
    assert a_file.read_text() == "mine"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere: no permission error to see")
def test_unwritable_output_dir_is_named(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        with pytest.raises(UserError, match="cannot create the folder"):
            RunLock(parent / "run").acquire()
    finally:
        parent.chmod(0o700)


def test_unwritable_output_dir_under_proc_is_named():
    """/proc refuses new folders even to root: the error names the folder and the fix."""
    with pytest.raises(UserError, match=r"af_output_dir /proc/verl_npu_x/run: cannot create the folder"):
        RunLock("/proc/verl_npu_x/run").acquire()


@pytest.mark.slow
def test_run_cli_with_a_file_as_output_dir_exits_1_without_traceback(tmp_path):
    data = text_data(tmp_path / "data")
    a_file = tmp_path / "out"
    a_file.write_text("mine")
    proc = _cli("run", "tiny_gsm8k", *text_run_overrides(a_file, data))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert f"af_output_dir {a_file} is an existing file" in proc.stderr
    assert a_file.read_text() == "mine"


# ---- a validation file without rows --------------------------------------------------------------
@pytest.mark.slow
def test_empty_validation_parquet_is_named_before_training(tmp_path):
    data = text_data(tmp_path / "data")
    empty = tmp_path / "empty.parquet"
    pq.write_table(pq.read_table(data / "test.parquet").slice(0, 0), empty)
    assert pq.read_metadata(empty).num_rows == 0
    proc = _cli(
        "run",
        "tiny_gsm8k",
        *text_run_overrides(tmp_path / "out", data, **{"data.val_files": empty, "trainer.val_before_train": "true"}),
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert f"data.val_files ({empty}) has no usable row" in proc.stderr


# ---- a user's files in the run folder are kept aside, never overwritten -------------------------------
def test_fresh_start_keeps_an_existing_curves_png_aside(tmp_path):
    (tmp_path / "training_curves.png").write_bytes(b"the user's picture")
    with Tracker(tmp_path, ["file"], "p", "e", resume_step=0) as tracker:
        tracker.log({"x": 1.0}, 1)
    aside = list(tmp_path.glob("training_curves.previous-*.png"))
    assert len(aside) == 1 and aside[0].read_bytes() == b"the user's picture"
    assert not (tmp_path / "training_curves.png").exists()


def test_two_fresh_starts_in_one_second_keep_both_earlier_files(tmp_path):
    for i in range(3):
        (tmp_path / "metrics.jsonl").write_text(f'{{"step": 1, "x": {i}}}\n')
        Tracker(tmp_path, ["file"], "p", "e", resume_step=0).close()
    kept = sorted(p.read_text() for p in tmp_path.glob("metrics.previous-*.jsonl"))
    assert kept == [f'{{"step": 1, "x": {i}}}\n' for i in range(3)]


def test_resume_keeps_the_curves_png(tmp_path):
    (tmp_path / "training_curves.png").write_bytes(b"curves of steps 1-3")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "x": 1.0}\n')
    Tracker(tmp_path, ["file"], "p", "e", resume_step=1).close()
    assert (tmp_path / "training_curves.png").read_bytes() == b"curves of steps 1-3"
    assert not list(tmp_path.glob("*.previous-*"))


@pytest.mark.slow
def test_run_keeps_a_users_exp_config_aside(tmp_path):
    data = text_data(tmp_path / "data")
    out = tmp_path / "out"
    out.mkdir()
    (out / "exp-config.yaml").write_text("my: own notes\n")
    proc = _cli("run", "tiny_gsm8k", *text_run_overrides(out, data, **{"trainer.total_training_steps": 1}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    aside = list(out.glob("exp-config.previous-*.yaml"))
    assert len(aside) == 1 and aside[0].read_text() == "my: own notes\n"
    assert "backend_config" in (out / "exp-config.yaml").read_text()


# ---- data prep never replaces train/test.parquet silently -------------------------------------------
@pytest.mark.parametrize("module,extra", [(geometry3k, ["--image-size", "32"]), (gsm8k, [])])
def test_data_prep_refuses_to_overwrite_without_flag(tmp_path, capsys, module, extra):
    out = tmp_path / "data"
    module.main(["--synthetic", "4", "--local-save-dir", str(out), *extra])
    before = {name: (out / name).read_bytes() for name in ("train.parquet", "test.parquet")}
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--synthetic", "6", "--seed", "3", "--local-save-dir", str(out), *extra])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert str(out / "train.parquet") in err and "--overwrite" in err
    assert {name: (out / name).read_bytes() for name in before} == before
    module.main(["--synthetic", "6", "--seed", "3", "--local-save-dir", str(out), "--overwrite", *extra])
    assert pq.read_metadata(out / "train.parquet").num_rows == 6


def test_data_prep_refuses_when_only_one_split_exists(tmp_path, capsys):
    out = tmp_path / "data"
    out.mkdir()
    pq.write_table(pa.table({"x": [1]}), out / "test.parquet")
    with pytest.raises(SystemExit):
        gsm8k.main(["--synthetic", "4", "--local-save-dir", str(out)])
    assert str(out / "test.parquet") in capsys.readouterr().err
    assert not (out / "train.parquet").exists()


# ---- a marker file with bytes that are not text -------------------------------------------------------
def test_marker_with_non_utf8_bytes_falls_back_with_a_warning(tmp_path, caplog):
    manager = CheckpointManager(tmp_path)
    (tmp_path / MARKER_FILE).write_bytes(b"\xff\xfe\x00garbage")
    with caplog.at_level("WARNING", logger="verl_npu"):
        assert manager.latest() is None
    assert any("not a step number" in r.getMessage() for r in caplog.records)


def test_marker_with_non_utf8_bytes_falls_back_to_the_newest_complete_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path)
    step = manager.step_dir(2)
    step.mkdir(parents=True)
    (step / "COMPLETE").write_text("")
    (tmp_path / MARKER_FILE).write_bytes(b"\x80\x81")
    assert manager.is_complete(step)
    assert manager.latest() == step


# ---- every numeric key with absurd values: a named problem, never a traceback ---------------------------
def _numeric_keys():
    from verl_npu.config.schema import FLOAT, INT, SCHEMA

    return [key for key in SCHEMA.values() if key.type in (INT, FLOAT) and key.path.startswith("backend_config.")]


def test_every_numeric_key_with_absurd_values_is_a_named_problem_never_a_traceback():
    from verl_npu.config.schema import FLOAT

    keys = _numeric_keys()
    assert len(keys) > 50
    cases = [
        (key, value)
        for key in keys
        for value in ("nan", "inf", "-inf", "null", "1e30", "-1e30", "123456789012345678901234567890")
    ]
    # ~900 independent loads: spread over the cores (recipe_loads); each outcome is checked here
    outcomes = load_outcomes([("tiny_gsm8k", [f"{key.short}={value}"], key.short) for key, value in cases])
    crashes, accepted_non_finite = [], []
    for (key, value), (kind, got) in zip(cases, outcomes, strict=True):
        if kind == "problems":
            assert all(p_key and p_message for p_key, p_message in got)
            continue
        if kind == "crash":
            crashes.append(f"{key.short}={value}: {got}")
            continue
        if key.type == FLOAT and isinstance(got, float) and got != got or got in (float("inf"), float("-inf")):
            accepted_non_finite.append(f"{key.short}={value}")
    assert not crashes, "\n".join(crashes[:20])
    assert not accepted_non_finite, accepted_non_finite[:20]


def test_related_numeric_keys_absurd_together_or_one_null_never_a_traceback():
    """Every cross-key rule's numeric keys set to the same absurd value at once, and each one null while
    the others hold a plain 1: problems by key, never a traceback from inside a rule."""
    from verl_npu.config.rules import RULES
    from verl_npu.config.schema import FLOAT, INT, SCHEMA

    cases = []
    for rule in RULES:
        numeric = [SCHEMA[k].short for k in rule.keys if k in SCHEMA and SCHEMA[k].type in (INT, FLOAT)]
        if not numeric:
            continue
        overrides = [[f"{k}={v}" for k in numeric] for v in ("nan", "inf", "-inf", "null", "1e30", "-1e30")]
        overrides += [[f"{k}={'null' if k == nulled else 1}" for k in numeric] for nulled in numeric]
        cases += [(rule, combo) for combo in overrides]
    combos = len(cases)
    outcomes = load_outcomes([("tiny_gsm8k", combo, None) for _, combo in cases])
    crashes = [
        f"{rule.name}: {combo}: {got}"
        for (rule, combo), (kind, got) in zip(cases, outcomes, strict=True)
        if kind == "crash"
    ]
    assert combos > 100
    assert not crashes, "\n".join(crashes[:20])


def test_related_keys_one_null_one_set_is_a_named_problem():
    """A rule never runs on a value that failed its own check: here the null reaches the Ulysses
    rule through the key's verl alias."""
    from verl_npu.config import load_recipe
    from verl_npu.errors import ConfigErrors

    with pytest.raises(ConfigErrors, match="ulysses_sequence_parallel_size: must not be null"):
        load_recipe(
            "tiny_gsm8k",
            [
                "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size=1",
                "actor_rollout_ref.ref.ulysses_sequence_parallel_size=null",
            ],
        )


@pytest.mark.parametrize("value", ["inf", "nan", "1e6"])
def test_learning_rate_that_cannot_train_is_refused_at_validate(value):
    from verl_npu.config import load_recipe
    from verl_npu.errors import ConfigErrors

    with pytest.raises(ConfigErrors, match="actor.optim.lr"):
        load_recipe("tiny_gsm8k", [f"actor_rollout_ref.actor.optim.lr={value}"])


def test_yaml_alias_bomb_as_an_override_is_refused_at_once():
    """A "billion laughs" list of ~300 characters on the command line: aliases are not expanded, so it
    stays a short (wrong) value with a named problem, in well under a second and without memory growth."""
    import resource
    import time

    from verl_npu.config import load_recipe
    from verl_npu.errors import ConfigErrors

    level = '["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'
    parts, name = [f"&a {level}"], "a"
    for nxt in "bcdefghi":
        parts.append(f"&{nxt} [" + ",".join([f"*{name}"] * 9) + "]")
        name = nxt
    bomb = "[" + ",".join(parts) + "]"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    with pytest.raises(ConfigErrors, match="trainer.logger"):
        load_recipe("tiny_gsm8k", [f"trainer.logger={bomb}"])
    assert time.monotonic() - start < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB


def test_override_without_aliases_still_parses_lists_and_dicts():
    from verl_npu.config.overrides import parse_value

    assert parse_value("[console,tensorboard]") == ["console", "tensorboard"]
    assert parse_value("{a: 1, b: [2]}") == {"a": 1, "b": [2]}
    assert parse_value("*not_an_alias_in_text") == "*not_an_alias_in_text"


# ---- damaged trainer state, a checkpoint of another model ------------------------------------------
def _state_doc():
    import json

    from verl_npu.trainer.checkpoint import rng_state_to_json, save_rng_state

    return {
        "format": "verl-npu trainer state",
        "version": 1,
        "global_step": 2,
        "dataloader": {"epoch": 0, "sample_index": 8, "batch_size": 4},
        "kl_coef": 0.001,
        "rng": json.loads(json.dumps(rng_state_to_json(save_rng_state()))),
    }


def _damaged_docs():
    deep = "[" * 100_000 + "]" * 100_000
    yield "deeply nested", deep
    yield "a list", "[1, 2]"
    for name, change in [
        ("negative position", lambda d: d["dataloader"].update(sample_index=-3)),
        ("text position", lambda d: d["dataloader"].update(epoch="zero")),
        ("dataloader not a dict", lambda d: d.update(dataloader=[0, 8])),
        ("nan kl", lambda d: d.update(kl_coef="nan")),
        ("huge step", lambda d: d.update(global_step=1e400)),
        ("short python rng", lambda d: d["rng"]["python"][1].__delitem__(slice(0, 10))),
        ("numpy rng keys of the wrong length", lambda d: d["rng"]["numpy"].__setitem__(1, [1, 2, 3])),
        ("torch rng of the wrong size", lambda d: d["rng"].update(torch_cpu="AAAA")),
        ("rng not a dict", lambda d: d.update(rng=7)),
    ]:
        import json

        doc = _state_doc()
        change(doc)
        yield name, json.dumps(doc)


def test_a_damaged_trainer_state_is_named_never_a_traceback(tmp_path):
    """An older-format checkpoint (no manifest, so nothing verified it) with a trainer_state.json that is
    deeply nested, of the wrong types or holds RNG states the generators refuse: a UserError naming the
    file, raised before anything is restored."""
    import json
    import random

    from verl_npu.trainer.checkpoint import load_trainer_state

    (tmp_path / "trainer_state.json").write_text(json.dumps(_state_doc()))
    assert load_trainer_state(tmp_path)["global_step"] == 2  # the undamaged one loads
    before = random.getstate()
    for name, text in _damaged_docs():
        (tmp_path / "trainer_state.json").write_text(text)
        with pytest.raises(UserError, match="trainer_state.json is not a valid verl-npu trainer state") as err:
            load_trainer_state(tmp_path)
        assert "resume from another checkpoint" in str(err.value), name
    assert random.getstate() == before  # the checks tried throwaway generators only


@pytest.mark.slow
def test_resuming_a_checkpoint_of_another_model_size_names_it(tmp_path):
    from verl_npu.models.tiny import build_tiny_qwen2

    data = text_data(tmp_path / "data")
    out = tmp_path / "out"
    first = _cli(
        "run",
        "tiny_gsm8k",
        *text_run_overrides(out, data, **{"trainer.total_training_steps": 1, "trainer.save_freq": 1}),
    )
    assert first.returncode == 0, first.stderr[-2000:]
    wider = build_tiny_qwen2(tmp_path / "wider", intermediate_size=320)
    proc = _cli("run", "tiny_gsm8k", *text_run_overrides(out, data, **{"actor_rollout_ref.model.path": wider}))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "global_step_1/actor/model_world_size_1_rank_0.pt holds weights of another shape" in proc.stderr
    assert "(256, 128) vs (320, 128)" in proc.stderr and "trainer.resume_mode=disable" in proc.stderr


def test_a_checkpoint_of_another_architecture_is_named(tmp_path, monkeypatch):
    """Names that do not match at all (a text model's checkpoint into a vision-language model): torch's
    own error, turned into one naming the checkpoint."""
    from types import SimpleNamespace

    import torch

    from verl_npu.workers import actor_ckpt

    module = torch.nn.Linear(3, 2)
    worker = SimpleNamespace(
        module=module,
        optimizer=torch.optim.AdamW(module.parameters()),
        world_size=1,
        rank=0,
        checkpoint=None,
        peft_model=None,
    )
    folder = tmp_path / "global_step_1" / "actor"
    folder.mkdir(parents=True)
    torch.save({"other.weight": torch.zeros(2, 3)}, folder / "model_world_size_1_rank_0.pt")
    monkeypatch.setattr(actor_ckpt, "checkpoint_contents", lambda cfg: (["model"], ["model"]))
    with pytest.raises(UserError, match=r"checkpoint .*global_step_1/actor does not fit this run's model"):
        actor_ckpt.load_actor(worker, folder)


def test_an_unwritable_tiny_model_cache_is_named(tmp_path):
    from verl_npu.models.tiny import materialize

    a_file = tmp_path / "home"
    a_file.write_text("not a folder")
    with pytest.raises(UserError, match=r"cache folder .*home/cache is not writable .*set VERL_NPU_CACHE"):
        materialize("tiny://qwen2", cache_dir=a_file / "cache")


def test_unwritable_home_with_a_tiny_model_is_one_line_without_traceback(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path / "file" / "home"), "OMP_NUM_THREADS": "1"}
    env.pop("VERL_NPU_CACHE", None)
    (tmp_path / "file").write_text("a file where HOME's parent should be")
    proc = subprocess.run(
        [*CLI, "run", "tiny_gsm8k", *text_run_overrides(tmp_path / "out", text_data(tmp_path / "d"))],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "is not writable" in proc.stderr and "set VERL_NPU_CACHE to a writable folder" in proc.stderr


# ---- a reward finite in Python but infinite in float32 -----------------------------------------------
@pytest.mark.parametrize("score", [1e39, -3.5e38])
def test_a_reward_beyond_float32_is_named_with_the_row(score):
    from verl_npu.rewards import RewardScorer

    with pytest.raises(UserError, match=r"data file /d/t.parquet row 3 .*beyond what float32 holds") as err:
        RewardScorer(lambda *a, **k: score).score(["x"], ["s"], ["g"], [{}], rows=["data file /d/t.parquet row 3"])
    assert f"{score:g}" in str(err.value)
    assert RewardScorer(lambda *a, **k: 3.4e38).score(["x"], ["s"], ["g"])[0] == [3.4e38]  # still float32


# ---- updates that keep being skipped, weights that are not finite ------------------------------------
_HUGE_REWARD = """
calls = [0]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    calls[0] += 1
    return 3e38 * (calls[0] % 2)  # finite float32, but its advantages overflow the gradient norm
"""


def _diverging_run(tmp_path, limit: str, steps: int) -> tuple[subprocess.CompletedProcess, Path]:
    reward = tmp_path / "huge_reward.py"
    reward.write_text(_HUGE_REWARD)
    out = tmp_path / "out"
    proc = _cli(
        "run",
        "tiny_gsm8k",
        *text_run_overrides(
            out,
            text_data(tmp_path / "data"),
            **{
                "custom_reward_function.path": reward,
                "algorithm.norm_adv_by_std_in_grpo": "false",
                "trainer.total_training_steps": steps,
                "trainer.save_freq": 1,
                "trainer.max_consecutive_skipped_updates": limit,
            },
        ),
    )
    return proc, out


@pytest.mark.slow
def test_a_run_whose_updates_keep_being_skipped_stops_with_an_error(tmp_path):
    proc, out = _diverging_run(tmp_path, "2", 4)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert (
        "step 2: the last 2 optimizer steps of the actor were skipped for non-finite gradients "
        "(trainer.max_consecutive_skipped_updates=2)"
    ) in proc.stderr, proc.stderr[-3000:]
    assert "global_step_1, is intact" in proc.stderr
    assert [p.name for p in CheckpointManager(out / "checkpoints").list_complete()] == ["global_step_1"]


@pytest.mark.slow
def test_skipped_updates_are_counted_in_metrics_and_summary(tmp_path):
    import json

    proc, out = _diverging_run(tmp_path, "null", 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["actor/skipped_updates"] for r in rows if "actor/skipped_updates" in r] == [1.0, 1.0]
    assert [r["actor/skipped_updates_in_a_row"] for r in rows if "actor/skipped_updates" in r] == [1.0, 2.0]
    assert "actor optimizer steps skipped for a non-finite gradient: 2" in proc.stderr


def test_no_checkpoint_holds_a_non_finite_weight(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import torch

    from verl_npu.workers import actor_ckpt

    module = torch.nn.Linear(3, 2)
    with torch.no_grad():
        module.weight[0, 1] = float("nan")
    worker = SimpleNamespace(module=module, world_size=1, rank=0, checkpoint=None, torch_device=torch.device("cpu"))
    monkeypatch.setattr(actor_ckpt, "checkpoint_contents", lambda cfg: (["model"], ["model"]))
    target = tmp_path / ".tmp-step" / "actor"
    with pytest.raises(UserError, match=r"not saving .*actor: 1 weight tensor\(s\) of the actor hold non-finite"):
        actor_ckpt.save_actor(worker, target)
    assert not target.exists()


# ---- a checkpoint folder that is a link ------------------------------------------------------------
def test_rotation_removes_a_linked_checkpoint_link_once_and_keeps_its_folder(tmp_path, caplog):
    import logging

    from verl_npu.trainer.checkpoint import COMPLETE_FILE

    elsewhere = tmp_path / "kept_by_the_user" / "global_step_1"
    elsewhere.mkdir(parents=True)
    (elsewhere / "weights.bin").write_bytes(b"mine")
    (elsewhere / COMPLETE_FILE).write_text("")
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "global_step_1").symlink_to(elsewhere, target_is_directory=True)
    manager = CheckpointManager(root, max_to_keep=1)
    with caplog.at_level(logging.INFO, logger="verl_npu"):
        for step in (2, 3):
            manager.save(step, lambda d, s=step: (d / "w.bin").write_text(str(s)))
        CheckpointManager(root, max_to_keep=1)  # a restart's crash recovery finds nothing to restore
    assert [p.name for p in manager.list_complete()] == ["global_step_3"]
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []
    assert (elsewhere / "weights.bin").read_bytes() == b"mine"  # the user's folder is untouched
    removed = [r.getMessage() for r in caplog.records if "global_step_1" in r.getMessage()]
    assert len(removed) == 1 and "removed the link" in removed[0] and "left in place" in removed[0], removed
    assert not any("restored" in r.getMessage() for r in caplog.records)
