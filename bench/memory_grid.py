"""The memory plan against real CPU training steps, per phase (issue 26's accuracy grid).

    python bench/memory_grid.py                 # every configuration, a markdown table on stdout
    python bench/memory_grid.py NAME [NAME...]  # some of them
    python bench/memory_grid.py --list          # their names

Each configuration runs in a process of its own: the real trainer (`verl_npu.trainer.entry.run_training`,
2 steps, hf rollout, the recipe tiny_gsm8k or tiny_geo3k with overrides) on random-init models built
here (`verl_npu.models.tiny`), with its real workers, optimizer and FSDP2 wrapping (gloo). One worker
runs in the driver's process as `verl-npu run` does it; two workers run in two processes of their own
started here (the same `build_workers` each rank of a Ray run calls, over gloo; no Ray).

The instrument: torch's profiler with `profile_memory=True`, started in every worker process before
its models are built. Its CPU allocator reports every allocation and free while it runs; their
running sum is the bytes of the tensors alive, and a phase's peak is its maximum over the span of
the worker call (generate_sequences, compute_log_prob, compute_ref_log_prob, update_actor,
update_critic) of the second step; the figure is the largest over the ranks. Nothing here reads
the planner except `predict`, which asks it for the same configuration. The host figure is the peak
RSS of every process of the configuration, summed (the driver and, with two workers, both ranks), in a
second run of the same configuration without the profiler (its records would be in it: `run_one`).

    python bench/memory_grid.py --host-of RESULTS.jsonl [NAME...] --json 2> NEW.jsonl
                                                # the host runs only, the recorded phases kept
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PHASES = {
    "generate_sequences": "rollout",
    "compute_log_prob": "old log-probs",
    "compute_ref_log_prob": "ref log-probs",
    "update_actor": "actor update",
    "update_critic": "critic update",
    "save_checkpoint": "checkpoint save",
}
TRAINING = ("actor update", "critic update")
MARK = "memgrid:"
RSS_AFTER: dict[str, int] = {}  # one worker: peak RSS after the first call of each kind

# name: (model kind, size overrides of the tiny builder, workers, prompt filler sentences, response, overrides)
SMALL = {}
MID = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4}
BIG = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
}
HUNDRED_M = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
}
VL_MID = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "vision_hidden_size": 128,
    "vision_intermediate_size": 256,
    "depth": 3,
}
A, R, C = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "critic"
CKPT = ["actor_rollout_ref.model.enable_gradient_checkpointing=true"]
RMPAD = ["actor_rollout_ref.model.use_remove_padding=true"]
PAD = ["actor_rollout_ref.model.use_remove_padding=false"]
KL = [f"{A}.use_kl_loss=true", f"{A}.kl_loss_coef=0.01"]
GAE = ["algorithm.adv_estimator=gae", f"{C}.ppo_micro_batch_size_per_gpu=4"]
OFFLOAD = [f"{A}.fsdp_config.param_offload=true", f"{A}.fsdp_config.optimizer_offload=true"]
LORA = [
    "actor_rollout_ref.model.lora_rank=8",
    "actor_rollout_ref.model.lora_alpha=16",
    "actor_rollout_ref.model.target_modules=all-linear",
]
DYN = [f"{A}.use_dynamic_bsz=true"]
SAVE = ["trainer.save_freq=2"]
CONFIGS = {
    "text-tiny": ("lm", SMALL, 1, 2, 16, PAD),
    "text-tiny-rmpad": ("lm", SMALL, 1, 2, 16, RMPAD),
    "text-tiny-ckpt-kl": ("lm", SMALL, 1, 2, 16, PAD + CKPT + KL),
    "text-mid": ("lm", MID, 1, 4, 16, PAD),
    "text-mid-rmpad-ckpt": ("lm", MID, 1, 4, 16, RMPAD + CKPT),
    "text-mid-kl": ("lm", MID, 1, 4, 16, PAD + KL),
    "text-mid-critic": ("lm", MID, 1, 4, 16, PAD + GAE),
    "text-mid-critic-ckpt": ("lm", MID, 1, 4, 16, PAD + GAE + CKPT),
    "text-mid-lora": ("lm", MID, 1, 4, 16, PAD + LORA + KL),
    "text-mid-offload": ("lm", MID, 1, 4, 16, PAD + OFFLOAD),
    "text-mid-dyn": ("lm", MID, 1, 4, 16, RMPAD + DYN + [f"{A}.ppo_max_token_len_per_gpu=512"]),
    "text-mid-2w": ("lm", MID, 2, 4, 16, PAD),
    "text-mid-2w-rmpad-kl": ("lm", MID, 2, 4, 16, RMPAD + KL),
    "text-mid-2w-critic": ("lm", MID, 2, 4, 16, PAD + GAE),
    "text-mid-2w-offload": ("lm", MID, 2, 4, 16, PAD + OFFLOAD),
    "text-mid-2w-ckpt-dyn": ("lm", MID, 2, 4, 16, RMPAD + CKPT + DYN + [f"{A}.ppo_max_token_len_per_gpu=400"]),
    "text-big": ("lm", BIG, 1, 6, 24, PAD),
    "text-big-ckpt-critic": ("lm", BIG, 1, 6, 24, PAD + CKPT + GAE),
    "text-big-2w-lora": ("lm", BIG, 2, 6, 24, RMPAD + LORA),
    "text-100m": ("lm", HUNDRED_M, 1, 4, 8, PAD + CKPT),
    "vl-tiny": ("vl", SMALL, 1, 0, 8, PAD),
    "vl-tiny-rmpad-kl": ("vl", SMALL, 1, 0, 8, RMPAD + KL),
    "vl-mid": ("vl", VL_MID, 1, 0, 8, PAD),
    "vl-mid-ckpt-kl": (
        "vl",
        VL_MID,
        1,
        0,
        8,
        PAD + CKPT + KL,
    ),  # (a VL critic is not in the grid: measured by no configuration)
    "vl-mid-2w": ("vl", VL_MID, 2, 0, 8, PAD),
    # the checkpoint save of the last step (trainer.save_freq=2): the worker's save_checkpoint call
    "text-mid-save": ("lm", MID, 1, 4, 16, PAD + SAVE),
    "text-big-save": ("lm", BIG, 1, 6, 24, PAD + SAVE),
    "text-mid-2w-save": ("lm", MID, 2, 4, 16, PAD + SAVE),
}


# ------------------------------------------------------------------------------------------------ inputs
def build_model(root: Path, kind: str, sizes: dict) -> Path:
    from verl_npu.models import tiny

    tag = "-".join(f"{k}{v}" for k, v in sorted(sizes.items())) or "default"
    folder = root / f"{kind}-{tag}"
    if not (folder / "config.json").is_file():
        (tiny.build_tiny_qwen2 if kind == "lm" else tiny.build_tiny_qwen25vl)(folder, **sizes)
    return folder


def text_rows(folder: Path, filler: int, rows: int = 16) -> Path:
    """train.parquet of `rows` questions that all tokenize to the same length (single digits vary;
    `filler` fixed sentences make them longer), so that every prompt fills max_prompt_length."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    pad = " ".join(["Read the question carefully and answer with one number."] * filler)
    table = [
        {
            "data_source": "openai/gsm8k",
            "ability": "math",
            "prompt": [{"role": "user", "content": f"{pad} What is {i % 9 + 1} plus {(i * 7) % 9 + 1}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(i % 9 + (i * 7) % 9 + 2)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(rows)
    ]
    pq.write_table(pa.Table.from_pylist(table), folder / "train.parquet")
    return folder / "train.parquet"


def prompt_length(model: Path, train: Path, image_key: str | None) -> int:
    """The longest prompt of `train` in tokens, as the dataset builds it (the recipe's max_prompt_length)."""
    from omegaconf import OmegaConf

    from verl_npu.config import load_recipe
    from verl_npu.data import RLDataset
    from verl_npu.models.loading import load_tokenizer_and_processor

    tok, proc = load_tokenizer_and_processor(str(model))
    data = {
        "max_prompt_length": 100000,
        "truncation": "error",
        "prompt_key": "prompt",
        "filter_overlong_prompts": False,
        **({"image_key": image_key} if image_key else {}),
    }
    recipe = "tiny_geo3k" if image_key else "tiny_gsm8k"
    base = load_recipe(recipe, [f"actor_rollout_ref.model.path={model}"]).backend.data
    cfg = OmegaConf.merge(base, data)
    ds = RLDataset(str(train), tok, proc, cfg)
    return max(int(ds[i]["attention_mask"].sum()) for i in range(len(ds)))


def overrides(name: str, work: Path) -> tuple[str, list[str], Path]:
    """(recipe, overrides, model folder) of configuration `name`."""
    kind, sizes, workers, filler, response, extra = CONFIGS[name]
    model = build_model(work / "models", kind, sizes)
    data = work / "data" / f"{kind}-{filler}"
    if kind == "lm":
        recipe, train = "tiny_gsm8k", data / "train.parquet"
        if not train.is_file():
            text_rows(data, filler)
    else:
        from verl_npu.data.geometry3k import prepare_synthetic

        recipe, train = "tiny_geo3k", data / "train.parquet"
        if not train.is_file():
            prepare_synthetic(data, n_train=16, n_test=4, seed=0, image_size=56)
    marker = data / f"prompt_length-{model.name}"
    if not marker.is_file():
        marker.write_text(str(prompt_length(model, train, "images" if kind == "vl" else None)))
    prompt = int(marker.read_text())
    out = work / "runs" / name
    args = [
        f"af_output_dir={out}",
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={train}",
        f"data.val_files={train}",
        f"data.max_prompt_length={prompt}",
        f"data.max_response_length={response}",
        f"data.train_batch_size={4 * workers}",
        "data.shuffle=false",
        f"{R}.n=2",
        f"{A}.ppo_mini_batch_size={2 * workers}",
        f"{A}.ppo_micro_batch_size_per_gpu=4",
        f"{R}.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={workers}",
        "trainer.total_training_steps=2",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[console]",
        "trainer.resume_mode=disable",
        f"{R}.temperature=1.0",
    ]
    if kind == "vl":
        args += ["data.max_pixels=3136", "data.min_pixels=3136"]
    return recipe, args + list(extra), model


# ------------------------------------------------------------------------------------------------ the instrument
def start_profiler():
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    prof.start()
    return prof


def phase_peaks(prof, trace: Path | None = None, alive: set | None = None) -> dict[str, int]:
    """{call name: the peak of the running sum of the profiler's CPU allocation events over the last
    span so marked; "NAME@start": the sum when it began}.

    With `trace` (the two-worker ranks) the events are read from the exported trace, which gives
    each one's address: gloo frees some buffers of a collective in its own worker threads, where
    the profiler reports no free, so a block whose address is allocated again is taken as freed
    then (without this the running sum drifts up by the buffers of every collective); one still
    unfreed at the end that no live tensor holds (`alive`: the data pointers of the live storages)
    is taken as freed when the worker call that allocated it ended."""
    import bisect

    prof.stop()
    if trace is None:
        events = [
            (e.name(), e.start_ns(), e.end_ns(), e.nbytes(), None)
            for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]" and str(e.device_type()) == "DeviceType.CPU" or e.name().startswith(MARK)
        ]
    else:
        prof.export_chrome_trace(str(trace))
        raw = json.loads(trace.read_text())["traceEvents"]
        trace.unlink()
        events = [
            (e["name"], e["ts"], e["ts"] + e.get("dur", 0), e["args"].get("Bytes", 0), e["args"].get("Addr"))
            for e in raw
            if (e.get("name") == "[memory]" and e["args"].get("Device Type") == 0)
            or str(e.get("name", "")).startswith(MARK)
        ]
    mem = sorted((t, n, addr) for name, t, _, n, addr in events if name == "[memory]")
    calls = sorted((t0, t1) for name, t0, t1, _, _ in events if name.startswith(MARK))
    if alive is not None:
        mem = _orphans_freed(mem, calls, alive)
    times, running, total, live = [], [], 0, {}
    for t, n, addr in mem:
        if addr is not None:
            if n > 0:
                total -= live.pop(addr, 0)  # allocated again: its unreported free came before
                live[addr] = n
            elif addr not in live:
                continue
            else:
                n = -live.pop(addr)
        total += n
        times.append(t)
        running.append(total)
    spans = {}
    for name, t0, t1, _, _ in sorted(events, key=lambda e: e[1]):
        if name.startswith(MARK):
            spans[name[len(MARK) :]] = (t0, t1)  # the last call of each kind wins
    out = {}
    for key, (t0, t1) in spans.items():
        i, j = bisect.bisect_right(times, t0), bisect.bisect_right(times, t1)
        at_start = running[i - 1] if i else 0
        out[key] = max([at_start, *running[i:j]])
        out[key + "@start"] = at_start
        if os.environ.get("MEMGRID_WHERE") and trace is not None and j > i:  # diagnosis: the calls at the peak
            t = times[max(range(i, j), key=lambda k: running[k])]
            print(
                key,
                out[key],
                sorted(
                    (e.get("dur", 0), e["name"])
                    for e in raw
                    if e.get("ph") == "X" and e["ts"] <= t <= e["ts"] + e.get("dur", 0)
                )[:10],
                file=sys.stderr,
            )
    return out


def _orphans_freed(mem: list, calls: list, alive: set) -> list:
    """`mem` with a free added at the end of its call for every block freed unseen (see phase_peaks)."""
    import bisect

    last = {}
    for k, (_, n, addr) in enumerate(mem):
        if n > 0:
            last[addr] = k  # the latest allocation at each address
        elif addr in last and mem[last[addr]][1] == -n:
            del last[addr]
    extra = []
    starts = [c[0] for c in calls]
    for addr, k in last.items():
        if addr in alive:
            continue
        t, n, _ = mem[k]
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and calls[i][0] <= t <= calls[i][1]:
            extra.append((calls[i][1], -n, addr))
    return sorted(mem + extra)


def _alive_pointers() -> set:
    """The data pointers of every CPU tensor storage a Python object holds now."""
    import gc

    import torch

    out = set()
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor):
                t = obj._local_tensor if hasattr(obj, "_local_tensor") else obj
                out.add(t.untyped_storage().data_ptr())
        except Exception:  # noqa: BLE001 - tensors without storage
            continue
    return out


def _marked(obj):
    """Wrap a group's broadcast / scatter so that every worker call is a profiler span."""
    from torch.profiler import record_function

    for meth in ("broadcast", "scatter"):
        inner = getattr(obj, meth)

        def call(method, *args, _inner=inner, **kwargs):
            with record_function(f"{MARK}{kwargs.get('role', 'actor')}.{method}"):
                out = _inner(method, *args, **kwargs)
            # the process's peak RSS so far, after each kind of call (where the host figure is reached)
            RSS_AFTER.setdefault(f"{kwargs.get('role', 'actor')}.{method}", _peak_rss())
            return out

        setattr(obj, meth, call)
    return obj


def _live_report(title: str) -> None:
    """Diagnosis: the live CPU tensor storages by shape, largest first (stderr)."""
    import gc
    from collections import Counter

    import torch

    seen, by = set(), Counter()
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor):
                continue
            t = obj._local_tensor if hasattr(obj, "_local_tensor") else obj
            st = t.untyped_storage()
            if st.data_ptr() in seen or st.nbytes() == 0:
                continue
            seen.add(st.data_ptr())
            by[(tuple(t.shape), str(t.dtype), t.requires_grad, type(obj).__name__)] += st.nbytes()
        except Exception:  # noqa: BLE001 - diagnosis only
            continue
    print(
        title,
        f"{sum(by.values()) / 1e6:.1f} MB",
        [(k, round(v / 1e6, 2)) for k, v in by.most_common(8)],
        file=sys.stderr,
    )


