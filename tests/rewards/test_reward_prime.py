"""The `prime` reward manager (issue 39): a batch's responses scored in parallel worker processes, a response
whose reward call hangs or raises scoring 0 within its deadline while the others are scored; selected by every
spelling verl uses for the manager's name, through the registry's spec."""

from __future__ import annotations

import os
import time

import pytest

from verl_npu.config import load_recipe
from verl_npu.registry import REWARD_MANAGERS
from verl_npu.rewards.prime import ParallelRewardScorer, prime_scores, read_result

REWARD = """
import os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source == "meet":   # ground_truth: a folder; wait (up to 30 s) until 2 calls are in it at once
        open(os.path.join(ground_truth, solution_str), "w").close()
        deadline = time.monotonic() + 30
        while len(os.listdir(ground_truth)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"score": float(len(os.listdir(ground_truth)) >= 2), "pid": float(os.getpid())}
    if data_source == "hang":
        with open(ground_truth, "w") as f:   # where the hung call's worker process is, and when it started
            f.write(f"{os.getpid()} {time.monotonic()}")
        while True:
            time.sleep(0.1)
    if data_source == "exit":
        os._exit(3)   # a reward that ends its worker process
    if data_source == "raise":
        raise RuntimeError("a broken scorer")
    if data_source == "text":
        return "not a number"
    if data_source == "tuple":
        return (0.25, "details")
    time.sleep(0.3)
    return float(solution_str == ground_truth)
"""


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prime") / "reward.py"
    path.write_text(REWARD)
    return str(path)


@pytest.fixture(scope="module")
def scorer(reward_file):
    s = ParallelRewardScorer({"path": reward_file, "name": "compute_score"}, num_processes=2, timeout_s=2.0)
    yield s
    s.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_responses_are_scored_in_parallel_worker_processes(reward_file, tmp_path):
    """Each call waits until two calls are running at once: run one after another they never would (the first
    would give up after 30 s and score 0)."""
    s = ParallelRewardScorer({"path": reward_file, "name": "compute_score"}, num_processes=2, timeout_s=60.0)
    try:
        scores, extras = s.score(["a", "b"], ["meet"] * 2, [str(tmp_path)] * 2)
    finally:
        s.close()
    assert scores == [1.0, 1.0]
    pids = {int(p) for p in extras["pid"]}
    assert len(pids) == 2 and os.getpid() not in pids
    assert extras["prime_timeout"] == [0.0] * 2 and extras["prime_error"] == [0.0] * 2


def test_a_hanging_reward_scores_0_within_the_timeout_and_the_others_are_scored(scorer, tmp_path):
    where = tmp_path / "hung_pid"
    scores, extras = scorer.score(
        ["a", "zzz", "b", "c", "d", "e"],
        ["ok", "hang", "ok", "raise", "text", "tuple"],
        ["a", str(where), "b", "c", "d", "e"],
    )
    returned = time.monotonic()  # one clock for all processes (CLOCK_MONOTONIC)
    assert scores == [1.0, 0.0, 1.0, 0.0, 0.0, 0.25]
    assert extras["prime_timeout"] == [0, 1, 0, 0, 0, 0]
    assert extras["prime_error"] == [0, 0, 0, 1, 1, 0]
    # the hung call is abandoned at its 2 s deadline (counted from its start), its worker ended, and the batch
    # returned (the others were scored by the other worker meanwhile)
    hung, started = where.read_text().split()
    assert 2.0 <= returned - float(started) < 5.0, returned - float(started)
    hung = int(hung)
    for _ in range(50):  # its worker is ended after the batch, and the next batch gets a fresh pool
        if not _alive(hung):
            break
        time.sleep(0.1)
    assert not _alive(hung)
    assert scorer.score(["q"], ["ok"], ["q"])[0] == [1.0]


def test_a_reward_that_ends_its_worker_scores_0_and_the_calls_beside_it_are_scored(scorer):
    scores, extras = scorer.score(["a", "x", "b", "c"], ["ok", "exit", "ok", "ok"], ["a", "x", "b", "c"])
    assert scores == [1.0, 0.0, 1.0, 1.0]
    assert extras["prime_error"] == [0, 1, 0, 0]
    assert scorer.score(["q"], ["ok"], ["q"])[0] == [1.0]  # a fresh pool after the broken one


def test_results_are_read_as_verl_reads_them():
    assert read_result(True) == (1.0, {})
    assert read_result((0.5, "x")) == (0.5, {})
    assert read_result({"score": 2, "acc": True}) == (2.0, {"acc": 1.0})
    assert read_result("1")[0] is None and read_result(float("nan"))[0] is None
    scores, extras = prime_scores([0.5, 1.0], {}, [3, 4], None, 8)
    assert scores == [0.5, 1.0] and extras["acc"] == [0.5, 1.0]


@pytest.mark.parametrize("key", ["reward_model.reward_manager", "reward.reward_manager.name", "reward_manager.name"])
def test_every_spelling_of_the_managers_name_selects_prime(key):
    rc = load_recipe("tiny_gsm8k", [f"{key}=prime", "reward_model.prime.timeout_s=5"])
    spec = REWARD_MANAGERS.spec(rc.typed.reward_model.reward_manager)
    assert spec.parallel_scoring and rc.typed.reward_model.prime.timeout_s == 5.0
    assert not REWARD_MANAGERS.spec("naive").parallel_scoring
