"""Escapes from the code sandbox, each tried as a hostile model would (issue 36): every one of them
succeeds against the Python-level guards (`isolation: unsafe_process`, the old `process` mode) and
each test here asserts it fails against the isolation a code tool now gets (`auto`: the namespace
sandbox). To see them succeed, run this file with VERL_NPU_ESCAPE_ISOLATION=unsafe_process: every test
then fails.

The "trainer" is a separate Python process (`TRAINER`) holding secrets in its environment, as a real
trainer holds WANDB_API_KEY / HF_TOKEN; it runs one sandboxed call and prints the result as JSON. The
only network traffic is to a 127.0.0.1 listener the test starts, with a time limit."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from test_sandbox import host_processes_with

from verl_npu.tools.sandbox import SandboxLimits, namespaces_problem, namespaces_work

ISOLATION = os.environ.get("VERL_NPU_ESCAPE_ISOLATION", "auto")
ROOT = Path(__file__).resolve().parents[2]
# as root on Linux (CI) the namespace sandbox must work: a broken one fails here instead of skipping
pytestmark = pytest.mark.skipif(
    ISOLATION != "unsafe_process"
    and not namespaces_work()
    and not (sys.platform.startswith("linux") and os.geteuid() == 0),
    reason="no namespace sandbox here (needs root, or unprivileged user namespaces)",
)
SECRET = "hf_SECRET_" + uuid.uuid4().hex
TRAINER = """
import json, sys
from verl_npu.tools.sandbox import SandboxLimits, run_python
limits = SandboxLimits(**json.loads(sys.argv[1]))
r = run_python(sys.stdin.read(), limits)
print(json.dumps({"output": r.output, "exit_code": r.exit_code, "timed_out": r.timed_out,
                  "isolation": r.isolation, "seconds": r.seconds}))
"""


def run_in_trainer(code: str, deadline: float = 60, **limits) -> tuple[dict | None, int]:
    """(the sandboxed call's result, the trainer's exit status): None when the trainer died or froze."""
    spec = {"wall_s": 10, "cpu_s": 10, "isolation": ISOLATION, **limits}
    env = {**os.environ, "WANDB_API_KEY": SECRET, "HF_TOKEN": SECRET}
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER, json.dumps(spec)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, _ = proc.communicate(textwrap.dedent(code).encode(), timeout=deadline)
    except subprocess.TimeoutExpired:  # frozen (SIGSTOP) or held
        proc.kill()
        proc.communicate()
        return None, -999
    lines = out.decode(errors="replace").strip().splitlines()
    return (json.loads(lines[-1]) if proc.returncode == 0 and lines else None), proc.returncode


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


DISARM = """
import gc
def disarm():
    # the Python-level guard is a closure: rewrite what it allows
    for o in gc.get_objects():
        if type(o).__name__ == "function" and o.__name__ == "hook" and o.__closure__:
            for name, cell in zip(o.__code__.co_freevars, o.__closure__):
                if name == "banned":
                    cell.cell_contents = ("never-matches",)
                elif name == "folder":
                    cell.cell_contents = "/"
                elif name == "readable":
                    cell.cell_contents = ("/",)
                elif name == "path_events":
                    cell.cell_contents = set()
            return "guard disarmed"
    return "no guard found"
