"""The vLLM engine as the rollout side of `trainer.v1.trainer_mode=separate_async`, with partial rollout.

One engine spans `rollout.tensor_model_parallel_size` (t) rollout processes: its leader (TP rank 0) reads the
trainer's commands, and every command is broadcast to the engine's other ranks (a gloo group of the engine's
own), so that all t ranks add, abort and step the same requests and load the same weights at the same engine
step (vLLM's external launcher: each rank runs the engine's scheduler and its TP shard of the model). Every rank
is a receiver of the weight transfer: it receives the full weights into a host copy of the model (the landing
buffer, whose digest the trainer checks), then streams that copy's state dict (tied weights under each name: vLLM's
in-place reload ignores an update that lacks one) into its engine, whose loader keeps this rank's shard.

Between two engine steps the leader takes at most one command (`verl_npu.workers.rollout_side` describes them):
a `generate` adds its part's requests, and the next step samples their first tokens before any later command is
handled, so a part's first tokens come from the version it was issued at (the staleness bound counts that one);
a `weights` command that finds requests in flight interrupts them, loads the new version and resumes them on it
(`verl_npu.rollout.vllm_partial`: partial rollout, each token's version recorded). Only the leader replies
with generated groups; every rank replies to `weights` and `snapshot`.

Multi-turn (`rollout.multi_turn.enable`): a part is the agent loop over its prompts (tools, interactions), its
model turns stepped by `PartialTurns`; parts then run one after another, and between two engine steps of a part
the commands that arrived are handled: a `weights` command interrupts the turns in flight and resumes them on the
new version, as above; a `generate` (and whatever was sent after it) waits for the part to finish, so that every
part still starts on the version it was issued at.
"""

from __future__ import annotations

import os
import queue
import time
from datetime import timedelta

import torch

POLL_S = 0.5
ENGINE_PREFIX = "vllm_engine/"  # snapshot keys of the engine's own (TP-sharded) parameters


def join_engine_group(tp_rank: int, tp_size: int, port: int, device) -> object | None:
    """Form this engine's torch.distributed group (vLLM's external launcher runs on it) and a gloo group for
    the commands; None (and nothing formed) for a one-rank engine."""
    if tp_size <= 1:
        return None
    import torch.distributed as dist

    os.environ.update(
        {"RANK": str(tp_rank), "WORLD_SIZE": str(tp_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    )
    dist.init_process_group(
        backend=device.dist_backend, rank=tp_rank, world_size=tp_size, timeout=timedelta(seconds=3600)
    )
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=3600))


def build_vllm_engine(cfg, module, tokenizer, processor, device, tp_rank: int, tp_size: int):
    """This rank's part of the engine, started from `module`'s weights, awake for good (it never gives its
    device back to a trainer)."""
    from verl_npu.rollout import build_rollout

    engine = build_rollout(
        cfg.actor_rollout_ref.rollout.name,
        module,
        tokenizer,
        processor,
        cfg,
        rank=tp_rank,
        world_size=tp_size,
        device=device,
        weights=list(module.state_dict().items()),
    )
    engine.wake_up()
    engine.free_cache_engine = False
    loop = getattr(engine, "agent_loop", None)
    if loop is not None:  # multi-turn: the agent loop's turns stepped, so a weight update can arrive mid-turn
        from verl_npu.rollout.vllm_partial import PartialTurns

        loop.turns = PartialTurns(engine, cfg.actor_rollout_ref.rollout.multi_turn.tp_round_timeout_s)
    return engine


class _Stop(Exception):
    """The trainer said `stop` while a multi-turn part was in flight."""


def serve_partial(index: int, tp_rank: int, group, module, engine, receiver, commands, replies, pack, unpack) -> None:
    """Answer the trainer's commands until `stop` (see the module's docstring). `index` names this process in
    replies; `commands` is None on a rank other than the engine's leader."""
    try:
        _PartialServer(index, tp_rank, group, module, engine, receiver, commands, replies, pack, unpack).serve()
    except _Stop:
        return


