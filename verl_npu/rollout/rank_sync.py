"""The ranks of one tensor-parallel engine in the agent loop: one rank runs the tools, all fail together.

The ranks of a TP group drive one vLLM engine, so every round they must send it the same requests. The
group's first rank runs the round's tools and interactions; at the start of the next round
(`RankGroupSync.exchange`) it sends its trajectories to the others, which take them over
(`adopt_trajectories`). So a tool or an interaction runs once per call, whatever the TP size (a tool with
side effects has them once), and every rank ends with the first rank's trajectories.

The same exchange carries each rank's state: a rank whose loop raised (`AgentLoop.run` calls the backend's
`fail`, which joins the exchange with the error) makes every other rank of the group raise too, with its
error's text (a `UserError` stays a `UserError`), instead of leaving them waiting. Before exchanging, the
ranks wait for each other at most `timeout_s` (`torch.distributed.monitored_barrier` on the group's gloo
group): a rank that died or hangs (a tool that never returns on the first rank) stops the run with an error
naming it, instead of a hang.

`group` is anything with vLLM's `GroupCoordinator` attributes: `rank_in_group`, `world_size`, `ranks`
(global ranks, in group order) and `cpu_group` (a gloo process group).
"""

from __future__ import annotations

import logging
import pickle
import re
import threading
from datetime import timedelta
from typing import Any

from verl_npu.errors import UserError

log = logging.getLogger(__name__)

TIMEOUT_KEY = "actor_rollout_ref.rollout.multi_turn.tp_round_timeout_s"


class RankFailed(RuntimeError):
    """Another rank of the group failed; its error is in the message."""


class RankFailedUserError(UserError):
    """Another rank of the group stopped with a user error (the same message)."""


def _from_peer(exc: BaseException, rank: int) -> BaseException:
    # marks an error about another rank (its failure, or it being late): not reported back (`fail`)
    exc.from_rank = rank
    return exc


