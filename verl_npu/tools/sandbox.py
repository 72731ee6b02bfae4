"""Running model-written Python in a sandbox: one fresh process per call, with limits, no network and
a private filesystem that is deleted afterwards (the code interpreter tool's engine, docs/agents.md
"The code interpreter sandbox").

`run_python(code, limits)` starts the host Python (`sys.executable -I`, isolated mode) on
`sandbox_boot.py`, hands it the code on stdin, reads its stdout and stderr together (at most
`limits.max_output_bytes`; the rest is read and dropped), kills it at `limits.wall_s` seconds, stops
reading its output at most `DRAIN_S` seconds later whatever still holds the pipe, and deletes its
folder. Isolations (`sandbox_boot` has the details):

- "namespaces", the operating-system boundary (Linux; root, or a user allowed to create user
  namespaces; checked once per process by `namespaces_work`, which runs the real setup on a one-line
  program): new user, mount, PID, network, IPC, UTS and cgroup namespaces; a chroot into a tmpfs of
  `disk_mb` (the whole writable filesystem: the working folder `/sandbox` and `/tmp`) holding read-only
  binds of /usr and the Python installation; the code runs as nobody (or, launched without root, as
  the namespace's root) without any capability, with no_new_privs and a seccomp filter; the network
  namespace reaches nothing; every process dies with the code's main process or when the host kills the
  launcher; no host process is visible.
- "unsafe_process", only when asked for by that name: rlimits, the working folder as cwd / HOME /
  TMPDIR, and an audit hook refusing sockets, subprocesses, ctypes and file access outside the folder
  for Python code. It is NOT a boundary: code defeats it (docs/agents.md lists the known ways).
- "auto" (the default): namespaces; where they cannot run, `active_isolation` refuses with what is
  missing and how to get it, instead of falling back to the guards.

All: RLIMIT_CPU (CPU seconds), RLIMIT_AS (address space: an allocation past it is a MemoryError),
RLIMIT_FSIZE (largest file), RLIMIT_NPROC, RLIMIT_NOFILE, no core files.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

BOOT = Path(__file__).with_name("sandbox_boot.py")
SETUP_FAILED = 121
ISOLATIONS = ("auto", "namespaces", "unsafe_process")
UNSAFE = "unsafe_process"
MIB = 1 << 20
DRAIN_S = 2.0  # after the launcher is gone: how long output is still read before the pipe is closed


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use. wall_s: seconds of real time; cpu_s: CPU seconds (RLIMIT_CPU, whole
    seconds, at least 1); memory_mb: address space (RLIMIT_AS); disk_mb: the tmpfs the folder and /tmp
    live on (namespaces) and the largest file (RLIMIT_FSIZE, both isolations); processes: RLIMIT_NPROC
    of the sandbox user (namespaces); max_output_bytes: stdout + stderr kept; python_packages: the
    training environment's installed packages (read-only) are importable; isolation: auto | namespaces
    | unsafe_process."""

    wall_s: float = 30.0
    cpu_s: float = 30.0
    memory_mb: int = 1024
    disk_mb: int = 64
    processes: int = 64
    max_output_bytes: int = 65536
    python_packages: bool = True
    isolation: str = "auto"


@dataclass
class SandboxResult:
    """One run: `output` is stdout and stderr as written (decoded as UTF-8, cut at max_output_bytes);
    `exit_code` the code's exit status (128 + N: killed by signal N; None: stopped at the wall clock);
    `timed_out`: stopped at the wall clock; `isolation`: what isolated it."""

    output: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    isolation: str
    seconds: float


_NAMESPACES: str | None = None  # None: not probed yet; "": they work; else why not
_NAMESPACE_LOCK = threading.Lock()
HOW_TO_GET = (
    "run the trainer as root, or allow unprivileged user namespaces (sysctl "
    "user.max_user_namespaces > 0; on Debian kernel.unprivileged_userns_clone=1; on Ubuntu 23.10+ "
    "kernel.apparmor_restrict_unprivileged_userns=0), and in a container allow the unshare, mount and "
    "seccomp calls (e.g. docker run --privileged, or --security-opt seccomp=unconfined "
    "--security-opt apparmor=unconfined)"
)


def _readonly_paths(python_packages: bool) -> list[str]:
    """What the code may read: the system's /usr, the host Python's installation, with python_packages
    the environment (venv) it runs in, and the dynamic loader's cache."""
    paths = ["/usr", os.path.realpath(sys.base_prefix), "/etc/ld.so.cache", "/etc/localtime"]
    if python_packages and os.path.realpath(sys.prefix) not in paths:
        paths.append(os.path.realpath(sys.prefix))
    exe = os.path.realpath(sys.executable)
    if not any(exe.startswith(p.rstrip("/") + "/") for p in paths):
        paths.append(os.path.dirname(exe))
    # a folder inside another one already bound (a Python under /usr) needs no bind of its own
    return [
        p
        for i, p in enumerate(paths)
        if not any(p.startswith(q.rstrip("/") + "/") or (p == q and j < i) for j, q in enumerate(paths) if j != i)
    ]


