"""Real gloo process groups on this machine, for tests of collectives: `spawn_gloo` starts the worker
processes and waits for them, `gloo_group` joins one worker to the group and leaves it on the way out.

(Imported by test files as `from gloo_workers import ...`: tests/conftest.py puts tests/helpers/ and every
test folder on sys.path, and spawned workers get the parent's sys.path, so they import it, and the test
module their function lives in, too.)
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the group's rendezvous port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int, wait_for_peers: bool = False):
    """In a worker: join the gloo group of `world` processes at 127.0.0.1:`port` as `rank`, with one torch
    thread (the ranks share the machine's cores); leave it on the way out, also on an error. With
    `wait_for_peers`, a barrier first, so that no rank tears gloo down while its peer still talks to it
    (off by default: after an error on one rank the barrier would hang the other)."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield dist.group.WORLD
    finally:
        if wait_for_peers:
            dist.barrier()
        dist.destroy_process_group()


def spawn_gloo(worker: Callable[..., None], *args, world: int = 2, timeout_s: float | None = None) -> None:
    """Run `worker(rank, world, port, *args)` in `world` fresh processes (a free port for their group) and
    wait for them all; an error in a worker fails the test. With `timeout_s`, ranks still running after that
    many seconds are killed and the test fails: ranks whose collectives do not match hang instead of failing."""
    args = (world, free_port(), *args)
    if timeout_s is None:
        mp.spawn(worker, args=args, nprocs=world, join=True)
        return
    ctx = mp.spawn(worker, args=args, nprocs=world, join=False)
    deadline = time.time() + timeout_s
    while not ctx.join(timeout=5):
        if time.time() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the ranks did not finish together (a collective mismatch hangs them)")
