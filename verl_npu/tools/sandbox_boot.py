"""The sandbox's launcher, run as a script by the host Python (`python -I sandbox_boot.py SPEC_JSON`,
the code on stdin); standard library only, never imported by verl_npu. `verl_npu.tools.sandbox` starts
it, enforces the wall clock, reads the output and deletes the folder.

isolation "namespaces" (root, Linux): this process unshares new mount, network, PID, IPC and UTS
namespaces and forks the namespace's init, which
  - mounts a size-limited tmpfs as the new root, binds /usr (and the host Python's folders) into it
    read-only, a few /dev nodes and a /proc of the new PID namespace, makes /sandbox (the working
    folder, HOME) and /tmp, and chroots there;
  - drops to user nobody (65534) with no capabilities and no_new_privs, asks to be killed if this
    launcher dies, sets the resource limits, and forks the Python that runs the code;
  - exits when that Python exits: the kernel then kills every process left in the namespace.
The network namespace has only a loopback device that is down: no socket reaches anything.

isolation "process" (fallback): this process sets the resource limits, moves into the working folder,
installs an audit hook (Python's `sys.addaudithook`, which code cannot remove) that refuses sockets,
new processes, ctypes, and file access outside the folder (reads: also /usr and the Python
installation), then runs the code in-process. It binds Python code only: a C extension can bypass it.

Exit status: the code's own (128 + signal number when a signal killed it); 121 with a message on stderr
when the isolation could not be set up.
"""

import ctypes
import json
import os
import resource
import signal
import sys

SETUP_FAILED = 121
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
NOBODY = 65534
DEVICES = ("null", "zero", "random", "urandom")
ROOT_LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin"}

libc = ctypes.CDLL(None, use_errno=True)


def fail(what):
    sys.stderr.write(f"sandbox setup failed: {what}\n")
    sys.stderr.flush()
    os._exit(SETUP_FAILED)


def check(result, what):
    if result != 0:
        fail(f"{what}: {os.strerror(ctypes.get_errno())}")


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
          f"mount {source} on {target}")


def set_limits(spec):
    limits = [(resource.RLIMIT_CPU, spec["cpu_s"], spec["cpu_s"] + 1),
              (resource.RLIMIT_AS, spec["memory_bytes"], spec["memory_bytes"]),
              (resource.RLIMIT_FSIZE, spec["file_bytes"], spec["file_bytes"]),
              (resource.RLIMIT_NPROC, spec["processes"], spec["processes"]),
              (resource.RLIMIT_NOFILE, 256, 256),
              (resource.RLIMIT_CORE, 0, 0)]
    for which, soft, hard in limits:
        resource.setrlimit(which, (soft, hard))


def status_code(status):
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def wait_for(pid):
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status_code(status)
        except InterruptedError:
            continue