def _python(python_packages: bool) -> str:
    """The interpreter the code runs on: the environment's (its packages importable) or the base one.
    The environment's is named through its real folder (a venv reached through a symlinked folder is
    bound at its real path, where the symlink does not exist), keeping the file's own name: a venv's
    bin/python is itself a link, and following it would leave the venv."""
    if not python_packages:
        return os.path.realpath(sys.executable)
    return os.path.join(os.path.realpath(os.path.dirname(sys.executable)), os.path.basename(sys.executable))


def namespaces_problem() -> str:
    """Why the namespace isolation cannot run here ("" when it can): the real setup is tried once per
    process on a one-line program."""
    global _NAMESPACES
    with _NAMESPACE_LOCK:
        if _NAMESPACES is None:
            if not sys.platform.startswith("linux"):
                _NAMESPACES = f"namespaces exist on Linux only (this is {sys.platform})"
            else:
                probe = _run("print('ok')", SandboxLimits(wall_s=30, cpu_s=10), "namespaces")
                ok = probe.exit_code == 0 and probe.output.strip() == "ok"
                _NAMESPACES = "" if ok else (probe.output.strip()[-300:] or f"exit status {probe.exit_code}")
                if not ok:
                    log.warning("sandbox: the namespace isolation cannot run here: %s", _NAMESPACES)
        return _NAMESPACES


def namespaces_work() -> bool:
    """Whether the namespace isolation runs here (`namespaces_problem`)."""
    return namespaces_problem() == ""


def active_isolation(requested: str = "auto") -> str:
    """The isolation a run gets: namespaces (auto or namespaces), or unsafe_process when asked for by
    that name. Raises RuntimeError naming what is missing, and how to get it, when namespaces cannot run."""
    if requested == "process":
        raise ValueError(
            "isolation: process is no boundary (model-written code can defeat its Python-level "
            "guards) and is not chosen by that name any more; use auto or namespaces, or say "
            "isolation: unsafe_process to run model code without an operating-system boundary"
        )
    if requested not in ISOLATIONS:
        raise ValueError(f"isolation is {requested!r}; one of {', '.join(ISOLATIONS)}")
    if requested == UNSAFE:
        return UNSAFE
    problem = namespaces_problem()
    if problem:
        raise RuntimeError(
            f"isolation: {requested} needs the namespace sandbox (user, mount, PID and network "
            f"namespaces with a seccomp filter), which cannot run here: {problem}. To get it: "
            f"{HOW_TO_GET}. Or, knowing model-written code then runs with only Python-level guards "
            f"that it can defeat, set isolation: {UNSAFE}"
        )
    return "namespaces"


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run `code` as a Python program in a fresh sandbox; never raises for anything the code does."""
    return _run(code, limits, active_isolation(limits.isolation))


class _Reader(threading.Thread):
    """Reads a pipe until its end or until `stop` is set, keeping the first `cap` bytes (a program
    printing without end cannot fill the host's memory; a process holding the pipe open cannot hold the
    reader)."""

    def __init__(self, pipe, cap: int):
        super().__init__(daemon=True)
        self.fd, self.cap, self.kept, self.dropped = pipe.fileno(), cap, bytearray(), 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            room = self.cap - len(self.kept)
            self.kept += chunk[: max(room, 0)]
            self.dropped += max(len(chunk) - max(room, 0), 0)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _run(code: str, limits: SandboxLimits, isolation: str) -> SandboxResult:
    start = time.monotonic()
    folder = tempfile.mkdtemp(prefix="verl_npu_sandbox_")
    spec = {
        "isolation": isolation,
        "cpu_s": max(1, int(round(limits.cpu_s))),
        "memory_bytes": int(limits.memory_mb) * MIB,
        "file_bytes": int(limits.disk_mb) * MIB,
        "disk_bytes": int(limits.disk_mb) * MIB,
        "processes": int(limits.processes),
        "readonly": _readonly_paths(limits.python_packages),
        "python": _python(limits.python_packages),
        "root": folder,
        "folder": folder,
    }
    timed_out = False
    try:
        # start_new_session: the launcher leads its own process group, which a time-out kills whole
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", str(BOOT), json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            cwd=folder,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )
        reader = _Reader(proc.stdout, int(limits.max_output_bytes))
        reader.start()
        try:
            proc.stdin.write(code.encode("utf-8", errors="replace"))
            proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            exit_code = proc.wait(timeout=max(float(limits.wall_s), 0.1))
            if exit_code < 0:  # killed by a signal (the process isolation runs the code in the launcher)
                exit_code = 128 - exit_code
        except subprocess.TimeoutExpired:
            timed_out = True
            if isolation == "namespaces":  # the launcher kills the namespace's init and reaps it
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            _kill_group(proc)
            proc.wait()
            exit_code = None
        else:
            _kill_group(proc)  # anything the code left in the group (process isolation)
        # the launcher is gone; a process it left (unsafe_process: a new session) may still hold the pipe
        reader.join(timeout=DRAIN_S)
        reader.stop.set()
        reader.join()
        proc.stdout.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    output = bytes(reader.kept).decode("utf-8", errors="replace")
    if exit_code == SETUP_FAILED and output.startswith("sandbox setup failed"):
        log.warning("sandbox: %s", output.strip())
    return SandboxResult(output, exit_code, timed_out, reader.dropped > 0, isolation, time.monotonic() - start)
