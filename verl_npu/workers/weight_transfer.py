"""Weight transfer from the trainer to the rollout processes of `trainer.v1.trainer_mode=separate_async`, each
holding its own copy of the policy: one component, two backends, measured and verified.

- `collective`: a broadcast from the trainer (rank 0) to the rollout processes (ranks 1..N) in a process group of
  their own (not the default group, which the trainer's workers may already use). Its backend comes from the device
  layer (`DeviceInfo.weight_sync_backend`): gloo on the CPU; nccl on CUDA and hccl on NPU when every rollout process
  holds a device of its own (the tensors go device to device); gloo through host memory when the rollout processes
  share the trainer's device (one GPU: NCCL and HCCL refuse two ranks on one device).
- `file`: the sender writes the weights to one file per version (written aside, renamed into place) in a folder
  every side sees (/dev/shm when it exists: shared memory); each receiver loads it, and the sender removes it once
  every receiver has confirmed that version (`release`). It needs no group that spans the sides: Trinity's
  `checkpoint` sync method.

Both send (name, tensor) pairs of the full weights in a fixed order (sorted names). Every transfer is measured
(bytes, seconds) and verified: the sender and each receiver compute `weights_digest` (SHA-256 over every tensor's
name, dtype, shape and bytes), and the trainer compares them (`async_ppo`); tests also compare the tensors
themselves, on every rollout process.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from verl_npu.device import DeviceInfo

BACKENDS = ("collective", "file")


def weights_digest(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 over each (name, dtype, shape, raw bytes) in name order: equal digests mean bit-equal weights."""
    h = hashlib.sha256()
    for name, tensor in sorted(named, key=lambda kv: kv[0]):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def shared_folder() -> str:
    """Where the file backend writes: shared memory when the system has it, else the temporary folder."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WeightSender:
    """The trainer's end, sending to `receivers` rollout processes. `device_kind` and `dist_backend` (the device
    layer's answers) say where the broadcast's tensors live: on this process's device for nccl / hccl, on the host
    for gloo."""

    def __init__(
        self,
        backend: str,
        *,
        folder: str | None = None,
        port: int | None = None,
        receivers: int = 1,
        device_kind: str = "cpu",
        dist_backend: str = "gloo",
        timeout_s: float = 600.0,
    ):
        if backend not in BACKENDS:
            raise ValueError(f"weight transfer backend must be one of {BACKENDS}, got {backend!r}")
        self.backend, self.receivers = backend, int(receivers)
        self.folder = Path(folder or tempfile.mkdtemp(prefix="verl_npu_weights_", dir=shared_folder()))
        self.port, self.device_kind, self.dist_backend, self.timeout_s = port, device_kind, dist_backend, timeout_s
        self.group = None

    def receiver_args(self) -> dict:
        """What a receiver is built with (picklable): `WeightReceiver(**args, rank=...)`."""
        return {
            "backend": self.backend,
            "folder": str(self.folder),
            "port": self.port,
            "receivers": self.receivers,
            "device_kind": self.device_kind,
            "dist_backend": self.dist_backend,
            "timeout_s": self.timeout_s,
        }

    def connect(self) -> None:
        """Rank 0 of the collective group (blocks until every receiver has joined); nothing for `file`."""
        if self.backend == "collective":
            self.group = _collective_group(
                self.port, 0, self.receivers + 1, self.device_kind, self.dist_backend, self.timeout_s
            )

    def send(self, version: int, named: dict[str, torch.Tensor]) -> dict[str, float]:
        """Send one version of the weights; returns `{"bytes", "seconds"}` of this send."""
        start = time.perf_counter()
        where = _tensor_device(self.device_kind, self.dist_backend)
        ordered = [(n, named[n].detach().to(where).contiguous()) for n in sorted(named)]
        size = sum(t.numel() * t.element_size() for _, t in ordered)
        if self.backend == "collective":
            for _, tensor in ordered:
                self.group.broadcast(tensor, 0).wait()
            DeviceInfo(self.device_kind).synchronize()  # the bytes have left before `ordered` is freed
        else:
            final = self.folder / f"weights_v{version}.pt"
            tmp = final.with_suffix(".tmp")
            torch.save(dict(ordered), tmp)
            os.replace(tmp, final)  # a receiver never sees a half-written file
        return {"bytes": float(size), "seconds": time.perf_counter() - start}

    def release(self, version: int) -> None:
        """Every receiver holds `version`: the file backend removes its file (and any older one)."""
        if self.backend != "file":
            return
        for old in self.folder.glob("weights_v*.pt"):
            if int(old.stem.removeprefix("weights_v")) <= version:
                old.unlink(missing_ok=True)

    def close(self) -> None:
        self.group = None
        if self.backend == "file":
            for leftover in self.folder.glob("weights_v*"):
                leftover.unlink(missing_ok=True)
            try:
                self.folder.rmdir()
            except OSError:
                pass


class WeightReceiver:
    """A rollout process's end (rank 1..N): `receive` copies one version into `module`'s parameters in place."""

    def __init__(
        self,
        backend: str,
        folder: str,
        port: int | None,
        receivers: int,
        device_kind: str,
        dist_backend: str,
        timeout_s: float,
        rank: int = 1,
    ):
        self.backend, self.folder, self.rank, self.timeout_s = backend, Path(folder), int(rank), timeout_s
        self.where = _tensor_device(device_kind, dist_backend)
        self.group = None
        if backend == "collective":
            self.group = _collective_group(port, rank, receivers + 1, device_kind, dist_backend, timeout_s)

    @torch.no_grad()
    def receive(self, version: int, module: torch.nn.Module) -> dict[str, float]:
        """Load version `version` into `module` (wherever its parameters live); returns `{"bytes", "seconds"}`."""
        start = time.perf_counter()
        params = dict(module.named_parameters())
        size = 0
        if self.backend == "collective":
            for name in sorted(params):
                p = params[name]
                buf = torch.empty(p.shape, dtype=p.dtype, device=self.where)
                self.group.broadcast(buf, 0).wait()
                p.data.copy_(buf)
                size += buf.numel() * buf.element_size()
        else:
            path = self.folder / f"weights_v{version}.pt"
            deadline = time.monotonic() + self.timeout_s
            while not path.exists():  # the sender may still be writing it (renamed into place when complete)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"weights file {path} did not appear within {self.timeout_s:.0f} s")
                time.sleep(0.01)
            state = torch.load(path, map_location="cpu", weights_only=True)
            if sorted(state) != sorted(params):
                raise RuntimeError(
                    f"weights file {path} holds other parameters than the rollout model: "
                    f"{sorted(set(state) ^ set(params))[:5]}"
                )
            for name, tensor in state.items():
                params[name].data.copy_(tensor)
                size += tensor.numel() * tensor.element_size()
        return {"bytes": float(size), "seconds": time.perf_counter() - start}


def _tensor_device(device_kind: str, dist_backend: str) -> torch.device:
    """Where a broadcast's tensors live: the host for gloo, this process's device otherwise."""
    return torch.device("cpu") if dist_backend == "gloo" else DeviceInfo(device_kind).worker_device()


def _collective_group(port: int, rank: int, size: int, device_kind: str, dist_backend: str, timeout_s: float):
    """A process group of its own over a TCP store on this host (rank 0 holds the store)."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", int(port), size, rank == 0, timeout=timedelta(seconds=timeout_s))
    return DeviceInfo(device_kind).process_group(store, rank, size, timeout_s, dist_backend)