def _rank_main(conn, cfg, device, steps: int, rank: int, world: int, port: int, profiled: bool = True) -> None:
    """One rank of the two-worker group: gloo, this rank's workers (as a Ray worker host builds
    them), then calls from the pipe, each a profiler span; at the end its peaks and peak RSS.
    Unprofiled (the host run): its peak RSS only."""
    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    from verl_npu.workers.roles import build_workers

    torch.set_num_threads(1)
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    prof = start_profiler() if profiled else None
    dist.init_process_group("gloo", rank=rank, world_size=world)
    workers = build_workers(cfg, steps, device, rank=rank, world_size=world)
    conn.send(("ok", None))
    while True:
        msg = conn.recv()
        if msg is None:
            break
        role, method, args, kwargs = msg
        if os.environ.get("MEMGRID_WHERE"):
            _live_report(f"rank {rank} before {method}")
        try:
            with record_function(f"{MARK}{role}.{method}"):
                result = getattr(workers[role], method)(*args, **kwargs)
            conn.send(("ok", result))
        except Exception as exc:  # noqa: BLE001 - reported to the driver
            conn.send(("error", repr(exc)))
    rss = _peak_rss()  # before the trace is read
    peaks = (
        {}
        if prof is None
        else phase_peaks(prof, Path(tempfile.gettempdir()) / f"memgrid-trace-{os.getpid()}.json", _alive_pointers())
    )
    conn.send(("done", {"peaks": peaks, "rss": rss}))
    dist.destroy_process_group()


