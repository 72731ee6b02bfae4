"""Hugging Face hub ids as actor_rollout_ref.model.path (issue 9): a model in the local Hugging Face
cache (huggingface_hub's layout, a temporary HF_HOME) resolves by id offline, for `validate
--check-paths` and `run`; an id that is neither cached nor downloadable is a plain error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from run_helpers import text_data

from verl_npu.cli import main
from verl_npu.config import load_recipe
from verl_npu.errors import UserError
from verl_npu.models.loading import load_config, resolve_model_path
from verl_npu.trainer.entry import run_training

REPO_ID = "tiny-org/tiny-qwen2"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hf_home(tmp_path, tiny_lm_path, monkeypatch):
    """A Hugging Face cache holding the tiny text model as REPO_ID (refs/main -> snapshots/COMMIT),
    the hub switched off (HF_HUB_OFFLINE=1)."""
    home = tmp_path / "hf_home"
    repo = home / "hub" / f"models--{REPO_ID.replace('/', '--')}"
    shutil.copytree(tiny_lm_path, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


def test_a_cached_hub_id_resolves_offline(hf_home):
    local = resolve_model_path(REPO_ID)
    assert Path(local) == hf_home / "hub" / "models--tiny-org--tiny-qwen2" / "snapshots" / COMMIT
    assert load_config(REPO_ID).model_type == "qwen2"


def test_an_uncached_hub_id_offline_is_a_plain_error(hf_home, capsys):
    with pytest.raises(UserError) as info:
        resolve_model_path("tiny-org/not-there")
    text = str(info.value)
    assert "'tiny-org/not-there'" in text and str(hf_home / "hub") in text and "HF_HUB_OFFLINE" in text
    assert "huggingface-cli download tiny-org/not-there" in text and "--local-dir DIR" in text


def _overrides(tmp_path: Path, model: str) -> list[str]:
    data = text_data(tmp_path / "data", rows=4)
    values = {"af_output_dir": tmp_path / "out", "actor_rollout_ref.model.path": model,
              "data.train_files": data / "train.parquet", "data.val_files": data / "test.parquet",
              "data.train_batch_size": 2, "data.max_response_length": 3, "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2, "actor_rollout_ref.rollout.n": 2,
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
              "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4, "trainer.total_training_steps": 1,
              "trainer.save_freq": -1, "trainer.test_freq": -1, "trainer.val_before_train": "false",
              "trainer.logger": "[console]"}
    return [f"{k}={v}" for k, v in values.items()]


def test_validate_check_paths_and_run_take_a_cached_hub_id(hf_home, tmp_path, capsys):
    assert main(["validate", "tiny_gsm8k", *_overrides(tmp_path, REPO_ID), "--check-paths"]) == 0
    assert main(["validate", "tiny_gsm8k", *_overrides(tmp_path, "tiny-org/not-there"), "--check-paths"]) == 1
    err = capsys.readouterr().err
    assert "actor_rollout_ref.model.path" in err and "tiny-org/not-there" in err and "Traceback" not in err
    assert run_training(load_recipe("tiny_gsm8k", _overrides(tmp_path, REPO_ID))) == 0
    assert (tmp_path / "out" / "metrics.jsonl").read_text().strip()
