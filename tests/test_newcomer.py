"""What a newcomer reads on the console (issue 27): where the run is, one validation block, and a plain
word when a finished run has nothing left to do."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from run_helpers import text_data, text_run_overrides
from verl_npu.trainer.tracking import format_console_line

CLI = [sys.executable, "-m", "verl_npu.cli"]


def _run(out, data) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    args = text_run_overrides(out, data, **{"trainer.total_training_steps": 2, "trainer.test_freq": 2,
                                            "trainer.save_freq": 2})
    return subprocess.run([*CLI, "run", "tiny_gsm8k", *args], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_step_lines_show_progress_one_validation_block_and_a_finished_run_says_so(tmp_path):
    data = text_data(tmp_path / "data")
    out = tmp_path / "out"
    first = _run(out, data)
    assert first.returncode == 0, first.stderr[-3000:]
    steps = [line for line in first.stderr.splitlines() if re.search(r"INFO step \d", line)]
    assert len(steps) == 2, first.stderr[-3000:]
    assert re.search(r"INFO step 1/2 \| [0-9.e+-]+ s/step, \d+s left \| score ", steps[0]), steps[0]
    assert re.search(r"INFO step 2/2 \| [0-9.e+-]+ s/step, 0s left \| ", steps[1]), steps[1]
    assert first.stderr.count("[val/generations] step 2:") == 1  # printed once, not once per sink
    assert "validation generations at step" not in first.stderr
    assert "done: 2 steps" in first.stderr
    for noise in ("Loading weights", "Writing model shards", "past_key_values", "FutureWarning"):
        assert noise not in first.stderr, noise  # transformers' bars and deprecations stay off the console

    again = _run(out, data)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"nothing to do: the run in {out} is already complete at step 2 of 2" in again.stderr
    assert "raise trainer.total_training_steps" in again.stderr and "trainer.resume_mode=disable" in again.stderr
    assert "last mean score n/a" not in again.stderr and "done:" not in again.stderr
    assert not re.search(r"INFO step \d", again.stderr)


def test_console_line_progress_replaces_the_bare_step():
    metrics = {"critic/score/mean": 0.5}
    assert format_console_line(metrics, 3) == "step 3 | score 0.5"
    assert format_console_line(metrics, 3, "step 3/10 | 2 s/step, 14s left") == "step 3/10 | 2 s/step, 14s left | score 0.5"


def test_more_workers_than_this_machine_has_is_refused_at_once(tmp_path):
    """A recipe for 8 accelerators on a machine without one (trainer.device null falls back to the CPU),
    and 4 CPU workers on fewer cores: one line naming the key, before any model, data or Ray, not a
    ten-minute wait for resources."""
    import time

    data = text_data(tmp_path / "data")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    cores = os.cpu_count() or 1
    for device, extra in (("null", "no GPU or NPU was found"), ("cpu", "")):
        start = time.monotonic()
        args = text_run_overrides(tmp_path / f"out_{device}", data, **{
            "trainer.device": device, "trainer.n_gpus_per_node": cores + 6,
            "data.train_batch_size": 8 * (cores + 6), "actor_rollout_ref.actor.ppo_mini_batch_size": 8 * (cores + 6),
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 1})
        proc = subprocess.run([*CLI, "run", "tiny_gsm8k", *args], capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        assert (f"trainer.n_gpus_per_node={cores + 6} asks for {cores + 6} workers on this node, which has {cores} "
                f"core(s)") in proc.stderr, proc.stderr[-3000:]
        assert extra in proc.stderr and f"set trainer.n_gpus_per_node to at most {cores}" in proc.stderr
        assert "Started a local Ray instance" not in proc.stderr
        assert time.monotonic() - start < 60


def _engine_needing(monkeypatch, package: str) -> None:
    """The vllm engine as if it needed ``package`` (a name no Python has): the real lookup, a known answer."""
    import dataclasses

    from verl_npu.registry import ROLLOUT_ENGINES

    spec = ROLLOUT_ENGINES.specs["vllm"]
    monkeypatch.setitem(ROLLOUT_ENGINES.specs, "vllm", dataclasses.replace(spec, package=package))


def test_a_missing_engine_package_and_an_unreachable_model_are_found_before_anything_loads(tmp_path, monkeypatch,
                                                                                             capsys):
    """`validate` warns (the config may be meant for another machine); `run` refuses both at once, before any
    data is made, model loaded or Ray started; a hub id that is cached or a local folder is fine."""
    import socket

    from verl_npu import cli
    from verl_npu.config import load_recipe
    from verl_npu.config.paths import machine_problems

    _engine_needing(monkeypatch, "no_such_engine_package_xyz")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed.getsockname()[1]}")
        overrides = ["af_output_dir=" + str(tmp_path / "out"), "data.train_files=/nowhere/train.parquet",
                     "data.val_files=/nowhere/test.parquet", "actor_rollout_ref.model.path=nobody/no-model"]
        problems, notes = machine_problems(load_recipe("qwen25vl_geo3k", overrides))
        assert [p.key.removeprefix("backend_config.") for p in problems] == [
            "actor_rollout_ref.rollout.name", "actor_rollout_ref.model.path"] and notes == []
        assert "no_such_engine_package_xyz package is not installed" in problems[0].message
        assert "actor_rollout_ref.rollout.name=hf" in problems[0].fix
        assert "the hub cannot be reached: no connection to 127.0.0.1" in problems[1].message

        assert cli.main(["validate", "qwen25vl_geo3k", *overrides]) == 0
        out = capsys.readouterr().out
        assert out.count("warning: this machine cannot run it as it is:") == 2, out

        assert cli.main(["run", "qwen25vl_geo3k", *overrides]) == 1
        err = capsys.readouterr().err
        assert "actor_rollout_ref.rollout.name: 'vllm': the no_such_engine_package_xyz package" in err, err
        assert "actor_rollout_ref.model.path: 'nobody/no-model'" in err and "data.train_files" in err
        assert "Traceback" not in err and not (tmp_path / "out").exists()

    _engine_needing(monkeypatch, "json")  # an installed package: no problem
    local = ["actor_rollout_ref.model.path=" + str(tmp_path)]
    assert machine_problems(load_recipe("qwen25vl_geo3k", [*overrides, *local])) == ([], [])


def test_explain_lists_the_rules_that_name_the_key_first():
    """`explain data.max_prompt_length` opens with the length rules, not the critic's batch rule that reads
    the key only through the token budgets."""
    from verl_npu.config import describe_key, find_key

    text = describe_key(find_key("data.max_prompt_length"))
    rules = text.split("  rules:\n", 1)[1].splitlines()
    naming = [i for i, line in enumerate(rules) if "max_prompt_length" in line]
    assert naming and naming == list(range(len(naming))), rules
    assert any("with a critic" in line for line in rules[len(naming):]), rules
