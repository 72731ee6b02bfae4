"""Shared fixtures: tiny models built locally once per test session (no download), the picture demo's data."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# tests/ mirrors the package (tests/config/, tests/rollout/, ...; tests/e2e/ for whole runs); the shared helpers
# live in tests/helpers/. Every folder goes on sys.path so a test imports a helper (`from run_helpers import ...`)
# or another test file's builders by module name, whichever folder it sits in (file names are unique), and
# processes spawned by a test inherit the path.
_TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(_TESTS / "helpers")] + sorted(
    str(folder) for folder in _TESTS.iterdir() if folder.is_dir() and any(folder.glob("test_*.py"))
)

# 2-core CI machines: one intra-op thread per process keeps parallel helpers from thrashing.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The hub is not reachable from tests: hub ids resolve from a local cache only, nothing is downloaded.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("verl_npu_cache")
    os.environ["VERL_NPU_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def tiny_vl_path(tiny_cache):
    from verl_npu.models.tiny import materialize

    return materialize("tiny://qwen25vl", cache_dir=tiny_cache)


@pytest.fixture(scope="session")
def tiny_lm_path(tiny_cache):
    from verl_npu.models.tiny import materialize

    return materialize("tiny://qwen2", cache_dir=tiny_cache)


@pytest.fixture(scope="module")
def geo_data(tmp_path_factory):
    """Synthetic picture data (the tiny_geo3k demo's generator): 8 train and 4 test rows, 56-pixel images; a
    module that needs other sizes defines its own."""
    from verl_npu.data.geometry3k import prepare_synthetic

    folder = tmp_path_factory.mktemp("geo")
    prepare_synthetic(folder, n_train=8, n_test=4, seed=0, image_size=56)
    return folder
