"""What a newcomer reads on the console (issue 27): where the run is, one validation block, and a plain
word when a finished run has nothing left to do."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from run_helpers import text_data, text_run_overrides

from verl_npu.trainer.tracking import format_console_line

CLI = [sys.executable, "-m", "verl_npu.cli"]


def _run(out, data) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    args = text_run_overrides(
        out, data, **{"trainer.total_training_steps": 2, "trainer.test_freq": 2, "trainer.save_freq": 2}
    )
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
    assert (
        format_console_line(metrics, 3, "step 3/10 | 2 s/step, 14s left")
        == "step 3/10 | 2 s/step, 14s left | score 0.5"
    )


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
        args = text_run_overrides(
            tmp_path / f"out_{device}",
            data,
            **{
                "trainer.device": device,
                "trainer.n_gpus_per_node": cores + 6,
                "data.train_batch_size": 8 * (cores + 6),
                "actor_rollout_ref.actor.ppo_mini_batch_size": 8 * (cores + 6),
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 1,
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 1,
            },
        )
        proc = subprocess.run([*CLI, "run", "tiny_gsm8k", *args], capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        assert (
            f"trainer.n_gpus_per_node={cores + 6} asks for {cores + 6} workers on this node, which has {cores} core(s)"
        ) in proc.stderr, proc.stderr[-3000:]
        assert extra in proc.stderr and f"set trainer.n_gpus_per_node to at most {cores}" in proc.stderr
        assert "Started a local Ray instance" not in proc.stderr
        assert time.monotonic() - start < 60


def _engine_needing(monkeypatch, package: str) -> None:
    """The vllm engine as if it needed ``package`` (a name no Python has): the real lookup, a known answer."""
    import dataclasses

    from verl_npu.registry import ROLLOUT_ENGINES

    spec = ROLLOUT_ENGINES.specs["vllm"]
    monkeypatch.setitem(ROLLOUT_ENGINES.specs, "vllm", dataclasses.replace(spec, package=package))


def test_a_missing_engine_package_and_an_unreachable_model_are_found_before_anything_loads(
    tmp_path, monkeypatch, capsys
):
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
        overrides = [
            "af_output_dir=" + str(tmp_path / "out"),
            "data.train_files=/nowhere/train.parquet",
            "data.val_files=/nowhere/test.parquet",
            "actor_rollout_ref.model.path=nobody/no-model",
        ]
        problems, notes = machine_problems(load_recipe("qwen25vl_geo3k", overrides))
        assert [p.key.removeprefix("backend_config.") for p in problems] == [
            "actor_rollout_ref.rollout.name",
            "actor_rollout_ref.model.path",
        ] and notes == []
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
    assert any("with a critic" in line for line in rules[len(naming) :]), rules


# ---- issue 40: the newcomer's path, round two ---------------------------------------------------------
def test_cpu_thread_policy_shares_the_allowed_cores_and_lets_the_user_choose(tmp_path, monkeypatch):
    """workers x threads stay within the cores the process may use (affinity, then a cgroup quota, not the
    machine's count); trainer.cpu_threads, then OMP_NUM_THREADS, win; an accelerator keeps torch's defaults;
    the variables every process gets keep a user's own values."""
    from verl_npu import device
    from verl_npu.device import DeviceInfo, allowed_cores

    affinity = len(os.sched_getaffinity(0))
    assert allowed_cores(str(tmp_path)) == (affinity, f"affinity {affinity}")  # no cgroup files: affinity
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert allowed_cores(str(tmp_path))[0] == affinity
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a core: rounded up to one
    assert allowed_cores(str(tmp_path)) == (1, f"affinity {affinity}, cgroup quota 0.5")

    monkeypatch.setattr(device, "allowed_cores", lambda: (4, "affinity 4"))
    cpu = DeviceInfo("cpu")
    assert cpu.thread_policy(1, env={}).intra_op == 4
    two = cpu.thread_policy(2, env={})
    assert (two.intra_op, two.inter_op, two.source) == (2, 1, "the allowed cores / workers")
    assert cpu.thread_policy(8, env={}).intra_op == 1  # never 0
    assert cpu.thread_policy(2, env={"OMP_NUM_THREADS": "3"}).source == "OMP_NUM_THREADS=3"
    chosen = cpu.thread_policy(2, requested=1, env={"OMP_NUM_THREADS": "3"})
    assert (chosen.intra_op, chosen.source) == (1, "trainer.cpu_threads=1")
    assert "more threads than cores" in cpu.thread_policy(2, requested=3, env={}).describe()
    assert (
        "1 intra-op + 1 inter-op thread(s) per process x 2 worker process(es) on 4 allowed core(s)" in chosen.describe()
    )
    assert DeviceInfo("cuda").thread_policy(2) is None and DeviceInfo("npu").before_torch() == []

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv("KMP_BLOCKTIME", "200")
    assert two.env() == {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "200", "OMP_NUM_THREADS": "2"}
    env = {"KMP_BLOCKTIME": "5"}
    assert device.set_passive_wait(env) == ["OMP_WAIT_POLICY"] and env["KMP_BLOCKTIME"] == "5"
    runtime = device.ray_runtime_env("cpu", env={}, threads=two)["env_vars"]
    assert runtime["OMP_NUM_THREADS"] == "2" and runtime["OMP_WAIT_POLICY"] == "PASSIVE"


def test_small_newcomer_messages(tmp_path, capsys):
    """One sentence is not a recipe; a wrong type reads as English; `list` never cuts a sentence; a run of
    empty lines in a shown answer is counted, not escaped a hundred times; `plan` works before the EDIT_ME
    fields are filled."""
    from verl_npu import cli
    from verl_npu.config import load_recipe
    from verl_npu.config.recipes import list_recipes
    from verl_npu.errors import ConfigErrors, UserError
    from verl_npu.trainer.readable import quoted_sample

    sentence = tmp_path / "mine.yaml"
    sentence.write_text("This is my recipe for geometry.\n")
    with pytest.raises(UserError, match="not a YAML mapping.*not a str"):
        load_recipe(str(sentence))
    with pytest.raises(ConfigErrors) as info:
        load_recipe("tiny_gsm8k", ["data.train_batch_size=abc"])
    text = str(info.value)
    assert (
        "must be an int, got 'abc'" in text
        and "set an int value (verl's default, used when the key is unset, is 1024)" in text
        and "e.g. the default" not in text
    )
    summaries = {r.name: r.summary for r in list_recipes()}
    assert summaries["qwen25_gsm8k_tool"].endswith("in the recipe format.")
    assert all(s.endswith((".", ")")) for s in summaries.values()), summaries
    assert quoted_sample("x" + "\n" * 57 + "y") == "'x [57 line breaks] y'"
    assert quoted_sample("#### 4\n") == "'#### 4\\n'"

    assert cli.main(["plan", "qwen25vl_geo3k"]) == 0
    out = capsys.readouterr().out
    assert "planning with the EDIT_ME fields still unfilled" in out and "memory plan per device" in out


def _rows_jsonl(path: Path, rows: int = 12) -> Path:
    """The rows of run_helpers.text_data, as JSON Lines."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for i in range(rows):
            fh.write(
                json.dumps(
                    {
                        "data_source": "openai/gsm8k",
                        "prompt": [{"role": "user", "content": f"What is {i} plus {i + 2}?"}],
                        "ability": "math",
                        "reward_model": {"style": "rule", "ground_truth": str(2 * i + 2)},
                        "extra_info": {"index": i},
                    }
                )
                + "\n"
            )
    return path


def test_data_in_other_formats_is_read_or_refused_at_validate_with_the_command(tmp_path, monkeypatch):
    """JSONL / JSON / CSV rows in verl's format pass `validate --check-paths`; a file that is not what its
    name says, or rows without verl's columns, are refused there naming the file; a missing demo file names
    the data_prep command that makes it; overriding one file of a demo keeps the demo's own other file."""
    import csv
    import json

    from verl_npu.config import load_recipe
    from verl_npu.config.paths import check_paths
    from verl_npu.config.row_files import read_rows

    monkeypatch.chdir(tmp_path)
    jsonl = _rows_jsonl(tmp_path / "rows.jsonl")
    rows = read_rows(jsonl)
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    with (tmp_path / "rows.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()} for r in rows)
    assert read_rows(tmp_path / "rows.csv") == read_rows(tmp_path / "rows.json") == rows
    (tmp_path / "fake.parquet").write_text("question,answer\n1+1,2\n")
    (tmp_path / "plain.csv").write_text("question,answer\n1+1,2\n")

    def problems(train: str, val: str) -> list[str]:
        rc = load_recipe("tiny_gsm8k", ["af_output_dir=out", f"data.train_files={train}", f"data.val_files={val}"])
        return [f"{p.key} {p.message} | {p.fix}" for p in check_paths(rc)]

    for name in ("rows.jsonl", "rows.json", "rows.csv"):
        assert problems(name, "rows.jsonl") == [], name
    bad = problems("fake.parquet", "plain.csv")
    assert "data.train_files data file 'fake.parquet' is not a parquet file" in bad[0]
    assert "data.val_files data file 'plain.csv' has no column 'prompt', 'data_source', 'reward_model'" in bad[1]
    missing = problems("rows.jsonl", "data/tiny_gsm8k/test.parquet")
    assert (
        len(missing) == 1
        and "make it with `python data_prep/gsm8k.py --synthetic 512 --local-save-dir data/tiny_gsm8k`" in missing[0]
    ), missing

    from verl_npu import demo

    monkeypatch.setattr(demo, "DEMO_TRAIN_ROWS", 16)
    rc = load_recipe("tiny_gsm8k", ["af_output_dir=out", f"data.train_files={jsonl}"])  # the demo's own val file
    assert any("synthetic arithmetic data" in line for line in demo.prepare_assets(rc))
    assert sorted(p.name for p in (tmp_path / "data" / "tiny_gsm8k").iterdir()) == ["test.parquet"]
    assert check_paths(rc) == []


def test_a_ctrl_c_that_stops_at_once_says_what_is_lost_and_never_claims_a_missing_checkpoint(tmp_path):
    import signal as sig

    from verl_npu.trainer import preempt
    from verl_npu.trainer.checkpoint import CheckpointManager
    from verl_npu.trainer.entry import _interrupted_message

    empty = CheckpointManager(tmp_path / "ckpt")
    text = _interrupted_message(empty, 7)
    assert "steps 1-7 are lost" in text and f"there is no complete checkpoint in {tmp_path / 'ckpt'}" in text
    assert "intact" not in text
    assert "no training step was lost" in _interrupted_message(empty, None)

    preempt.reset()
    preempt.set_phase("training")
    preempt._on_sigint(sig.SIGINT, None)  # the first: finish the step, save, stop
    assert preempt.stop_requested() == sig.SIGINT
    with pytest.raises(KeyboardInterrupt):  # the second: at once
        preempt._on_sigint(sig.SIGINT, None)
    preempt._on_sigint(sig.SIGINT, None)  # later ones let the cleanup finish
    preempt.reset()


def _metrics(out: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_ctrl_c_saves_the_step_and_the_rerun_resumes_there_from_another_folder_on_jsonl_data(tmp_path):
    """A newcomer's run from a folder of their own, on a JSONL file, with relative paths: the first Ctrl-C
    finishes the step, saves it and names the checkpoint (absolute); the same command resumes at that step
    and appends to metrics.jsonl; everything is written under that folder."""
    import signal as sig
    import time

    here = tmp_path / "elsewhere"
    _rows_jsonl(here / "mydata" / "rows.jsonl")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("RAY_ADDRESS", None)

    def command(steps: int) -> list[str]:
        args = text_run_overrides(
            tmp_path / "out",
            tmp_path,
            **{  # relative paths: from `here`
                "af_output_dir": "out",
                "data.train_files": "mydata/rows.jsonl",
                "data.val_files": "mydata/rows.jsonl",
                "trainer.total_training_steps": steps,
                "trainer.val_before_train": "false",
                "custom_reward_function.path": "null",
            },
        )
        return [*CLI, "run", "tiny_gsm8k", *args]

    proc = subprocess.Popen(
        command(200), cwd=here, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 240
        while not ((here / "out" / "metrics.jsonl").is_file() and len(_metrics(here / "out")) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.2)
        proc.send_signal(sig.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output[-3000:]
    assert "Ctrl-C: finishing the current step, then saving a checkpoint" in output and "Traceback" not in output
    saved = re.search(r"stopped by Ctrl-C \(SIGINT\) after step (\d+) of \d+: saved checkpoint (\S+)\. Rerun", output)
    assert saved, output[-3000:]
    step = int(saved.group(1))
    assert saved.group(2) == str(here / "out" / "checkpoints" / f"global_step_{step}")
    assert f"output folder: {here / 'out'} (relative paths start at the current folder, {here})" in output
    before = _metrics(here / "out")
    assert [r["step"] for r in before] == list(range(1, step + 1))

    again = subprocess.run(command(step + 1), cwd=here, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {here / 'out' / 'checkpoints' / f'global_step_{step}'} at step {step}" in again.stderr
    after = _metrics(here / "out")
    assert [r["step"] for r in after] == list(range(1, step + 2)) and after[:step] == before  # appended
    assert f"summary of the run in {here / 'out'}:" in again.stderr
    assert sorted(p.name for p in here.iterdir()) == ["mydata", "out"]  # nothing else written where the user is


@pytest.mark.slow
def test_a_two_worker_cpu_run_prints_no_native_crash_and_no_escape_codes(tmp_path):
    data = text_data(tmp_path / "data")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    args = text_run_overrides(
        tmp_path / "out",
        data,
        **{
            "trainer.total_training_steps": 1,
            "trainer.n_gpus_per_node": 2,
            "ray_init.num_cpus": 2,
            "trainer.device": "cpu",
        },
    )
    proc = subprocess.run([*CLI, "run", "tiny_gsm8k", *args], capture_output=True, text=True, timeout=400, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "done: 1 steps" in output
    for noise in ("SIGABRT", "Fatal Python error", "Mutex corrupt", "\x1b["):
        assert noise not in output, (noise, output[-3000:])
    assert "cpu threads: 1 intra-op + 1 inter-op thread(s) per process x 2 worker process(es)" in output


def test_the_curves_draw_the_blind_ceiling_with_words_in_the_legend():
    from verl_npu.trainer.tracking import curve_panels

    rows = [{"step": 1, "critic/score/mean": 0.1, "val-core/synthetic_geometry/reward/mean@1": 0.2}]
    panels, ceilings = curve_panels(rows)
    labels = [label for _, series in panels for _, label in series]
    assert "validation reward (synthetic_geometry)" in labels and not any("val-core/" in x for x in labels)
    assert ("response length (tokens)", [("response_length/mean", "mean response length (tokens)")]) in panels
    assert ceilings == [(0.25, "blind ceiling 0.25: a policy ignoring the picture")]
    assert curve_panels(rows, builtin_rewards=False)[1] == []
