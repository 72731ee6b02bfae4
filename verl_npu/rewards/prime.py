"""The `prime` reward manager (`reward_model.reward_manager=prime`, verl 0.9.1's `reward.reward_manager.name=prime`):
a batch's responses scored in parallel worker processes, each response within a deadline.

What it computes, as verl's PrimeRewardManager does: each response's score is the reward function's
`compute_score(data_source, solution_str, ground_truth, extra_info)` (a number, a bool as 0/1, the first element of
a tuple or list, or the "score" of a dict), placed on the response's last token; a response whose call raises,
returns no number, or runs past its deadline scores 0.0 and the run goes on (the naive manager stops the run
instead, naming the row). The reward extra `acc` is the score (verl stores it as `acc`), and `prime_timeout` /
`prime_error` are 1.0 for the responses that timed out / failed (logged as critic/score/prime_timeout/mean, the
fraction of such responses).

How (verl-npu's own settings, `reward_model.prime.*`): `num_processes` worker processes (started with `spawn`, so
a training process with threads is never forked) each load the reward function once (custom_reward_function.path /
name / reward_kwargs, else the built-in rewards) and stay up for the whole run; as many are started as a batch has
responses, up to `num_processes`. At most one response per free worker is in flight, and a response's `timeout_s`
counts from when its worker reports starting the call: neither a worker's start-up nor the wait behind slow
responses counts (verl's clock starts at submission, so responses queued behind slow ones can time out unstarted). A
worker still busy at a deadline is abandoned (its slot stays out of use for the rest of the batch); after such a
batch all the pool's processes are ended and a fresh pool is started for the next batch.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import queue
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from verl_npu.config.typed import section
from verl_npu.registry import REWARD_MANAGERS
from verl_npu.rewards import FLOAT32_MAX, RewardFunction, RewardScorer, as_score, load_reward_fn, numeric_subscores

log = logging.getLogger(__name__)

#: what a worker process scores with, and where it says when it starts a call (set by `_load_in_worker`)
_WORKER_FN: Any = None
_STARTS: Any = None


@REWARD_MANAGERS.register(
    "prime",
    parallel_scoring=True,
    doc=(
        "verl's PRIME manager: the responses of a batch scored in parallel worker processes "
        "(reward_model.prime.num_processes), each within reward_model.prime.timeout_s seconds; a response whose "
        "reward call times out, raises or returns no number scores 0 (the run goes on); reward extras acc, "
        "prime_timeout, prime_error"
    ),
)
def prime_scores(scores, extras, valid_response_lengths, reward_kwargs, max_response_length):
    """The prime manager's `(scores, extras)` from the parallel scorer's: the scores unchanged, the extra `acc`
    (the score, as verl stores it) added when the reward function returned none of its own."""
    extras = dict(extras)
    extras.setdefault("acc", [float(s) for s in scores])
    return list(scores), extras


def _load_in_worker(function_cfg: dict, starts: Any) -> None:
    global _WORKER_FN, _STARTS
    _WORKER_FN, _STARTS = load_reward_fn(function_cfg).fn, starts


def _score_in_worker(call_id: tuple[int, int], args: tuple) -> Any:
    _STARTS.put(call_id)  # the call's deadline counts from here (not from a worker's start-up)
    return _WORKER_FN(*args)


def read_result(result: Any) -> tuple[float | None, dict[str, float]]:
    """(the score, numeric sub-scores) of one reward call's result; the score is None when the result holds no
    finite number (then the response scores 0). Accepted as verl's prime manager does: a number or bool, a
    tuple / list (its first element), and, as every verl-npu reward, a dict with a 'score'."""
    subs: dict[str, float] = {}
    if isinstance(result, dict):
        subs = numeric_subscores(result)
        result = result.get("score")
    elif isinstance(result, (tuple, list)) and result:
        result = result[0]
    number = as_score(result)
    if number is None or not math.isfinite(number) or abs(number) > FLOAT32_MAX:
        return None, subs
    return number, subs


class ParallelRewardScorer:
    """Scores a batch's responses in `num_processes` worker processes, each call within `timeout_s` seconds
    (None: no limit); a call that times out, raises or returns no number scores 0.0. Same `score` / `covers`
    interface as `verl_npu.rewards.RewardScorer` (what the trainer calls)."""

    def __init__(self, function_cfg: Any = None, num_processes: int = 64, timeout_s: float | None = 300.0):
        cfg = section("custom_reward_function", function_cfg)
        # loaded here too: a missing file or function is the user's error before any worker starts
        self.function: RewardFunction = load_reward_fn(cfg)
        self.function_cfg = {
            "path": cfg.path,
            "name": cfg.name,
            "reward_kwargs": dict(cfg.reward_kwargs or {}),
            "timeout_s": None,
        }
        self.num_processes = int(num_processes)
        self.timeout_s = None if timeout_s is None else float(timeout_s)
        self._pool: ProcessPoolExecutor | None = None
        self._starts: Any = None  # the pool's queue of (batch, call) the workers start
        self._batches = 0

    def covers(self, data_sources: list[str]) -> bool:
        """Whether every one of `data_sources` has a rule reward (always, with your own function)."""
        return RewardScorer(self.function).covers(data_sources)

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            self._starts = context.Queue()
            self._pool = ProcessPoolExecutor(
                max_workers=self.num_processes,
                mp_context=context,
                initializer=_load_in_worker,
                initargs=(self.function_cfg, self._starts),
            )
        return self._pool

    def _started(self, batch: int, started: dict[int, float]) -> None:
        """Records the calls of `batch` that workers reported starting since the last look."""
        while True:
            try:
                b, i = self._starts.get_nowait()
            except queue.Empty:
                return
            if b == batch:
                started.setdefault(i, time.monotonic())

    def close(self) -> None:
        """Ends every worker process (those still running an abandoned call included)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        self._starts.close()
        self._starts.cancel_join_thread()
        processes = list((getattr(pool, "_processes", None) or {}).values())
        for proc in processes:
            if proc.is_alive():
                proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            proc.join(5)
            if proc.is_alive():
                proc.kill()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the pool's own exit handler ends the workers
            pass

    def score(
        self,
        responses: list[str],
        data_sources: list[str],
        ground_truths: list,
        extra_infos: list | None = None,
        rows: list | None = None,
    ) -> tuple[list[float], dict[str, list[float]]]:
        n = len(responses)
        extra_infos = list(extra_infos) if extra_infos is not None else [None] * n
        if not (len(data_sources) == len(ground_truths) == len(extra_infos) == n):
            raise ValueError(
                f"ParallelRewardScorer.score: lengths differ (responses {n}, data_sources "
                f"{len(data_sources)}, ground_truths {len(ground_truths)}, extra_infos {len(extra_infos)})"
            )
        results, timed_out, failed = self._run(
            [(s, r, g, e) for r, s, g, e in zip(responses, data_sources, ground_truths, extra_infos)]
        )
        scores, extras = [], {"prime_timeout": [0.0] * n, "prime_error": [0.0] * n}
        for i in range(n):
            number, subs = (None, {}) if i in timed_out or i in failed else read_result(results[i])
            if number is None and i not in timed_out and i not in failed:
                failed[i] = f"returned {results[i]!r:.120}, not a number"
            scores.append(0.0 if number is None else number)
            for key, value in subs.items():
                extras.setdefault(key, [math.nan] * n)[i] = value
        for i in timed_out:
            extras["prime_timeout"][i] = 1.0
        for i in failed:
            extras["prime_error"][i] = 1.0
        if timed_out or failed:
            log.warning(
                "prime reward manager: %d of %d responses scored 0 (%d past reward_model.prime.timeout_s=%s s, "
                "%d failed%s)",
                len(timed_out) + len(failed),
                n,
                len(timed_out),
                self.timeout_s,
                len(failed),
                "".join(f"; {_row(rows, i)}: {why}" for i, why in list(failed.items())[:3]),
            )
        return scores, extras

    def _run(self, calls: list[tuple]) -> tuple[dict[int, Any], set[int], dict[int, str]]:
        """Runs the calls, at most one per free worker; (results, indices timed out, index -> why it failed).

        A worker process that dies (a reward that ends its process) fails every call in flight in its pool; those
        calls are run again one at a time, so only the call that kills its worker alone scores 0."""
        pool = self._executor()
        self._batches += 1
        batch = self._batches
        results: dict[int, Any] = {}
        timed_out: set[int] = set()
        failed: dict[int, str] = {}
        waiting = list(range(len(calls)))[::-1]
        running: dict[Future, int] = {}
        started: dict[int, float] = {}  # when a worker reported starting each call
        alone: set[int] = set()  # calls in flight when a worker died: rerun one at a time
        slots = self.num_processes
        while waiting or running:
            while waiting and len(running) < (1 if alone & {*waiting, *running.values()} else slots):
                i = waiting.pop()
                started.pop(i, None)
                try:
                    future = pool.submit(_score_in_worker, (batch, i), calls[i])
                except BrokenProcessPool:  # a worker died: a fresh pool
                    self.close()
                    pool, slots = self._executor(), self.num_processes
                    future = pool.submit(_score_in_worker, (batch, i), calls[i])
                running[future] = i
            self._started(batch, started)
            timeout = None
            if self.timeout_s is not None:  # the next deadline; a short look while a call is not started yet
                begun = [started[i] for i in running.values() if i in started]
                timeout = min(begun) + self.timeout_s - time.monotonic() if begun else 0.05
                if len(begun) < len(running):
                    timeout = min(timeout, 0.05)
            done, _ = wait(running, timeout=None if timeout is None else max(0.0, timeout), return_when=FIRST_COMPLETED)
            for future in done:
                i = running.pop(future)
                try:
                    results[i] = future.result()
                except BrokenProcessPool:
                    if i in alone:  # it ran alone: it is the call that ends its worker
                        failed[i] = "its reward call ended the worker process"
                    else:
                        alone.add(i)
                        waiting.append(i)
                except Exception as err:  # the reward raised
                    failed[i] = f"{type(err).__name__}: {err}"
            self._started(batch, started)
            now = time.monotonic()
            for future, i in list(running.items()):
                if (
                    self.timeout_s is not None
                    and i in started
                    and now - started[i] >= self.timeout_s
                    and not future.done()
                ):
                    running.pop(future)
                    timed_out.add(i)
                    slots -= 1  # its worker is still busy with it
            if slots <= 0 and waiting:
                self.close()  # every worker is stuck: start a fresh pool for the rest
                pool, slots = self._executor(), self.num_processes
        if timed_out or alone:
            self.close()  # abandoned calls still run in their workers, or the pool broke: a fresh pool next batch
        return results, timed_out, failed


def _row(rows: list | None, i: int) -> str:
    return str(rows[i]) if rows is not None and rows[i] is not None else f"response {i} of the batch"


def build_scorer(cfg: Any) -> ParallelRewardScorer:
    """The prime scorer of a run (`cfg`: the typed backend config)."""
    prime = cfg.reward_model.prime
    return ParallelRewardScorer(cfg.custom_reward_function, prime.num_processes, prime.timeout_s)