print(disarm())
"""


def test_guard_rewriting_then_secrets_network_and_a_daemon():
    """gc.get_objects() finds the guard and rewrites it; then the code reads the trainer's secrets from
    /proc/<ppid>/environ (and every other visible process's), connects to a 127.0.0.1 listener and
    leaves a daemon behind."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    marker = f"4242.{uuid.uuid4().int % 10**6}"
    code = (
        DISARM
        + f"""
import os, socket, subprocess
for pid in {{os.getppid(), 1, *[p for p in os.listdir("/proc") if p.isdigit()]}}:
    try:
        print("ENV", pid, open(f"/proc/{{pid}}/environ", "rb").read().replace(b"\\0", b" ").decode())
    except Exception as e:
        print("environ refused", pid, type(e).__name__)
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    print("CONNECTED")
except Exception as e:
    print("connect failed:", type(e).__name__)
try:
    subprocess.Popen(["sleep", "{marker}"], start_new_session=True, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    print("daemon started")
except Exception as e:
    print("daemon refused:", type(e).__name__)
"""
    )
    try:
        result, status = run_in_trainer(code)
        try:
            server.accept()
            accepted = True
        except TimeoutError:
            accepted = False
    finally:
        server.close()
    time.sleep(0.5)
    left = host_processes_with(f"sleep {marker}")
    kill_all(left)
    assert status == 0 and result is not None
    out = result["output"]
    assert SECRET not in out, "the trainer's secrets were read"
    assert "CONNECTED" not in out and not accepted, "the code reached a host listener"
    assert left == [], "a process of the call outlived it"
    assert result["isolation"] == "namespaces"


def test_dir_fd_outside_the_folder():
    """os.open with a relative path and dir_fd of /usr, from a working folder where the path seems to
    stay inside, writes the host's /tmp under the guards."""
    name = f"verl_npu_escape_{uuid.uuid4().hex}"
    host_file = Path(tempfile.gettempdir(), name)
    code = f"""
import os
os.makedirs("tmp", exist_ok=True)
os.chdir("tmp")
try:
    fd = os.open("../tmp/{name}", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=os.open("/usr", os.O_RDONLY))
    os.write(fd, b"escaped")
    print("wrote")
except Exception as e:
    print("refused:", type(e).__name__)
"""
    try:
        result, status = run_in_trainer(code)
        assert status == 0 and result is not None
        assert not host_file.exists(), "the code wrote outside its sandbox"
    finally:
        host_file.unlink(missing_ok=True)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd_open on this platform")
def test_pidfd_signals_cannot_reach_the_trainer():
    """pidfd_send_signal(pidfd_open(getppid()), SIGSTOP then SIGKILL): the trainer must stay alive and
    answer."""
    code = """
import os, signal
for sig in (signal.SIGSTOP, signal.SIGKILL):
    try:
        signal.pidfd_send_signal(os.pidfd_open(os.getppid()), sig)
        print("sent", sig)
    except Exception as e:
        print("refused:", type(e).__name__)
"""
    result, status = run_in_trainer(code, deadline=40)
    assert status == 0 and result is not None, f"the trainer was stopped or killed (status {status})"


def test_setsid_daemons_neither_survive_nor_hold_the_output():
    """A session leader started with _posixsubprocess.fork_exec(call_setsid=True) (no audit event) keeps
    the call's stdout open: the call must end at its wall clock plus the drain time, and no process of
    it may survive."""
    marker = f"3131.{uuid.uuid4().int % 10**6}"
    code = f"""
import _posixsubprocess, os, subprocess, sys
args = [b"/bin/sleep", b"{marker}"]
base = (args, [b"/bin/sleep"], False, (), None, None, -1, -1, -1, -1, -1, -1, *os.pipe(), False, True)
for tail in ((-1, None, None, None, -1, None, False), (-1, None, None, None, -1, None)):  # 3.12+, 3.11
    try:
        _posixsubprocess.fork_exec(*base, *tail)
        print("daemon started", flush=True)
        break
    except TypeError:
        continue
    except Exception as e:
        print("refused:", type(e).__name__, e, flush=True)
        break
"""
    t0 = time.monotonic()
    result, status = run_in_trainer(code, wall_s=4)
    took = time.monotonic() - t0
    time.sleep(0.5)
    left = host_processes_with(f"sleep {marker}")
    kill_all(left)
    assert status == 0 and result is not None
    assert left == [], "a process of the call outlived it"
    assert took < 4 + 2 + 15, f"the call took {took:.0f} s"  # wall clock + drain + start-up on a busy machine


def test_disk_limit_covers_the_whole_writable_filesystem():
    """Many files each under disk_limit_mb: together they may not pass it."""
    code = """
import os
written = 0
try:
    for i in range(12):
        with open(f"part{i}.bin", "wb") as f:
            for _ in range(4):
                f.write(b"x" * (1 << 20))
                f.flush()
                written += 1 << 20
except OSError as e:
    print("stopped:", e.strerror)
print("written", written)
"""
    result, status = run_in_trainer(code, disk_mb=8)
    assert status == 0 and result is not None
    written = int(result["output"].split("written")[-1])
    assert written <= 8 << 20, f"{written >> 20} MiB written with disk_limit_mb=8"
    assert "No space left on device" in result["output"]


def test_the_probe_works_with_the_venv_under_tmp(tmp_path):
    """A venv under /tmp (binds under the sandbox's own /tmp) used to make the probe fail with
    FileExistsError, and `auto` then silently chose the Python-level guards."""
    if ISOLATION == "unsafe_process":
        pytest.skip("a probe of the namespace sandbox")
    venv = Path(tempfile.mkdtemp(prefix="verl_npu_venv_"))
    venv.chmod(0o755)  # as `python -m venv /tmp/x` makes it: the sandbox's user must be able to run it
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        probe = (
            "from verl_npu.tools.sandbox import namespaces_problem, run_python, SandboxLimits\n"
            "import sys\nprint(sys.prefix)\nprint(repr(namespaces_problem()))\n"
            "print(run_python('import sys; print(sys.prefix)', SandboxLimits(wall_s=20)).output.strip())\n"
        )
        out = subprocess.run(
            [str(venv / "bin" / "python"), "-c", probe],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert out.returncode == 0, out.stderr[-2000:]
        prefix, problem, inside = out.stdout.strip().splitlines()
        assert prefix == str(venv) and problem == "''" and inside == str(venv)
    finally:
        subprocess.run(["rm", "-rf", str(venv)], check=False)
    assert namespaces_problem() == ""
    assert SandboxLimits().isolation == "auto"


def test_the_seccomp_filter_refuses_namespace_mount_and_trace_calls():
    """Inside the sandbox: no capabilities, no_new_privs, a seccomp filter; unshare (a new user namespace
    would give the code capabilities over new namespaces), mount, ptrace and clone with a namespace flag
    fail with EPERM, while ordinary threads and processes still start."""
    if ISOLATION == "unsafe_process":
        pytest.skip("the filter of the namespace sandbox")
    code = """
import ctypes, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(result):
    return ctypes.get_errno() if result == -1 else 0
print("unshare", errno_of(libc.unshare(0x10000000)))
print("mount", errno_of(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)))
print("ptrace", errno_of(libc.ptrace(0, 0, None, None)))
status = open("/proc/self/status").read()
print([line.split()[1] for line in status.splitlines() if line.split()[0] in ("CapEff:", "NoNewPrivs:", "Seccomp:")])
t = threading.Thread(target=lambda: print("thread ran")); t.start(); t.join()
print(subprocess.run(["echo", "child ran"], capture_output=True, text=True).stdout.strip())
"""
    result, status = run_in_trainer(code)
    assert status == 0 and result is not None, result
    out = result["output"].splitlines()
    assert out[:3] == ["unshare 1", "mount 1", "ptrace 1"], result["output"]
    assert out[3] == "['0000000000000000', '1', '2']"
    assert out[4:] == ["thread ran", "child ran"]


def test_the_seccomp_tables_match_the_kernel_headers():
    """The syscall numbers of the filter, for both architectures, against this machine's headers."""
    import re

    sys.path.insert(0, str(ROOT / "verl_npu" / "tools"))
    try:
        import sandbox_boot
    finally:
        sys.path.pop(0)
    headers = {0: Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"), 1: Path("/usr/include/asm-generic/unistd.h")}
    checked = 0
    for column, header in headers.items():
        if not header.is_file():
            continue
        text = header.read_text()
        for name, numbers in sandbox_boot.DENIED.items():
            if numbers[column] is None:
                continue
            found = re.search(rf"#define __NR(?:3264)?_{name}\s+(\d+)\b", text)
            assert found and int(found.group(1)) == numbers[column], (header, name)
            checked += 1
    if not checked:
        pytest.skip("no kernel headers here (linux-libc-dev)")
    for machine in sandbox_boot.ARCHES:
        assert len(sandbox_boot.seccomp_filter(machine)) > 2 * len(sandbox_boot.DENIED) - 4
