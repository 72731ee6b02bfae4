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
    return engine


def serve_partial(index: int, tp_rank: int, group, module, engine, receiver, commands, replies, pack, unpack) -> None:
    """Answer the trainer's commands until `stop` (see the module's docstring). `index` names this process in
    replies; `commands` is None on a rank other than the engine's leader."""
    import torch.distributed as dist

    from verl_npu.rollout.vllm_partial import PartialRollouts
    from verl_npu.workers.weight_transfer import weights_digest

    partial = PartialRollouts(engine)
    version, idle, busy = -1, 0.0, 0.0
    while True:
        waited = time.perf_counter()
        data = None
        if commands is not None:
            try:
                data = commands.get_nowait() if partial.busy else commands.get(timeout=POLL_S)
            except queue.Empty:
                pass
        if group is not None:  # every rank of the engine handles the leader's command at the same step
            shared = [data]
            dist.broadcast_object_list(shared, src=0, group=group)
            data = shared[0]
        if not partial.busy:
            idle += time.perf_counter() - waited
        started = time.perf_counter()
        command = unpack(data) if data is not None else ("none",)
        kind = command[0]
        if kind == "stop":
            return
        if kind == "snapshot":
            tensors = {n: p.detach().cpu().clone() for n, p in module.named_parameters()}
            tensors.update({ENGINE_PREFIX + n: t for n, t in engine_parameters(engine).items()})
            replies.put(pack(("snapshot", index, tensors)))
        elif kind == "weights":
            version = int(command[1])
            partial.interrupt()
            stats = receiver.receive(version, module)
            engine.update_weights(list(module.state_dict().items()))
            partial.resume()
            busy += time.perf_counter() - started
            replies.put(pack(("weights", index, version, stats, weights_digest(module.named_parameters()))))
        elif kind == "generate":
            _, issue_id, prompts, sampling = command
            partial.add(issue_id, prompts, sampling)
        if partial.busy:
            stepped = time.perf_counter()
            done = partial.step(version)
            busy += time.perf_counter() - stepped
            for issue_id, rows in done:
                if tp_rank == 0:
                    stats = {
                        "gen_seconds": busy,
                        "idle_seconds": idle,
                        "busy_seconds": busy,
                        "interrupted_requests": partial.interrupted,
                    }
                    replies.put(pack(("groups", index, issue_id, version, rows, stats)))
                idle = busy = 0.0


def engine_parameters(engine) -> dict[str, torch.Tensor]:
    """This rank's engine parameters (vLLM's names; TP shards), copied to the host."""
    from verl_npu.rollout.vllm import engine_worker

    runner = engine_worker(engine.llm).model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
