"""The ranks of one tensor-parallel engine in the agent loop (verl_npu/rollout/rank_sync.py), over a real
gloo process group of two processes (no vLLM needed: the group is what vLLM's TP group coordinator holds).

- the first rank's trajectories reach the other rank, which adopts them in place, keeping its own
  interaction object (the interaction ran on the first rank only);
- a rank that fails makes the other raise with its error (either rank; a user error stays a user error);
- a rank that never arrives (the first, stuck in a tool, or another) is named by the other after the
  timeout, instead of a hang.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.multiprocessing as mp

from verl_npu.errors import UserError
from verl_npu.rollout.agent_loop import Trajectory
from verl_npu.rollout.interaction_turns import InteractionState
from verl_npu.rollout.rank_sync import RankGroupSync, adopt_trajectories, trajectories_wire


class _Interaction:
    """Stands for a rank's own interaction object; unpicklable, as an interaction with open handles is."""

    def __init__(self, rank):
        self.rank = rank
        self.lock = __import__("threading").Lock()


def _trajectories(rank: int) -> list[Trajectory]:
    t = Trajectory([1, 2], "q0#0", {})
    t.interaction = InteractionState(_Interaction(rank), {"name": "lake"})
    if rank == 0:  # the first rank ran the round's tools and interaction
        t.response, t.mask, t.user_turns = [5, 6, 7], [1, 0, 0], 1
        t.interaction.scores, t.interaction.started = [1.0], True
        t.turns = [{"role": "user", "text": "G: L", "score": 1.0}]
    return [t]


def _worker(rank: int, init: str, scenario: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    group = SimpleNamespace(rank_in_group=rank, world_size=2, ranks=[0, 1], cpu_group=dist.group.WORLD)
    sync = RankGroupSync(group, timeout_s=3)
    result: dict = {}
    try:
        trajs = _trajectories(rank)
        if scenario == "adopt":
            wire = sync.exchange(trajectories_wire(trajs) if sync.first else None)
            if not sync.first:
                adopt_trajectories(trajs, wire)
            t = trajs[0]
            result = {
                "response": t.response,
                "mask": t.mask,
                "scores": t.interaction.scores,
                "own_object": t.interaction.interaction.rank == rank,
                "turns": t.turns,
            }
        elif scenario.startswith("fail"):
            failing = int(scenario[-1])
            if rank == failing:
                err = UserError("row 3: bad kwargs") if "user" in scenario else ValueError("boom")
                sync.fail(err)
                result = {"raised": "own"}
            else:
                sync.exchange(trajectories_wire(trajs) if sync.first else None)
        elif scenario.startswith("absent"):
            if rank == int(scenario[-1]):
                time.sleep(8)  # does not come in time (a hung tool, a dead rank)
                result = {"raised": None}
            else:
                sync.exchange(trajectories_wire(trajs) if sync.first else None)
    except Exception as exc:  # noqa: BLE001 - what the test reads
        result = {
            "raised": type(exc).__name__,
            "user_error": isinstance(exc, UserError),
            "text": str(exc),
            "from_rank": getattr(exc, "from_rank", None),
        }
    Path(out, f"{rank}.json").write_text(json.dumps(result))
    os._exit(0)  # a rank that gave up waiting may still have a gloo call blocked in a thread


def run(tmp_path: Path, scenario: str) -> list[dict]:
    out = tmp_path / scenario
    out.mkdir()
    mp.start_processes(
        _worker,
        args=(f"file://{tmp_path / (scenario + '.store')}", scenario, str(out)),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    return [json.loads((out / f"{r}.json").read_text()) for r in range(2)]


def test_the_other_rank_adopts_the_first_ranks_trajectories_and_keeps_its_interaction(tmp_path):
    first, other = run(tmp_path, "adopt")
    assert first == other | {"own_object": True}
    assert other["response"] == [5, 6, 7] and other["mask"] == [1, 0, 0] and other["scores"] == [1.0]
    assert other["own_object"]


@pytest.mark.parametrize("scenario", ["fail0", "failuser1"])
def test_a_rank_that_fails_makes_the_other_raise_with_its_error(tmp_path, scenario):
    results = run(tmp_path, scenario)
    failing = int(scenario[-1])
    other = results[1 - failing]
    assert results[failing] == {"raised": "own"}
    assert other["from_rank"] == failing
    if "user" in scenario:  # a user's mistake reads the same on every rank
        assert other["raised"] == "RankFailedUserError" and other["user_error"] and other["text"] == "row 3: bad kwargs"
    else:
        assert other["raised"] == "RankFailed" and not other["user_error"]
        assert (
            f"rank {failing} of the vLLM engine's tensor-parallel group (global rank {failing}) failed: "
            "ValueError: boom" in other["text"]
        )


@pytest.mark.parametrize("late", [0, 1])
def test_a_rank_that_does_not_come_is_named_after_the_timeout(tmp_path, late):
    start = time.monotonic()
    results = run(tmp_path, f"absent{late}")
    waiting = results[1 - late]
    assert waiting["raised"] == "RuntimeError" and waiting["from_rank"] == (late if late else 0)
    assert f"rank {late} of the vLLM engine's tensor-parallel group (global rank {late})" in waiting["text"]
    assert "did not reach the start of the agent loop's round within 3 s" in waiting["text"]
    assert "tp_round_timeout_s" in waiting["text"]
    assert time.monotonic() - start < 60