class RankGroupSync:
    def __init__(self, group, timeout_s: float | None, what: str = "the vLLM engine's tensor-parallel group"):
        self.group, self.timeout_s, self.what = group, timeout_s, what

    @property
    def first(self) -> bool:
        return self.group.rank_in_group == 0

    def _who(self, rank_in_group: int) -> str:
        return f"rank {rank_in_group} of {self.what} (global rank {self.group.ranks[rank_in_group]})"

    def _wait_for_all(self) -> None:
        """Every rank of the group is here, or an error naming the ones that did not come within timeout_s.

        `monitored_barrier`: the first rank waits for each other rank at most timeout_s and names the late
        ones; the others send to the first rank and wait for its answer, a wait gloo does not time (its send
        waits for the first rank to receive), so they wait in a thread, at most timeout_s."""
        if self.timeout_s is None:
            return
        import torch.distributed as dist

        timeout = timedelta(seconds=float(self.timeout_s))
        if self.first:
            try:
                dist.monitored_barrier(group=self.group.cpu_group, timeout=timeout, wait_all_ranks=True)
            except ValueError as exc:  # not a plain gloo group: the exchange waits as long as the group allows
                self._untimed(exc)
            except RuntimeError as exc:
                found = re.search(r"Ranks? ([\d, ]+) failed to pass", str(exc))
                late = [int(r) for r in re.findall(r"\d+", found.group(1))] if found else []
                who = ", ".join(self._who(r) for r in late) if late else "another rank of " + self.what
                raise _from_peer(self._late(who, exc), late[0] if late else -1) from None
            return
        outcome: list = []
        done = threading.Event()

        def wait() -> None:
            try:
                dist.monitored_barrier(group=self.group.cpu_group, timeout=timeout, wait_all_ranks=True)
            except Exception as exc:  # noqa: BLE001 - handed to the waiting thread
                outcome.append(exc)
            finally:
                done.set()

        threading.Thread(target=wait, name="tp-round-barrier", daemon=True).start()
        arrived = done.wait(float(self.timeout_s))
        if arrived and outcome and isinstance(outcome[0], ValueError):
            self._untimed(outcome[0])
        elif not arrived or outcome:
            raise _from_peer(
                self._late(
                    self._who(0) + " (it runs the round's tools and interactions)", outcome[0] if outcome else None
                ),
                0,
            ) from None

    def _untimed(self, exc: BaseException) -> None:
        log.warning(
            "multi-turn rollout: %s cannot time its rounds (%s); %s is not applied", self.what, exc, TIMEOUT_KEY
        )
        self.timeout_s = None

    def _late(self, who: str, exc: BaseException | None) -> RuntimeError:
        cause = f" ({(str(exc).strip().splitlines() or [''])[0]})" if exc is not None else ""
        return RuntimeError(
            f"multi-turn rollout: {who} did not reach the start of the agent loop's round within "
            f"{self.timeout_s:g} s: it died, or hangs (a tool or an interaction that does not return). The run "
            f"is stopped. If a round's tools legitimately take longer, raise {TIMEOUT_KEY}.{cause}"
        )

    def exchange(self, payload: Any = None, error: BaseException | None = None) -> Any:
        """Called by every rank of the group at the same point: the first rank's `payload` (on every rank).
        `error`: this rank failed (`fail`): the others learn it and raise; returns None here. Raises on a rank
        whose peer reported an error (the peer's text), or when a rank does not arrive in time."""
        import torch.distributed as dist

        mine = None if error is None else (f"{type(error).__name__}: {error}", isinstance(error, UserError))
        data = b""
        if mine is None and self.first:
            try:
                data = pickle.dumps(payload)
            except Exception as exc:  # noqa: BLE001 - reported to every rank instead of leaving them waiting
                mine = (f"its trajectories cannot be sent to the other ranks ({type(exc).__name__}: {exc})", False)
        self._wait_for_all()
        states: list = [None] * self.group.world_size
        dist.all_gather_object(states, (mine, data), group=self.group.cpu_group)
        if error is not None:
            return None
        for rank, (failed, _) in enumerate(states):
            if failed is None:
                continue
            text, user_error = failed
            if rank == self.group.rank_in_group:
                raise RuntimeError(f"multi-turn rollout, {self._who(rank)}: {text}")
            if user_error:  # the user's mistake reads the same whichever rank reports it first
                raise _from_peer(RankFailedUserError(text.split(": ", 1)[1]), rank)
            raise _from_peer(RankFailed(f"multi-turn rollout stopped: {self._who(rank)} failed: {text}"), rank)
        return pickle.loads(states[0][1])

    def fail(self, error: BaseException) -> None:
        """This rank's loop raised `error`: tell the other ranks (they are at, or on their way to, the next
        exchange) so that they raise too. An error that came from another rank is not sent back; a failure
        to tell them is logged (the caller raises `error` anyway)."""
        if getattr(error, "from_rank", None) is not None:
            return
        try:
            self.exchange(error=error)
        except Exception as exc:  # noqa: BLE001 - the original error is the one to raise
            log.warning(
                "multi-turn rollout: could not tell the other ranks of %s that this rank failed: %s", self.what, exc
            )


def trajectories_wire(trajectories: list) -> list[dict]:
    """What the first rank sends: each trajectory's fields, its interaction state without the interaction
    object (the other ranks keep their own: the interaction ran on the first rank only)."""
    out = []
    for t in trajectories:
        fields = dict(vars(t))
        if t.interaction is not None:
            fields["interaction"] = {k: v for k, v in vars(t.interaction).items() if k != "interaction"}
        out.append(fields)
    return out


def adopt_trajectories(trajectories: list, wire: list[dict]) -> None:
    """Take over the first rank's trajectories (`trajectories_wire`), in place."""
    if len(wire) != len(trajectories):  # the worker group gives a TP group's ranks the same prompts
        raise RuntimeError(
            f"the ranks of one vLLM engine hold different batches ({len(wire)} vs {len(trajectories)} trajectories)"
        )
    for mine, theirs in zip(trajectories, wire):
        state = theirs.pop("interaction", None)
        if (state is None) != (mine.interaction is None):
            raise RuntimeError(f"trajectory {mine.uid}: the ranks of one vLLM engine disagree on its interaction")
        mine.__dict__.update(theirs)
        if state is not None:
            mine.interaction.__dict__.update(state)
