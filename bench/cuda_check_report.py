"""The tables and files of `bench/cuda_check.py`'s results: cuda_check.json (every check), cuda_check.md (what a
person reads: one line per check, the memory plan against the device's figures, the recipes validated, each
failure's tail) and cuda_check_failures.log (the long tail of each failed check)."""

from __future__ import annotations

import json
from pathlib import Path


def write_results(out: Path, meta: dict, results: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    checks = [{k: v for k, v in r.items() if k != "log"} for r in results]
    (out / "cuda_check.json").write_text(json.dumps({**meta, "checks": checks}, indent=1, default=str))
    (out / "cuda_check.md").write_text(markdown(meta, results))
    (out / "cuda_check_failures.log").write_text(
        "".join(f"===== {r['name']}\n{r.get('log', r['error'])}\n\n" for r in results if not r["ok"]) or "no failures\n"
    )


def headline(r: dict) -> str:
    n = r["numbers"]
    if not r["ok"]:
        lines = [ln for ln in r["error"].splitlines() if ln.strip()]
        return (lines[-1] if lines else "failed")[:160].replace("|", "/")
    if r["name"] == "env":
        return (
            f"{n.get('gpu', 'no GPU')} cap {n.get('capability')} bf16 {n.get('bf16')}; torch {n['torch']}; "
            f"varlen {n['varlen_kernel']}; compute {n['detected'][str(None)]['compute_dtype']}; "
            f"missing {', '.join(n['missing_dependencies']) or 'nothing'}"
        )
    if r["name"] == "validate":
        rec = n["recipes"]
        return f"{sum(v['rc'] == 0 for v in rec.values())}/{len(rec)} validate (rc 0)"
    if r["name"] == "parity":
        return "; ".join(
            f"{k}: {v['logprob_max_abs']:.1e}/{v['entropy_max_abs']:.1e}"
            for k, v in n.items()
            if isinstance(v, dict) and not k.startswith("cpu")
        )
    if r["name"].startswith("mem-"):
        return "; ".join(
            f"{p} {v['planned_mb']}/{v['measured_mb']} MB" + (f" ({v['error']:+.0%})" if v["error"] is not None else "")
            for p, v in n["phases"].items()
        )
    if r["name"] == "async":
        probe = n["nccl_one_device_probe"]
        return (
            f"{n['transfers_checked']} transfers by {n['backend']} to {n['rollout_devices']}, weights equal; "
            f"{n['timing_s/step']} s/step, idle trainer {n['trainer/idle_ratio']} rollout "
            f"{n['rollouter/idle_ratio']}; {probe['backend']} 2 ranks on one device: "
            f"{'ok' if probe['ok'] else 'refused'}"
        )
    if r["name"] == "sft":
        rl = n["rl_from_sft"]
        return (
            f"SFT loss {n['sft_losses'][0]} -> {n['sft_losses'][-1]} over 6 steps (resumed at 5); RL from its "
            f"export: steps {rl['steps'][0]}-{rl['steps'][-1]}, {rl['timing_s/step']} s/step"
        )
    if "snapshots" in n:
        return f"{len(n['snapshots'])} snapshot(s), {n['segments']} segments, {n['trace_events']} allocation events"
    if "timing_s/step" in n:
        actor = n.get("actor") or {}
        return (
            f"steps {n['steps'][0]}-{n['steps'][-1]}, {n['timing_s/step']} s/step, score "
            f"{n.get('critic/score/mean')}, actor {actor.get('trainable_dtypes')} on {actor.get('param_devices')}"
            f", {actor.get('mixed_precision')}"
        )
    return ""


def markdown(meta: dict, results: list[dict]) -> str:
    ok = sum(r["ok"] for r in results)
    lines = [
        f"# cuda_check: {ok}/{len(results)} checks passed",
        "",
        f"device {meta['device']}, {meta.get('gpu', '')}, {meta['started']}, {meta['seconds']} s in all, "
        f"{meta['jobs']} at once{', quick' if meta['quick'] else ''}",
        "",
        "| check | ok | seconds | result |",
        "|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r['name']} | {'yes' if r['ok'] else '**NO**'} | {r['seconds']} | {headline(r)} |")
    mem = [r for r in results if r["name"].startswith("mem-") and r["ok"]]
    if mem:
        lines += [
            "",
            f"Memory: planned vs measured per phase ({mem[0]['numbers']['measured_kind']}; the plan "
            f"with {mem[0]['numbers']['planned_compute_bytes']}-byte compute)",
            "",
            "| configuration | phase | planned MB | measured MB | at the call's start MB | reserved peak MB | error |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in mem:
            for phase, v in r["numbers"]["phases"].items():
                err = f"{v['error']:+.1%}" if v["error"] is not None else "-"
                lines.append(
                    f"| {r['name'][4:]} | {phase} | {v['planned_mb']} | {v['measured_mb']} | "
                    f"{v['start_mb']} | {v['reserved_mb'] or '-'} | {err} |"
                )
    val = next((r for r in results if r["name"] == "validate" and "recipes" in r["numbers"]), None)
    if val:
        lines += ["", "Recipes validated:", "", "| recipe | rc | last lines |", "|---|---|---|"]
        for name, v in val["numbers"]["recipes"].items():
            lines.append(f"| {name} | {v['rc']} | {v['summary'][:200].replace('|', '/')} |")
    failed = [r for r in results if not r["ok"]]
    for r in failed:
        lines += ["", f"## {r['name']} failed", "", "```", r["error"], "```"]
    return "\n".join(lines) + "\n"