class ProcessWorkerGroup:
    """Two (or more) ranks in processes of their own, driven through pipes: the WorkerGroup API."""

    def __new__(cls, rc, steps: int, device, profiled: bool = True):
        import multiprocessing as mp

        from verl_npu.workers.group import WorkerGroup
        from verl_npu.workers.parallel import free_port
        from verl_npu.workers.roles import roles_for

        class _Group(WorkerGroup):
            def __init__(self):
                ctx = mp.get_context("spawn")
                self.world_size = rc.world_size
                self.sp_size = int(rc.backend.actor_rollout_ref.actor.ulysses_sequence_parallel_size)
                self._roles = roles_for(rc.typed)
                cfg, port = rc.typed, free_port()  # the typed config pickles to the ranks as to Ray workers
                self.conns, self.procs = [], []
                for rank in range(self.world_size):
                    here, there = ctx.Pipe()
                    proc = ctx.Process(
                        target=_rank_main, args=(there, cfg, device, steps, rank, self.world_size, port, profiled)
                    )
                    proc.start()
                    self.conns.append(here)
                    self.procs.append(proc)
                self._answers()
                self.results = None

            @property
            def roles(self):
                return list(self._roles)

            def _answers(self):
                out = []
                for rank, conn in enumerate(self.conns):
                    status, value = conn.recv()
                    if status == "error":
                        raise RuntimeError(f"rank {rank}: {value}")
                    out.append(value)
                return out

            def broadcast(self, method, *args, role="actor", **kwargs):
                for conn in self.conns:
                    conn.send((role, method, args, kwargs))
                return self._answers()

            def scatter(self, method, chunks, *args, role="actor", **kwargs):
                for conn, chunk in zip(self.conns, chunks):
                    conn.send((role, method, (chunk, *args), kwargs))
                return self._answers()

            def shutdown(self):
                if self.results is None:
                    for conn in self.conns:
                        conn.send(None)
                    self.results = self._answers()
                    for proc in self.procs:
                        proc.join()

        return _Group()


