"""Shared fixtures: tiny models built locally once per test session (no download)."""

from __future__ import annotations

import os

import pytest

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
