"""A weight push that failed because a rollout process died names the process (verl_npu.trainer.async_ppo
`push_weights`): the broadcast to a killed TP rank fails with gloo's "Connection closed by peer" in the push thread,
and the trainer, reaching the next push before any reply told it, stops with RolloutSideDied naming the dead process
(the vLLM suite's killed-TP-rank test met this order on a loaded machine), the transfer's error as its cause."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from types import SimpleNamespace

import pytest

from verl_npu.trainer.async_ppo import AsyncPPOTrainer
from verl_npu.workers.rollout_side import RolloutSide, RolloutSideDied


def _sleep() -> None:
    time.sleep(60)


def _side_with_processes(processes) -> RolloutSide:
    side = RolloutSide.__new__(RolloutSide)  # its processes only: what the check reads
    side.processes = processes
    return side


def test_a_failed_push_names_the_rollout_process_that_died():
    ctx = mp.get_context("spawn")
    alive, killed = ctx.Process(target=_sleep, daemon=True), ctx.Process(target=_sleep, daemon=True)
    alive.start(), killed.start()
    try:
        os.kill(killed.pid, signal.SIGKILL)
        transfer = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4234")
        trainer = SimpleNamespace(
            push_thread=None, push_result={"error": transfer}, rollout=_side_with_processes([alive, killed])
        )
        with pytest.raises(
            RolloutSideDied, match=rf"rollout process 1 \(pid {killed.pid}\) exited with code -9"
        ) as err:
            AsyncPPOTrainer.push_weights(trainer, 4)
        assert err.value.__cause__ is transfer
    finally:
        for p in (alive, killed):
            p.kill()
            p.join()


def test_a_failed_push_with_every_process_alive_raises_the_transfers_error():
    ctx = mp.get_context("spawn")
    alive = ctx.Process(target=_sleep, daemon=True)
    alive.start()
    try:
        transfer = RuntimeError("the transfer failed")
        trainer = SimpleNamespace(
            push_thread=None, push_result={"error": transfer}, rollout=_side_with_processes([alive])
        )
        trainer.rollout.raise_if_one_died = lambda: RolloutSide.raise_if_one_died(trainer.rollout, within_s=0.5)
        with pytest.raises(RuntimeError, match="the transfer failed"):
            AsyncPPOTrainer.push_weights(trainer, 4)
    finally:
        alive.kill()
        alive.join()