def measure(name: str, work: Path, profiled: bool = True) -> dict:
    """Run configuration `name` (2 steps) and return {"phases": {plan phase: peak bytes (max over
    ranks)}, "host": summed peak RSS bytes}; unprofiled (`profiled=False`, the host run): no phases,
    the peak RSS of the run made by `verl-npu run`'s own code (`cli.main`; two workers in the
    processes started here instead of Ray's), without the profiler's records."""
    import torch

    from verl_npu.config import load_recipe
    from verl_npu.trainer import entry

    torch.set_num_threads(1)
    recipe, args, _ = overrides(name, work)
    shutil.rmtree(work / "runs" / name, ignore_errors=True)
    rc = load_recipe(recipe, args)
    groups = []
    original = entry.build_workers
    prof = None

    def build(rc_, steps, device):
        nonlocal prof
        if rc_.world_size == 1:
            prof = start_profiler() if profiled else None
            group = _marked(original(rc_, steps, device))
        else:
            group = ProcessWorkerGroup(rc_, steps, device, profiled)
        groups.append(group)
        return group

    entry.build_workers = build
    try:
        if profiled:
            code = entry.run_training(rc)
        else:  # the host run: as `verl-npu run` runs it (its process holds ~0.1 GiB more than run_training's)
            from verl_npu.cli import main as cli_main

            code = cli_main(["run", recipe, *args])
    finally:
        entry.build_workers = original
    if code != 0:
        raise SystemExit(f"{name}: the run failed (exit {code})")
    group = groups[0]
    if rc.world_size == 1:
        rss = _peak_rss()  # before the profiler's events are read
        per_rank = [phase_peaks(prof)] if prof is not None else [{}]
    else:
        group.shutdown()
        per_rank = [r["peaks"] for r in group.results]
        rss = _peak_rss() + sum(r["rss"] for r in group.results)
    phases = {}
    starts = {}
    for key in per_rank[0]:
        method = key.split(".", 1)[1]
        if method in PHASES:
            phases[PHASES[method]] = max(r[key] for r in per_rank)
            starts[PHASES[method]] = max(r[key + "@start"] for r in per_rank)
    return {"phases": phases, "host": rss, "at_start": starts, "rss_after": dict(RSS_AFTER)}