class _PartialServer:
    """One rollout process of a vLLM engine (the module's docstring): single-turn parts are stepped side by side
    (`PartialRollouts`); a multi-turn part (the agent loop over `PartialTurns`) runs one at a time, the commands
    that arrive meanwhile handled between its engine steps: a weight update mid-part interrupts and resumes its
    requests; a later part (and everything sent after it) waits for this one to finish, so that each part starts
    on the version it was issued at."""

    def __init__(self, index, tp_rank, group, module, engine, receiver, commands, replies, pack, unpack):
        from verl_npu.rollout.vllm_partial import PartialRollouts, PartialTurns

        self.index, self.tp_rank, self.group = index, tp_rank, group
        self.module, self.engine, self.receiver = module, engine, receiver
        self.commands, self.replies, self.pack, self.unpack = commands, replies, pack, unpack
        self.partial = PartialRollouts(engine)
        loop = getattr(engine, "agent_loop", None)
        self.turns = loop.turns if loop is not None and isinstance(loop.turns, PartialTurns) else None
        # the requests a weight update interrupts and resumes: the multi-turn part's, or the single-turn parts'
        self.stepping = self.partial if self.turns is None else self.turns.requests
        if self.turns is not None:
            self.turns.between_steps = self._between_steps
        self.version, self.idle, self.busy = -1, 0.0, 0.0
        self.deferred: list = []  # commands read during a multi-turn part, taken after it (in order)

    def _next(self, block: bool):
        """The next command (its data, or None): a deferred one, else the leader's read (waiting at most
        POLL_S when `block`), broadcast so that every rank of the engine handles it at the same step."""
        if self.deferred:
            return self.deferred.pop(0)
        data = None
        if self.commands is not None:
            try:
                data = self.commands.get(timeout=POLL_S) if block else self.commands.get_nowait()
            except queue.Empty:
                pass
        if self.group is not None:
            import torch.distributed as dist

            shared = [data]
            dist.broadcast_object_list(shared, src=0, group=self.group)
            data = shared[0]
        return data

    def serve(self) -> None:
        partial = self.partial
        while True:
            waited = time.perf_counter()
            data = self._next(block=not partial.busy)
            if not partial.busy:
                self.idle += time.perf_counter() - waited
            command = self.unpack(data) if data is not None else ("none",)
            kind = command[0]
            if kind == "stop":
                return
            if kind in ("snapshot", "weights"):
                self._answer(command)
            elif kind == "generate" and self.turns is not None:
                self._multi_turn_part(*command[1:])
            elif kind == "generate":
                _, issue_id, prompts, sampling = command
                partial.add(issue_id, prompts, sampling)
            if partial.busy:
                stepped = time.perf_counter()
                done = partial.step(self.version)
                self.busy += time.perf_counter() - stepped
                for issue_id, rows in done:
                    self._reply_groups(issue_id, rows)

    def _answer(self, command: tuple) -> None:
        """A `snapshot` or a `weights` command (the latter interrupting and resuming what is in flight)."""
        from verl_npu.workers.weight_transfer import weights_digest

        if command[0] == "snapshot":
            tensors = {n: p.detach().cpu().clone() for n, p in self.module.named_parameters()}
            tensors.update({ENGINE_PREFIX + n: t for n, t in engine_parameters(self.engine).items()})
            self.replies.put(self.pack(("snapshot", self.index, tensors)))
            return
        started = time.perf_counter()
        version = int(command[1])
        self.stepping.interrupt()
        stats = self.receiver.receive(version, self.module)
        self.engine.update_weights(list(self.module.state_dict().items()))
        self.version = version
        if self.turns is not None:
            self.turns.version = version
        self.stepping.resume()
        self.busy += time.perf_counter() - started
        digest = weights_digest(self.module.named_parameters())
        self.replies.put(self.pack(("weights", self.index, version, stats, digest)))

    def _between_steps(self) -> None:
        """Before each engine step of a multi-turn part: the commands that arrived, up to the first that must
        wait for the part (a `generate`), handled now; a `stop` ends the process."""
        if self.deferred:
            return
        data = self._next(block=False)
        if data is None:
            return
        command = self.unpack(data)
        if command[0] == "stop":
            raise _Stop
        if command[0] in ("snapshot", "weights"):
            self._answer(command)
        else:
            self.deferred.append(data)

    def _multi_turn_part(self, issue_id: str, prompts, sampling) -> None:
        started = time.perf_counter()
        self.turns.stepped = False  # the part's first engine step comes before any command
        rows = self.engine.generate(prompts, sampling)
        self.busy += time.perf_counter() - started
        self._reply_groups(issue_id, rows)

    def _reply_groups(self, issue_id: str, rows) -> None:
        if self.tp_rank == 0:
            stats = {
                "gen_seconds": self.busy,
                "idle_seconds": self.idle,
                "busy_seconds": self.busy,
                "interrupted_requests": self.stepping.interrupted,  # so far, in all
            }
            self.replies.put(self.pack(("groups", self.index, issue_id, self.version, rows, stats)))
        self.idle = self.busy = 0.0


def engine_parameters(engine) -> dict[str, torch.Tensor]:
    """This rank's engine parameters (vLLM's names; TP shards), copied to the host."""
    from verl_npu.rollout.vllm import engine_worker

    runner = engine_worker(engine.llm).model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
