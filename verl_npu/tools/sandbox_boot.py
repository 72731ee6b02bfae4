"""The sandbox's launcher, run as a script by the host Python (`python -I sandbox_boot.py SPEC_JSON`,
the code on stdin); standard library only, never imported by verl_npu. `verl_npu.tools.sandbox` starts
it, enforces the wall clock, reads the output and deletes the folder.

isolation "namespaces" (Linux; root or a user allowed to create user namespaces): this launcher forks a
child that unshares new user, mount, network, PID, IPC and UTS namespaces; the launcher maps the
child's root to the unprivileged host user nobody (65534; when the launcher is not root: to its own
user, the only mapping the kernel allows it), and the child forks the PID namespace's init, which
  - mounts a tmpfs of `disk_bytes` as the new root (the sandbox's whole writable filesystem: /sandbox,
    its working folder and HOME, and /tmp), binds /usr, the host Python's folders and a few /dev nodes
    into it read-only (through descriptors the launcher opened, so no host folder needs to be
    searchable by nobody), mounts a /proc of the new PID namespace, and chroots there;
  - gives up every capability for good (bounding set, securebits, capset), sets no_new_privs, asks to
    be killed if its parent dies, sets the resource limits, installs a seccomp filter (`seccomp_filter`:
    no ptrace, process_vm_*, mount, namespace changes, kernel keyring, BPF, perf, module or reboot
    calls) and forks the Python that runs the code;
  - exits when that Python exits: the kernel then kills every process left in the namespace.
The network namespace has only a loopback device that is down: no socket reaches anything, the host's
127.0.0.1 included. No host process is visible (PID namespace), so none can be signalled or traced.

isolation "unsafe_process" (only when the user asks for it by that name): this process sets the
resource limits, moves into the working folder, installs an audit hook (`sys.addaudithook`) that
refuses sockets, new processes, ctypes, and file access outside the folder for Python code, then runs
the code in-process. That is no boundary: code can defeat it (docs/agents.md lists how).

Exit status: the code's own (128 + signal number when a signal killed it); 121 with a message on stderr
when the isolation could not be set up.
"""

import ctypes
import json
import os
import platform
import resource
import signal
import struct
import sys

SETUP_FAILED = 121
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NEW_NAMESPACES = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_SECCOMP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS = 1, 24, 22, 28, 38
SECBITS_LOCKED_NOROOT = 0xE3  # noroot, no_cap_ambient_raise set, keep_caps off; each locked
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
    check(
        libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        f"mount {source} on {target}",
    )


def set_limits(spec):
    limits = [
        (resource.RLIMIT_CPU, spec["cpu_s"], spec["cpu_s"] + 1),
        (resource.RLIMIT_AS, spec["memory_bytes"], spec["memory_bytes"]),
        (resource.RLIMIT_FSIZE, spec["file_bytes"], spec["file_bytes"]),
        (resource.RLIMIT_NPROC, spec["processes"], spec["processes"]),
        (resource.RLIMIT_NOFILE, 256, 256),
        (resource.RLIMIT_CORE, 0, 0),
    ]
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
    return {
        "HOME": home,
        "TMPDIR": tmp,
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }


# ---------------------------------------------------------------- seccomp
# the calls the sandbox may not make: name -> (x86_64 number: asm/unistd_64.h, aarch64: asm-generic/unistd.h)
DENIED = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "unshare": (272, 97),
    "setns": (308, 268),
    "chroot": (161, 51),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "userfaultfd": (323, 282),
    "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264),
    "reboot": (169, 142),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "syslog": (103, 116),
    "acct": (163, 89),
    "settimeofday": (164, 170),
    "clock_settime": (227, 112),
    "pidfd_getfd": (438, 438),
    "io_uring_setup": (425, 425),
    "fsopen": (430, 430),
    "fsmount": (432, 432),
    "move_mount": (429, 429),
    "open_tree": (428, 428),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "personality": (135, 92),
    "vhangup": (153, 58),
    "quotactl": (179, 60),
    "iopl": (172, None),
    "ioperm": (173, None),
}
#: per architecture: its seccomp audit value, the column of DENIED, and the numbers of clone and clone3
ARCHES = {"x86_64": (0xC000003E, 0, 56, 435), "aarch64": (0xC00000B7, 1, 220, 435)}
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
LD_ABS_W, JEQ_K, JSET_K, JGE_K, RET_K = 0x20, 0x15, 0x45, 0x35, 0x06
EPERM, ENOSYS = 1, 38


