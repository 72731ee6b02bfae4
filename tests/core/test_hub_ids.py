"""Hugging Face hub ids as model paths, resolved offline from a real cache layout (HF_HUB_OFFLINE=1:
these tests never reach the network)."""

from __future__ import annotations

import shutil

import pytest
import torch
from test_cli import cli

from verl_npu.errors import UserError
from verl_npu.hub import hub_folder, looks_like_hub_id
from verl_npu.models.loading import load_policy_model, load_tokenizer_and_processor, resolve_model_path

MODEL_ID = "tiny-org/tiny-qwen2"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, tiny_lm_path, monkeypatch):
    """A hub cache holding the tiny Qwen2 as `tiny-org/tiny-qwen2` (refs/main -> snapshots/COMMIT),
    made the cache of this process, offline."""
    cache = tmp_path / "hf" / "hub"
    repo = cache / "models--tiny-org--tiny-qwen2"
    shutil.copytree(tiny_lm_path, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.mark.parametrize(
    "value,expected",
    [
        ("Qwen/Qwen2.5-VL-7B-Instruct", True),
        ("owner/name@main", True),
        ("a/b", True),
        ("/abs/path", False),
        ("./rel/x", False),
        ("~/models/x", False),
        ("tiny://qwen2", False),
        ("models/Qwen/x", False),
        ("../up", False),
        ("owner/a--b", False),
        ("name", False),
        (None, False),
    ],
)
def test_looks_like_hub_id(value, expected):
    assert looks_like_hub_id(value) is expected


def test_hub_id_resolves_offline_and_loads(hub_cache):
    snapshot = hub_cache / "models--tiny-org--tiny-qwen2" / "snapshots" / COMMIT
    assert hub_folder(MODEL_ID) == (snapshot, "cache")
    assert hub_folder(f"{MODEL_ID}@{COMMIT}")[0] == snapshot
    assert resolve_model_path(MODEL_ID) == str(snapshot)
    tokenizer, processor = load_tokenizer_and_processor(MODEL_ID)
    assert processor is None and len(tokenizer) > 16
    model = load_policy_model(MODEL_ID, dtype=torch.float32)
    assert model.config.model_type == "qwen2"


def test_local_folder_wins_over_hub_id(hub_cache, tmp_path, monkeypatch, tiny_lm_path):
    shutil.copytree(tiny_lm_path, tmp_path / "work" / MODEL_ID)
    monkeypatch.chdir(tmp_path / "work")
    assert resolve_model_path(MODEL_ID) == MODEL_ID


def test_missing_hub_id_is_a_plain_error(hub_cache):
    with pytest.raises(UserError) as err:
        resolve_model_path("nobody/missing-model")
    text = str(err.value)
    assert "'nobody/missing-model'" in text and str(hub_cache) in text
    assert "hf download nobody/missing-model" in text and "HF_HUB_OFFLINE" in text


def _check_paths_args(tmp_path, model):
    for name in ("train.parquet", "test.parquet"):
        (tmp_path / name).write_bytes(b"PAR1")  # the magic bytes --check-paths reads
    return [
        "validate",
        "qwen25_gsm8k",
        f"af_output_dir={tmp_path / 'out'}",
        f"data.train_files={tmp_path / 'train.parquet'}",
        f"data.val_files={tmp_path / 'test.parquet'}",
        f"actor_rollout_ref.model.path={model}",
        "--check-paths",
    ]


def test_validate_check_paths_resolves_a_cached_hub_id(hub_cache, tmp_path):
    out = cli(*_check_paths_args(tmp_path, MODEL_ID))
    assert out.returncode == 0, out.stderr
    snapshot = hub_cache / "models--tiny-org--tiny-qwen2" / "snapshots" / COMMIT
    assert f"actor_rollout_ref.model.path = {snapshot}" in out.stdout and MODEL_ID in out.stdout


def test_validate_check_paths_reports_a_missing_hub_id(hub_cache, tmp_path):
    out = cli(*_check_paths_args(tmp_path, "nobody/missing-model"))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "backend_config.actor_rollout_ref.model.path" in out.stderr and "'nobody/missing-model'" in out.stderr
    assert str(hub_cache) in out.stderr and "hf download nobody/missing-model" in out.stderr


def test_resolved_config_names_the_snapshot_folder(hub_cache, tmp_path):
    from verl_npu.config import load_recipe

    args = _check_paths_args(tmp_path, MODEL_ID)[1:-1]
    rc = load_recipe(args[0], args[1:], check_paths=True)
    snapshot = hub_cache / "models--tiny-org--tiny-qwen2" / "snapshots" / COMMIT
    assert rc.backend.actor_rollout_ref.model.path == str(snapshot)
    assert f"# derived: hub id {MODEL_ID} found in the Hugging Face cache" in rc.to_yaml()


def test_config_rules_read_a_cached_hub_id_without_check_paths(hub_cache, tmp_path):
    from verl_npu.config import load_recipe
    from verl_npu.errors import ConfigErrors

    args = _check_paths_args(tmp_path, MODEL_ID)[1:-1]
    with pytest.raises(ConfigErrors, match=r"model's limit 4096 \(max_position_embeddings=4096"):
        load_recipe(args[0], [*args[1:], "data.max_prompt_length=1024", "data.max_response_length=8192"])


def test_run_stops_before_any_worker_on_a_missing_hub_id(hub_cache, tmp_path):
    args = _check_paths_args(tmp_path, "nobody/missing-model")
    out = cli("run", *args[1:-1])
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "'nobody/missing-model'" in out.stderr and str(hub_cache) in out.stderr
    assert "starting training" not in out.stdout


def test_check_paths_does_not_look_up_a_key_already_refused(hub_cache, tmp_path, monkeypatch):
    """`run` refuses an unreachable hub id in machine_problems first; check_paths then skips that key
    instead of asking the hub a second time (one probe per run)."""
    import verl_npu.hub
    from verl_npu.config import load_recipe
    from verl_npu.config.paths import check_paths

    args = _check_paths_args(tmp_path, "nobody/missing-model")[1:-1]
    rc = load_recipe(args[0], args[1:])
    key = "backend_config.actor_rollout_ref.model.path"
    looked_up = []
    monkeypatch.setattr(
        verl_npu.hub,
        "hub_folder",
        lambda *a, **k: looked_up.append(a) or (_ for _ in ()).throw(AssertionError("looked up again")),
    )
    assert all(p.key != key for p in check_paths(rc, skip={key})) and looked_up == []
    with pytest.raises(AssertionError, match="looked up again"):
        check_paths(rc)
