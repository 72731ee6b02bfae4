"""The CLI verbs and the launcher, run as a user runs them (subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from run_helpers import cli_env

REPO = Path(__file__).resolve().parents[2]
FILLED = [
    "af_output_dir=out",
    "data.train_files=/nonexistent/geo3k/train.parquet",
    "data.val_files=/nonexistent/geo3k/test.parquet",
    "actor_rollout_ref.model.path=/nonexistent/Qwen2.5-VL-7B-Instruct",
]


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "verl_npu.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        env=cli_env(),
        timeout=120,
    )


def test_list():
    out = cli("list")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert any(l.startswith("qwen25vl_geo3k ") and "Geometry3K" in l for l in lines)
    assert any(l.startswith("qwen25_gsm8k ") for l in lines)


def test_validate_valid_prints_a_summary():
    out = cli("validate", "qwen25vl_geo3k", *FILLED)
    assert out.returncode == 0, out.stderr
    assert "valid" in out.stdout
    assert "responses per step: 128" in out.stdout
    assert "gradient-accumulation steps per update: 4" in out.stdout
    assert "actor_rollout_ref.rollout.max_num_batched_tokens = 8192" in out.stdout
    # the flagship's TP 4 on 8 devices: two engines, each sampling half the prompts
    assert "rollout: 2 vllm engine(s) of tensor_model_parallel_size 4, 16 prompts each per step" in out.stdout


def test_validate_counts_steps_from_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    train = tmp_path / "train.parquet"
    pq.write_table(pa.table({"x": list(range(100))}), train)
    out = cli("validate", "qwen25vl_geo3k", *FILLED, f"data.train_files={train}")
    assert out.returncode == 0, out.stderr
    assert "steps per epoch: 3" in out.stdout


def test_validate_invalid_lists_every_problem_without_traceback():
    out = cli("validate", "qwen25vl_geo3k", "data.truncation=cut", "actor_rollout_ref.rollout.n=1")
    assert out.returncode == 1
    for key in (
        "af_output_dir",
        "backend_config.data.train_files",
        "backend_config.data.val_files",
        "backend_config.actor_rollout_ref.model.path",
        "backend_config.data.truncation",
        "backend_config.actor_rollout_ref.rollout.n",
    ):
        assert key in out.stderr
    assert "Traceback" not in out.stderr


def test_validate_check_paths_names_missing_files():
    out = cli("validate", "qwen25vl_geo3k", *FILLED, "--check-paths")
    assert out.returncode == 1 and "backend_config.data.train_files" in out.stderr and "Traceback" not in out.stderr


def test_flags_may_come_before_or_between_the_overrides():
    """`--check-paths` (or `run`'s `--demo-data`) before the overrides: every override is still read
    (the missing paths are named), and an unknown flag is still refused."""
    out = cli("validate", "qwen25vl_geo3k", "--check-paths", *FILLED)
    assert out.returncode == 1 and "Traceback" not in out.stderr and "unrecognized arguments" not in out.stderr
    assert "backend_config.data.train_files" in out.stderr  # the paths were checked: the flag was read
    out = cli("validate", "qwen25vl_geo3k", *FILLED[:2], "--check-paths", *FILLED[2:], "data.truncation=cut")
    assert out.returncode == 1 and "backend_config.data.truncation" in out.stderr  # overrides after it too
    out = cli("validate", "qwen25vl_geo3k", *FILLED, "--no-such-flag")
    assert out.returncode == 2 and "unrecognized arguments: --no-such-flag" in out.stderr


def test_bad_yaml_missing_file_and_bad_override_have_no_traceback(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("backend_config: {data: [\n")
    for args in (
        ("validate", bad),
        ("show", bad),
        ("validate", tmp_path / "missing.yaml"),
        ("validate", "no_such_recipe"),
        ("validate", "qwen25vl_geo3k", "notanoverride"),
        ("explain", "data.nope"),
    ):
        out = cli(*args)
        assert out.returncode == 1, args
        assert "Traceback" not in out.stderr and out.stderr.startswith("error: "), out.stderr
    assert "broken.yaml" in cli("validate", bad).stderr
    assert "missing.yaml" in cli("validate", tmp_path / "missing.yaml").stderr


def test_show_prints_resolved_yaml_with_derived_marks():
    out = cli("show", "qwen25vl_geo3k", *FILLED, "data.max_response_length=16384")
    assert out.returncode == 0, out.stderr
    data = yaml.safe_load(out.stdout)
    assert data["backend_config"]["actor_rollout_ref"]["rollout"]["max_num_batched_tokens"] == 17408
    assert any("max_num_batched_tokens: 17408  # derived:" in l for l in out.stdout.splitlines())


def test_explain_short_full_and_section():
    short = cli("explain", "data.max_prompt_length")
    full = cli("explain", "backend_config.data.max_prompt_length")
    assert short.returncode == 0 and short.stdout == full.stdout
    assert "default: 512" in short.stdout and "type: int" in short.stdout and "rules:" in short.stdout
    section = cli("explain", "algorithm.kl_ctrl")
    assert section.returncode == 0 and "algorithm.kl_ctrl.target_kl" in section.stdout
    dep = cli("explain", "actor_rollout_ref.actor.ppo_micro_batch_size")
    assert (
        dep.returncode == 0 and "ppo_micro_batch_size_per_gpu" in dep.stdout
    )  # accepted, mapped (verl 0.9.1 reads it)
    everything = cli("explain", "--all")
    assert everything.returncode == 0
    assert everything.stdout == (REPO / "docs" / "config_reference.md").read_text()


def test_cp_refuses_to_overwrite_and_lists_fields(tmp_path):
    out = cli("cp", "qwen25vl_geo3k", "mine.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "mine.yaml").is_file()
    for key in (
        "af_output_dir",
        "backend_config.data.train_files",
        "backend_config.data.val_files",
        "backend_config.actor_rollout_ref.model.path",
    ):
        assert key in out.stdout
    again = cli("cp", "qwen25vl_geo3k", "mine.yaml", cwd=tmp_path)
    assert again.returncode == 1 and "already exists" in again.stderr and "Traceback" not in again.stderr


def test_run_stops_on_missing_files_before_training(tmp_path):
    out = cli("run", "qwen25vl_geo3k", *FILLED, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "configuration valid" in out.stdout
    assert "backend_config.data.train_files" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists()


def _launch(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "launch" / "run_recipe.sh"), *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        env=env or dict(cli_env(), VERL_NPU_PYTHON=sys.executable),
        timeout=120,
    )


def test_launcher_preflight_names_missing_fields(tmp_path):
    out = _launch("qwen25vl_geo3k", cwd=tmp_path)
    assert out.returncode == 1
    assert "verl_npu.cli run qwen25vl_geo3k" in out.stdout
    for key in (
        "af_output_dir",
        "backend_config.data.train_files",
        "backend_config.data.val_files",
        "backend_config.actor_rollout_ref.model.path",
    ):
        assert key in out.stderr
    assert "Traceback" not in out.stderr


def test_launcher_passes_overrides_and_needs_a_recipe(tmp_path):
    out = _launch("qwen25vl_geo3k", *FILLED, "data.truncation=cut", cwd=tmp_path)
    assert out.returncode == 1 and "backend_config.data.truncation" in out.stderr
    assert "af_output_dir:" not in out.stderr  # the supplied fields are accepted
    usage = _launch(cwd=tmp_path)
    assert usage.returncode == 2 and "usage" in usage.stderr


def test_run_keeps_sigpipe_ignored_other_verbs_restore_the_default(monkeypatch):
    """`run` and `sft` leave Python's SIGPIPE handling (ignored: a closed socket raises BrokenPipeError instead of
    killing the training); the printing verbs take the default while they print, so `... | head` ends quietly,
    and put the caller's own back when they return (a test or notebook calling main() keeps its own)."""
    import signal

    from verl_npu import cli as cli_module

    before = signal.getsignal(signal.SIGPIPE)
    seen = []
    real_run_command = cli_module.run_command
    monkeypatch.setattr(
        cli_module, "run_command", lambda fn: seen.append(signal.getsignal(signal.SIGPIPE)) or real_run_command(fn)
    )
    try:
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        assert cli_module.main(["run", "no_such_recipe_xyz"]) != 0  # refused fast: no recipe of that name
        assert cli_module.main(["sft", "no_such_recipe_xyz"]) != 0
        assert cli_module.main(["list"]) == 0
        assert seen == [signal.SIG_IGN, signal.SIG_IGN, signal.SIG_DFL]
        assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN  # the caller's own, put back
    finally:
        signal.signal(signal.SIGPIPE, before)
