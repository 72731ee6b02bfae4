"""bench/cuda_check.py's `async` check: `trainer.v1.trainer_mode=separate_async` one-step-off on one device, the
rollout process beside the trainer; after every weight transfer each rollout process's weights are compared with
the trainer's (tensors and digests), and whether the device's own collective backend forms a 2-rank group on one
device is probed and recorded. Runs in a `--check async` process of cuda_check.py (no Ray needed)."""

from __future__ import annotations

import json
import time
import traceback

import cuda_check as cc
from cuda_check import Context, R, assert_finite, run_folder, run_numbers, small_overrides, train, training_rows


def watch_transfers(transfers: list) -> None:
    """separate_async: after every weight push, each rollout process's weights against the trainer's, tensor by
    tensor and by digest, appended to `transfers` (one entry per push)."""
    import torch

    from verl_npu.trainer import async_ppo
    from verl_npu.workers.weight_transfer import weights_digest

    push = async_ppo.AsyncPPOTrainer.push_weights

    def push_and_compare(self, version):
        push(self, version)
        ours = self.rollout_weights(self.workers.parameter_snapshot())
        theirs = self.rollout_snapshots()
        transfers.append(
            {
                "version": version,
                "trainer_digest": weights_digest(ours.items()),
                "rollout_digests": [weights_digest(t.items()) for t in theirs],
                "equal": [sorted(t) == sorted(ours) and all(torch.equal(t[n], ours[n]) for n in ours) for t in theirs],
                "rollout_devices": list(self.rollout.devices),
                "backend": self.rollout.dist_backend,
            }
        )

    async_ppo.AsyncPPOTrainer.push_weights = push_and_compare


ASYNC_STEPS = 4
ASYNC = [
    "trainer.v1.trainer_mode=separate_async",
    f"{R}.nnodes=1",
    f"{R}.n_gpus_per_node=1",
    "trainer.v1.separate_async.parameter_sync_step=1",
    "trainer.v1.sampler.max_off_policy_threshold=1",
    "algorithm.rollout_correction.rollout_is=token",
]


def check_async(ctx: Context) -> dict:
    """One-step-off separate_async on one device (the rollout process shares the trainer's)."""
    out = run_folder(ctx)
    found = ctx.found
    done = train(ctx, "tiny_gsm8k", small_overrides(ctx, "tiny_gsm8k", out, ASYNC_STEPS) + ASYNC, transfers=True)
    rows = training_rows(out)
    transfers = found["transfers"] = done["report"].get("transfers", [])
    found.update(run_numbers(rows, done["report"], done["seconds"]))
    assert [r["step"] for r in rows] == list(range(1, ASYNC_STEPS + 1)), f"steps {[r['step'] for r in rows]}"
    assert_finite(rows)
    assert [t["version"] for t in transfers] == list(range(ASYNC_STEPS)), "a push at the start and after every step"
    bad = [t for t in transfers if not all(t["equal"]) or set(t["rollout_digests"]) != {t["trainer_digest"]}]
    assert not bad, f"rollout weights differ from the trainer's after transfers {[t['version'] for t in bad]}"
    want = [f"{ctx.device}:0"] if ctx.device != "cpu" else ["cpu"]
    assert all(t["rollout_devices"] == want for t in transfers), f"rollout model on {transfers[0]['rollout_devices']}"
    records = [json.loads(line) for line in (out / "async" / "versions.jsonl").read_text().splitlines()]
    stale = [r for r in records if r["generation_version"] != max(0, r["step"] - 2)]
    assert not stale, f"groups not generated one version before their update: {stale[:4]}"
    assert sorted(r["uid"] for r in records) == sorted({r["uid"] for r in records}), "a uid trained twice"
    found["nccl_one_device_probe"] = probe_collective_on_one_device(ctx.device)  # recorded, not asserted
    keys = (
        "timing_s/gen",
        "timing_s/update_weights",
        "trainer/idle_ratio",
        "rollouter/idle_ratio",
        "weight_transfer/bytes",
        "weight_transfer/send_seconds",
        "training/off_policy/trajectory_staleness/max",
    )
    later = rows[1:]
    return {
        **run_numbers(rows, done["report"], done["seconds"]),
        "backend": transfers[0]["backend"],
        "rollout_devices": transfers[0]["rollout_devices"],
        "transfers_checked": len(transfers),
        **{k: round(sum(r.get(k, 0.0) for r in later) / len(later), 4) for k in keys},
        "nccl_one_device_probe": found["nccl_one_device_probe"],
    }


def probe_collective_on_one_device(device: str, timeout: float = 90.0) -> dict:
    """Whether the device's own collective backend (nccl on cuda, gloo on cpu) forms a group of two processes
    on ONE device and broadcasts through it (the weight transfer uses gloo through host memory when the rollout
    process shares the trainer's device, because NCCL refuses that): {"backend", "ok", "error"}."""
    import multiprocessing

    from verl_npu.device import DeviceInfo
    from verl_npu.workers.weight_transfer import free_port

    backend = DeviceInfo(device).dist_backend
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_probe_rank, args=(rank, port, device, backend, results)) for rank in (0, 1)]
    for p in procs:
        p.start()
    got: dict = {}
    deadline = time.time() + timeout
    try:
        while len(got) < 2 and time.time() < deadline:
            try:
                rank, text = results.get(timeout=1)
                got[rank] = text
            except Exception:  # noqa: BLE001 - queue.Empty: keep waiting
                if not any(p.is_alive() for p in procs) and results.empty():
                    break
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    errors = [t for t in got.values() if t != "ok"]
    return {
        "backend": backend,
        "ok": got == {0: "ok", 1: "ok"},
        "error": (errors[0][-600:] if errors else "" if len(got) == 2 else f"timed out after {timeout:.0f} s"),
    }


def _probe_rank(rank: int, port: int, device: str, backend: str, results) -> None:
    """One rank of `probe_collective_on_one_device`: rank 0 sends 1 MiB, rank 1 receives it and compares."""
    try:
        import torch

        from verl_npu.device import DeviceInfo
        from verl_npu.workers.weight_transfer import WeightReceiver, WeightSender

        DeviceInfo(device).set_device(0)
        weights = {"w": torch.arange(2**18, dtype=torch.float32)}
        if rank == 0:
            sender = WeightSender(
                "collective", port=port, receivers=1, device_kind=device, dist_backend=backend, timeout_s=60
            )
            sender.connect()
            sender.send(1, weights)
        else:
            module = torch.nn.Module()
            module.w = torch.nn.Parameter(torch.zeros(2**18))
            module.to(DeviceInfo(device).worker_device())
            WeightReceiver("collective", "", port, 1, device, backend, 60, rank=1).receive(1, module)
            assert torch.equal(module.w.detach().cpu(), weights["w"]), "received weights differ"
        results.put((rank, "ok"))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, traceback.format_exc()))


ASYNC_CHECKS = [
    cc.Check(
        "async",
        "cuda_check_async:check_async",
        300,
        False,
        "separate_async one-step-off, 4 steps, rollout process on the "
        "trainer's device: its weights equal the trainer's after every transfer (tensors, digests), staleness "
        "exactly min(1, s-1), every uid once, metrics finite; nccl on one device probed (recorded)",
    )
]
