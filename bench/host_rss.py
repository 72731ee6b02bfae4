"""Where a one-worker grid configuration's RSS goes, after every worker call (glibc, Linux).

    python bench/host_rss.py text-big        # bench/memory_grid.py's configurations (--list there)

Prints a JSON line per worker call on stderr: RSS and its peak (MiB), the RSS of the heap, of other
anonymous memory and of mapped files (/proc/self/smaps), glibc's `mallinfo2` (heap size, mmap'd bytes,
in use, free, free at the top) and the call's seconds; then one line of totals. The environment tries
the allocator's settings: HM_MALLOPT="mmap=N,trim=N,arena=N,top=N" (mallopt at start), HM_TRIM=1
(malloc_trim(0) after every call), HM_PROF=1 (the grid's profiler on), HM_STEPS (default 2).
bench/results/memory_plan.md and docs/performance.md quote its numbers.
"""

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

libc = ctypes.CDLL("libc.so.6")


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


libc.mallinfo2.restype = MallInfo2
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8
opts = os.environ.get("HM_MALLOPT", "")
for item in filter(None, opts.split(",")):
    k, v = item.split("=")
    code = {"mmap": M_MMAP_THRESHOLD, "trim": M_TRIM_THRESHOLD, "arena": M_ARENA_MAX, "top": M_TOP_PAD}[k]
    assert libc.mallopt(code, int(v)) == 1, item


def smaps():
    """RSS MB by kind: heap, anon, file."""
    out = {"heap": 0, "anon": 0, "file": 0}
    kind = None
    with open("/proc/self/smaps") as fh:
        for line in fh:
            parts = line.split()
            if "-" in parts[0] and len(parts[0].split("-")) == 2 and not parts[0].endswith(":"):
                name = parts[5] if len(parts) > 5 else ""
                kind = "heap" if name == "[heap]" else ("anon" if not name.startswith("/") else "file")
            elif parts[0] == "Rss:":
                out[kind] += int(parts[1])
    return {k: round(v / 1024) for k, v in out.items()}


def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024


ROWS = []


def snap(label, dt=0.0):
    mi = libc.mallinfo2()
    row = {
        "call": label,
        "dt": round(dt, 2),
        "rss": status("VmRSS"),
        "hwm": status("VmHWM"),
        **smaps(),
        "m_arena": mi.arena >> 20,
        "m_mmap": mi.hblkhd >> 20,
        "m_used": mi.uordblks >> 20,
        "m_free": mi.fordblks >> 20,
        "m_top": mi.keepcost >> 20,
    }
    ROWS.append(row)
    print(json.dumps(row), file=sys.stderr, flush=True)


def main():
    import memory_grid as mg
    import torch

    from verl_npu.config import load_recipe
    from verl_npu.trainer import entry

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="Environment: HM_MALLOPT, HM_TRIM, HM_PROF, HM_STEPS (see the module docstring).",
    )
    parser.add_argument(
        "name",
        choices=sorted(mg.CONFIGS),
        metavar="NAME",
        help="a configuration of bench/memory_grid.py (python bench/memory_grid.py --list)",
    )
    name = parser.parse_args().name
    torch.set_num_threads(1)
    work = Path("/tmp/verl_npu_memory_grid")
    recipe, args, _ = mg.overrides(name, work)
    args = [a for a in args if not a.startswith("trainer.total_training_steps")]
    args.append(f"trainer.total_training_steps={os.environ.get('HM_STEPS', '2')}")
    import shutil
    import tempfile

    out = Path(tempfile.gettempdir()) / f"host_rss-{name}-{os.getpid()}"
    args = [a if not a.startswith("af_output_dir") else f"af_output_dir={out}" for a in args]
    rc = load_recipe(recipe, args)
    snap("start")
    original = entry.build_workers
    prof = None

    def build(rc_, steps, device):
        nonlocal prof
        if os.environ.get("HM_PROF") == "1":
            prof = mg.start_profiler()
        group = original(rc_, steps, device)
        snap("built")
        for meth in ("broadcast", "scatter"):
            inner = getattr(group, meth)

            def call(method, *a, _inner=inner, **kw):
                t = time.perf_counter()
                res = _inner(method, *a, **kw)
                dt = time.perf_counter() - t
                if os.environ.get("HM_TRIM") == "1":
                    libc.malloc_trim(0)
                snap(f"{kw.get('role', 'actor')}.{method}", dt)
                return res

            setattr(group, meth, call)
        return group

    entry.build_workers = build
    t0 = time.perf_counter()
    code = entry.run_training(rc)
    total = time.perf_counter() - t0
    assert code == 0
    peaks = mg.phase_peaks(prof) if prof is not None else {}
    shutil.rmtree(out, ignore_errors=True)
    print(
        json.dumps(
            {
                "name": name,
                "opts": opts,
                "trim": os.environ.get("HM_TRIM"),
                "total_s": round(total, 1),
                "hwm": status("VmHWM"),
                "peaks_mb": {k: v >> 20 for k, v in peaks.items() if "@" not in k},
            }
        )
    )


if __name__ == "__main__":
    main()