def seccomp_filter(machine=None):
    """The BPF program (a list of (code, jt, jf, k)): a call from another architecture kills the process;
    the DENIED calls fail with EPERM; clone with a namespace flag fails with EPERM; clone3 (whose flags
    the filter cannot read) fails with ENOSYS, so the C library falls back to clone; the rest is allowed."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise OSError(f"no seccomp syscall table for the {machine} architecture (x86_64 and aarch64 have one)")
    arch, column, clone_nr, clone3_nr = ARCHES[machine]
    denied = {name: numbers[column] for name, numbers in DENIED.items() if numbers[column] is not None}
    prog = [(LD_ABS_W, 0, 0, 4), (JEQ_K, 1, 0, arch), (RET_K, 0, 0, RET_KILL_PROCESS), (LD_ABS_W, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI's numbers (bit 30) would bypass the table
        prog += [(JGE_K, 0, 1, 0x40000000), (RET_K, 0, 0, RET_ERRNO | EPERM)]
    for nr in sorted(denied.values()):
        prog += [(JEQ_K, 0, 1, nr), (RET_K, 0, 0, RET_ERRNO | EPERM)]
    prog += [
        (JEQ_K, 0, 1, clone3_nr),
        (RET_K, 0, 0, RET_ERRNO | ENOSYS),
        (JEQ_K, 0, 3, clone_nr),
        (LD_ABS_W, 0, 0, 16),  # clone's flags: the low half of args[0]
        (JSET_K, 0, 1, NEW_NAMESPACES),
        (RET_K, 0, 0, RET_ERRNO | EPERM),
        (RET_K, 0, 0, RET_ALLOW),
    ]
    return prog


def install_seccomp():
    prog = seccomp_filter()
    raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Fprog(len(prog), ctypes.addressof(buf))
    check(libc.prctl(PR_SET_SECCOMP, 2, ctypes.byref(fprog), 0, 0), "seccomp filter")


def drop_capabilities(uid):
    """Every capability gone for good: the bounding set emptied, securebits so that running a program as
    root grants none, the user changed to `uid` (None: stay), and the process's own sets cleared."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # EINVAL: past the last capability this kernel knows
    check(libc.prctl(PR_SET_SECUREBITS, SECBITS_LOCKED_NOROOT, 0, 0, 0), "securebits")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    header = struct.pack("=Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    check(libc.capset(ctypes.c_char_p(header), ctypes.c_char_p(bytes(24))), "capset")


# ---------------------------------------------------------------- namespaces
def bind_readonly(root, path):
    target = root + path
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    # flags of the host's mount kept (in a user namespace the kernel refuses to clear them)
    keep = MS_NOEXEC if os.statvfs(path).f_flag & os.ST_NOEXEC else 0
    mount(path, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | keep)


def namespace_init(spec, code, privileged):
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
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # exist_ok: a read-only folder bound above may live under /tmp (a venv in /tmp)
    for folder, mode in (("/sandbox", 0o700), ("/tmp", 0o1777)):
        os.makedirs(root + folder, exist_ok=True)
        os.chmod(root + folder, mode)
        if privileged:
            os.chown(root + folder, NOBODY, NOBODY)
    with open(root + "/sandbox/main.py", "w", encoding="utf-8") as f:
        f.write(code)
    os.chdir(root)
    os.chroot(root)
    os.chdir("/sandbox")
    drop_capabilities(NOBODY if privileged else None)  # a root launcher: the code runs as (host) nobody
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
    set_limits(spec)
    install_seccomp()
    child = os.fork()
    if child == 0:
        fd = os.open("/dev/null", os.O_RDONLY)
        os.dup2(fd, 0)
        os.execve(spec["python"], [spec["python"], "-I", "-B", "/sandbox/main.py"], env_for("/sandbox", "/tmp"))
    os._exit(wait_for(child))


def map_user(pid):
    """The child's user namespace. A root launcher maps root to root (the setup may search the host's
    folders, e.g. a Python under /root) and nobody to nobody, whom the code runs as; an unprivileged one
    may map only its own user, as root there (the code then runs without any capability), and must deny
    setgroups first. Returns whether the namespace has nobody (the launcher is root)."""
    privileged = os.geteuid() == 0
    if privileged:
        maps = (("uid_map", f"0 0 1\n{NOBODY} {NOBODY} 1"), ("gid_map", f"0 0 1\n{NOBODY} {NOBODY} 1"))
    else:
        maps = (("setgroups", "deny"), ("uid_map", f"0 {os.geteuid()} 1"), ("gid_map", f"0 {os.getegid()} 1"))
    for name, text in maps:
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(text)
    return privileged


def run_namespaces(spec, code):
    to_child_r, to_child_w = os.pipe()
    to_host_r, to_host_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(to_child_w)
            os.close(to_host_r)
            check(libc.unshare(NEW_NAMESPACES), "unshare")
            os.write(to_host_w, b"u")
            mapped = os.read(to_child_r, 1)
            if mapped not in (b"r", b"u"):
                fail("the launcher could not map the user namespace")
            os.setgid(0)
            os.setuid(0)
            check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
            init = os.fork()  # the first child of a new PID namespace is its init
            if init == 0:
                os.closerange(3, 1024)  # the launcher's pipes stay outside
                namespace_init(spec, code, mapped == b"r")
            os.write(to_host_w, b"%d\n" % init)  # the launcher kills it on a time-out
            os._exit(wait_for(init))
        except BaseException as err:  # noqa: BLE001 - any setup error is reported, never a traceback
            fail(f"{type(err).__name__}: {err}")
    os.close(to_child_r)
    os.close(to_host_w)
    # the host's time-out: SIGTERM here kills the namespace's init (with it every process in the
    # namespace; before it exists: the child); the child reaps the init, this launcher the child
    init = []
    signal.signal(signal.SIGTERM, lambda *_: os.kill(init[0] if init else pid, signal.SIGKILL))
    if os.read(to_host_r, 1) == b"u":
        try:
            privileged = map_user(pid)
        except OSError as err:
            os.kill(pid, signal.SIGKILL)
            wait_for(pid)
            fail(f"mapping the user namespace: {err}")
        os.write(to_child_w, b"r" if privileged else b"u")
        line = b""
        while not line.endswith(b"\n"):
            chunk = os.read(to_host_r, 16)
            if not chunk:
                break
            line += chunk
        if line.strip().isdigit():
            init.append(int(line))
    os._exit(wait_for(pid))


# ---------------------------------------------------------------- process (fallback)
def audit_guard(folder, readable):
    """An audit hook refusing sockets, new processes, ctypes and file access outside `folder` (reads
    also under `readable`)."""
    folder = os.path.realpath(folder)
    readable = tuple(os.path.realpath(p) for p in readable)
    banned = (
        "socket.",
        "subprocess.",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "pty.",
        "ctypes.",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
        "os.chroot",
    )
    path_events = {
        "os.remove",
        "os.rename",
        "os.mkdir",
        "os.rmdir",
        "os.chmod",
        "os.chown",
        "os.symlink",
        "os.link",
        "os.truncate",
        "os.utime",
        "os.listdir",
        "os.scandir",
        "os.chdir",
        "shutil.rmtree",
        "os.listxattr",
        "os.getxattr",
        "os.setxattr",
        "os.removexattr",
        "glob.glob",
        "shutil.copyfile",
    }

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
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
            )
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
        frames = [
            fr
            for fr in traceback.extract_tb(sys.exc_info()[2])
            if fr.filename != __file__ and "runpy" not in fr.filename
        ]
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