def env_for(home, tmp):
    return {"HOME": home, "TMPDIR": tmp, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
           "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


# ---------------------------------------------------------------- namespaces
def bind_readonly(root, path):
    target = root + path
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    mount(path, target, None, MS_BIND | MS_REC)
    mount(path, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def namespace_init(spec, code):
    """pid 1 of the new namespaces: build the root, drop privileges, run the code, exit with its status."""
    root = spec["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here propagates to the host
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['disk_bytes']},mode=755")
    for name, target in ROOT_LINKS.items():
        if os.path.islink("/" + name):  # merged /usr: /lib -> usr/lib
            os.symlink(target, os.path.join(root, name))
        elif os.path.isdir("/" + name):  # a system without merged /usr: its own /lib, /bin
            bind_readonly(root, "/" + name)
    for path in spec["readonly"]:
        if os.path.exists(path):
            bind_readonly(root, path)
    os.makedirs(root + "/dev", exist_ok=True)
    for dev in DEVICES:
        open(f"{root}/dev/{dev}", "a").close()
        mount(f"/dev/{dev}", f"{root}/dev/{dev}", None, MS_BIND)
    os.makedirs(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for folder, mode in (("/sandbox", 0o700), ("/tmp", 0o1777)):
        os.makedirs(root + folder)
        os.chmod(root + folder, mode)
        os.chown(root + folder, NOBODY, NOBODY)
    with open(root + "/sandbox/main.py", "w", encoding="utf-8") as f:
        f.write(code)
    os.chown(root + "/sandbox/main.py", NOBODY, NOBODY)
    os.chdir(root)
    os.chroot(root)
    os.chdir("/sandbox")
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)  # drops every capability: no mount, no chroot escape, no raw sockets
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    # after the uid change (which clears it): die with the launcher, which the host kills on time-out
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
    set_limits(spec)
    child = os.fork()
    if child == 0:
        fd = os.open("/dev/null", os.O_RDONLY)
        os.dup2(fd, 0)
        os.execve(spec["python"], [spec["python"], "-I", "-B", "/sandbox/main.py"], env_for("/sandbox", "/tmp"))
    os._exit(wait_for(child))


def run_namespaces(spec, code):
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    pid = os.fork()  # the first child of a new PID namespace is its init
    if pid == 0:
        try:
            namespace_init(spec, code)
        except BaseException as err:  # noqa: BLE001 - any setup error is reported, never a traceback
            fail(f"{type(err).__name__}: {err}")
    # the host's time-out: SIGTERM here kills the init (and with it the namespace), which is then reaped
    # here rather than left a zombie of the host's init
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    os._exit(wait_for(pid))


# ---------------------------------------------------------------- process (fallback)
def audit_guard(folder, readable):
    """An audit hook refusing sockets, new processes, ctypes and file access outside `folder` (reads
    also under `readable`)."""
    folder = os.path.realpath(folder)
    readable = tuple(os.path.realpath(p) for p in readable)
    banned = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
              "os.forkpty", "pty.", "ctypes.", "os.kill", "os.killpg", "signal.pthread_kill", "os.chroot")
    path_events = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown", "os.symlink",
                   "os.link", "os.truncate", "os.utime", "os.listdir", "os.scandir", "os.chdir", "shutil.rmtree",
                   "os.listxattr", "os.getxattr", "os.setxattr", "os.removexattr", "glob.glob", "shutil.copyfile"}

    def inside(path, allowed):
        if isinstance(path, int):
            return True
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return any(real == a or real.startswith(a.rstrip("/") + "/") for a in allowed)

    def hook(event, args):
        if event.startswith(banned):
            raise PermissionError(f"the sandbox does not allow {event}")
        if event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            if path is None:
                return
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))
            if not inside(path, (folder,) if writing else (folder, *readable)):
                raise PermissionError(f"the sandbox does not allow opening {path!r} outside its folder")
        elif event in path_events:
            paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
            allowed = (folder, *readable) if event in ("os.listdir", "os.scandir", "glob.glob") else (folder,)
            if any(not inside(p, allowed) for p in paths):
                raise PermissionError(f"the sandbox does not allow {event} outside its folder")

    sys.addaudithook(hook)


def run_process(spec, code):
    folder = spec["folder"]
    os.makedirs(folder + "/tmp", exist_ok=True)
    with open(folder + "/main.py", "w", encoding="utf-8") as f:
        f.write(code)
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.chdir(folder)
    os.environ.clear()
    os.environ.update(env_for(folder, folder + "/tmp"))
    set_limits(spec)
    sys.path[:0] = [folder]
    import runpy
    import traceback

    audit_guard(folder, spec["readonly"])
    try:
        runpy.run_path(folder + "/main.py", run_name="__main__")
    except SystemExit as e:
        code = e.code
        if code is None or isinstance(code, int):
            sys.stdout.flush()
            os._exit(code or 0)
        sys.stderr.write(f"{code}\n")
        sys.stderr.flush()
        os._exit(1)
    except BaseException:  # noqa: BLE001 - the code's traceback is its output
        # the launcher's own frames (runpy, the audit hook) left out: the model sees its code's traceback
        frames = [fr for fr in traceback.extract_tb(sys.exc_info()[2])
                  if fr.filename != __file__ and "runpy" not in fr.filename]
        sys.stderr.write("Traceback (most recent call last):\n")
        sys.stderr.write("".join(traceback.format_list(frames)))
        sys.stderr.write("".join(traceback.format_exception_only(*sys.exc_info()[:2])))
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    spec = json.loads(sys.argv[1])
    code = sys.stdin.read()
    if spec["isolation"] == "namespaces":
        run_namespaces(spec, code)
    else:
        run_process(spec, code)


if __name__ == "__main__":
    main()