def predict(name: str, work: Path) -> dict:
    """The plan of configuration `name` for the CPU: {"phases": {phase: bytes}, "host": bytes}."""
    from verl_npu.config import load_recipe
    from verl_npu.memory.plan import model_size
    from verl_npu.memory.recipe import plan_recipe

    recipe, args, model = overrides(name, work)
    rc = load_recipe(recipe, args)
    size = model_size(json.loads((model / "config.json").read_text()))
    plan = plan_recipe(rc, 1 << 36, "cpu", {"actor": size}, accelerator=False)
    # the grid runs no Ray: its processes' estimate is left out of the comparison
    return {
        "phases": {p.name: p.total for p in plan.phases},
        "host": sum(p.bytes for p in plan.host if p.name != "Ray's processes"),
        "params": size.params,
    }


def _peak_rss() -> int:
    """This process's peak RSS in bytes (its whole life: the models and data the grid builds were
    built by the profiled run before, so the host run's process does what `verl-npu run`'s does).
    Read from /proc/self/status's VmHWM, the peak of this program's own memory: getrusage's
    ru_maxrss survives exec, so a process started from a large parent (a long pytest session)
    reports at least the parent's RSS at the fork."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _measure_in_process(name: str, work: Path, profiled: bool) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, __file__, "--measure" if profiled else "--measure-host", name, "--work", str(work)],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{name}: measuring failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_one(name: str, work: Path, host: bool = True) -> dict:
    """Measure `name` in fresh processes and plan it here: the phases in a profiled run, the host
    figure in a second run without the profiler (its peak RSS, every process summed). The profiler's
    records of every allocation and operator, kept in the process while it runs, are small
    long-lived blocks between the tensors' blocks: they pin freed heap memory that the C allocator
    would otherwise reuse (text-big: 2.19 GiB peak RSS profiled, 1.59-1.61 without; reading the trace
    at the end added more: 8.0 GiB for text-big-2w-lora's two exported traces)."""
    measured = _measure_in_process(name, work, profiled=True)
    if host:
        measured["host_profiled"] = measured["host"]
        measured["host"] = _measure_in_process(name, work, profiled=False)["host"]
    return {"name": name, "measured": measured, "planned": predict(name, work)}


def table(results: list[dict]) -> str:
    lines = [
        "| configuration | params | workers | phase | planned MB | measured MB | error |",
        "|---|---|---|---|---|---|---|",
    ]
    errs = {"training": [], "other": []}
    host = []
    for r in results:
        workers = CONFIGS[r["name"]][2]
        for phase, got in r["measured"]["phases"].items():
            want = r["planned"]["phases"].get(phase)
            if want is None:
                continue
            err = want / got - 1
            errs["training" if phase in TRAINING else "other"].append(err)
            lines.append(
                f"| {r['name']} | {r['planned']['params'] / 1e6:.2f} M | {workers} | {phase} | "
                f"{want / 1e6:.1f} | {got / 1e6:.1f} | {err:+.1%} |"
            )
        host.append((r["name"], r["planned"]["host"], r["measured"]["host"], r["measured"].get("host_profiled")))
    lines.append("")
    for kind, e in errs.items():
        if e:
            lines.append(
                f"{kind} phases: {len(e)} predictions, median |error| "
                f"{statistics.median(abs(x) for x in e):.1%}, worst {max(e, key=abs):+.1%}, "
                f"within 15%: {sum(abs(x) <= 0.15 for x in e)}"
            )
    lines += [
        "",
        "| configuration | planned host GiB | peak RSS GiB (all processes) | error | peak RSS GiB, profiled run |",
        "|---|---|---|---|---|",
    ]
    for name, want, got, profiled in host:
        lines.append(
            f"| {name} | {want / 2**30:.2f} | {got / 2**30:.2f} | {want / got - 1:+.0%} | "
            + (f"{profiled / 2**30:.2f} |" if profiled else "- |")
        )
    e = [want / got - 1 for _, want, got, _ in host]
    if e:
        lines += [
            "",
            f"host: {len(e)} predictions, median |error| {statistics.median(abs(x) for x in e):.1%}, "
            f"worst {max(e, key=abs):+.1%}, within 25%: {sum(abs(x) <= 0.25 for x in e)}",
        ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="configurations (default: all)")
    parser.add_argument("--work", default="/tmp/verl_npu_memory_grid", help="folder for models and data")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--measure-host", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="the results as JSON lines too (stderr)")
    parser.add_argument(
        "--replan",
        metavar="JSONL",
        help="the table of earlier --json results, planned again with the planner as it is now (no run)",
    )
    parser.add_argument(
        "--host-of",
        metavar="JSONL",
        help="earlier --json results with their host figure measured "
        "again (the unprofiled run only; the phases kept): the table, and with --json the results",
    )
    args = parser.parse_args()
    work = Path(args.work)
    if args.list:
        print("\n".join(CONFIGS))
        return 0
    if args.measure or args.measure_host:
        import logging

        logging.disable(logging.WARNING)
        print(json.dumps(measure(args.measure or args.measure_host, work, profiled=bool(args.measure))))
        return 0
    if args.replan or args.host_of:
        earlier = [
            json.loads(line)
            for line in Path(args.replan or args.host_of).read_text().splitlines()
            if line.startswith("{")
        ]
        results = []
        for r in earlier:
            if args.host_of and (not args.names or r["name"] in args.names):
                host = _measure_in_process(r["name"], work, profiled=False)["host"]
                r["measured"] = {
                    **r["measured"],
                    "host_profiled": r["measured"].get("host_profiled", r["measured"]["host"]),
                    "host": host,
                }
            results.append({**r, "planned": predict(r["name"], work)})
            if args.json:
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        print(table(results))
        return 0
    results = []
    for name in args.names or list(CONFIGS):
        results.append(run_one(name, work))
        if args.json:
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
