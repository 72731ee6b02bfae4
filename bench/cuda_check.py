"""The trainer's first checks on a real CUDA GPU, in one command (no Ray, no vLLM, no network).

    PYTHONPATH=. python3 bench/cuda_check.py --out DIR              # every check on cuda (~3-4 min on one H100)
    PYTHONPATH=. python3 bench/cuda_check.py --out DIR --quick      # a smaller subset
    PYTHONPATH=. python3 bench/cuda_check.py --out DIR --device cpu # the same checks on the CPU (to test this script)
    PYTHONPATH=. python3 bench/cuda_check.py --list                 # the checks' names and what each asserts

What it checks (each check runs in a process of its own with its own timeout; a failure is recorded
with the last 40 lines of its output and the next check runs):
  env          torch / transformers / GPU name, capability, bf16; what verl_npu.device detects for
               trainer.device null and cuda (kind, backend, visible-devices variable, memory, compute
               dtype, attention) and the varlen attention kernel of the padding-free path.
  validate     `python -m verl_npu.cli validate` of every recipe in recipes/ (the tiny ones on the device);
               the accelerator recipes as shipped and with their EDIT_ME fields filled with hub ids.
  text-resume  tiny_gsm8k 4 steps (checkpoints at 2 and 4), then the same command to 6 steps: resumed at 5.
  vl-rmpad, vl-padded   tiny_geo3k padding-free 4 steps; use_remove_padding=false 2 steps.
  gae, kl-ref, lora, offload, dynamic-bsz, grad-ckpt, dapo, multi-turn   2 steps each.
  parity       log-probs / entropy of verl_npu.models.forward on CPU fp32 vs device fp32 vs device bf16
               (autocast over fp32 weights as the actor runs, and bf16 weights as the reference model),
               padded and padding-free.
  async        trainer.v1.trainer_mode=separate_async one-step-off (k=1), tiny_gsm8k 4 steps, the trainer and
               its rollout process sharing the device (--only async): after every weight transfer the rollout
               process's weights equal the trainer's (tensors and digests), its model is on the device, every
               group trained one version after the one that generated it, metrics finite. Also recorded (not
               asserted): whether the device's own collective backend (nccl) forms a 2-rank group on one device.
  mem-*        bench/memory_grid.py configurations run 2 steps on the device: each worker call's peak
               (max_memory_allocated after reset_peak_memory_stats) against the memory planner's phase
               for the same configuration planned for the device (bf16 compute on an accelerator).
Every training run is `verl-npu run` (verl_npu.cli.main) in a process of its own, with tiny local
models (tiny://) and synthetic data written first, and a reward that varies with the text (so every
step has a policy gradient); every metric of metrics.jsonl must be finite and some actor/grad_norm > 0.
Without matplotlib (the GPU machine has none) the trainer's training_curves.png is skipped (noted).

Results: DIR/cuda_check.json (every check: name, ok, numbers, seconds, error tail), DIR/cuda_check.md
(a table), DIR/cuda_check_failures.log (the last 400 lines of each failed check's output). The models, data
and run folders go to --work (a temporary folder by default), never into DIR. A run kept for the record goes
to bench/results/ (the report in bench/results/cuda_check.md, each run's JSON in bench/results/cuda_check_results/).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
for _p in (str(REPO), str(BENCH)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from cuda_check_report import headline, markdown, write_results  # noqa: E402  (bench/ is on sys.path above)

# run as a script this module is __main__: cuda_check_more's `import cuda_check` must find this one
sys.modules.setdefault("cuda_check", sys.modules[__name__])

A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
TAIL_LINES = 40  # of a failed check's output, in cuda_check.json / .md
LOG_LINES = 400  # in cuda_check_failures.log


# ------------------------------------------------------------------------------------------------ the checks
@dataclass(frozen=True)
class Check:
    name: str
    fn: str  # the function of this module that runs it (in its own process)
    timeout: int  # seconds, on the GPU machine (the CPU gets SLOWER times as much)
    quick: bool  # part of --quick
    asserts: str  # what it asserts, for --list and the table
    args: tuple = ()


SLOWER = 4  # CPU timeouts: this many times the GPU ones
MIN_START = 20  # seconds: a check is not started with less of the --budget left

GAE = ["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=8"]
KL = [f"{A}.use_kl_loss=true", f"{A}.kl_loss_coef=0.01"]
LORA = [
    "actor_rollout_ref.model.lora_rank=8",
    "actor_rollout_ref.model.lora_alpha=16",
    "actor_rollout_ref.model.target_modules=all-linear",
]
OFFLOAD = [f"{A}.fsdp_config.param_offload=true", f"{A}.fsdp_config.optimizer_offload=true"]
DYN = [f"{A}.use_dynamic_bsz=true", f"{A}.ppo_max_token_len_per_gpu=1024"]
CKPT = ["actor_rollout_ref.model.enable_gradient_checkpointing=true"]
# memory_grid.py configurations measured on the device (with checkpointing: text-mid-rmpad-ckpt, vl-mid-ckpt-kl,
# text-100m: a model whose weights, not the allocator's fixed costs, make the peak)
MEMORY_CONFIGS = ("text-mid", "text-mid-critic", "text-mid-lora", "text-mid-rmpad-ckpt", "vl-mid-ckpt-kl", "text-100m")
MEMORY_QUICK = ("text-mid", "vl-mid-ckpt-kl")

FINITE = "2 steps, every metric finite"
CHECKS = [
    Check(
        "env",
        "check_env",
        120,
        True,
        "the device detected for trainer.device null and cuda is cuda, backend "
        "nccl, CUDA_VISIBLE_DEVICES, bf16 compute; varlen kernel flash_attn when it imports, else sdpa_sequences",
    ),
    Check(
        "validate",
        "check_validate",
        240,
        True,
        "every tiny recipe validates on the device; no recipe's "
        "validation (accelerator recipes as shipped and with hub ids) ends in a traceback",
    ),
    Check(
        "text-resume",
        "check_text_resume",
        300,
        True,
        "tiny_gsm8k 4 steps then resumed to 6: steps 1-6 once "
        "each, the second run starts at 5 from global_step_4, verl's checkpoint layout, metrics finite, "
        "actor weights fp32 on the device",
    ),
    Check(
        "parity",
        "cuda_check_more:check_parity",
        180,
        True,
        "log-prob / entropy max |diff| vs CPU fp32: device fp32 <= 1e-3, bf16 <= 0.25, padded and padding-free",
    ),
    Check(
        "vl-rmpad", "check_run", 240, True, "tiny_geo3k padding-free, 4 steps, metrics finite", ("tiny_geo3k", 4, ())
    ),
    Check(
        "vl-padded",
        "check_run",
        240,
        False,
        "tiny_geo3k use_remove_padding=false, " + FINITE,
        ("tiny_geo3k", 2, ("actor_rollout_ref.model.use_remove_padding=false",)),
    ),
    Check(
        "gae",
        "check_run",
        240,
        False,
        "GAE with a critic: " + FINITE + ", critic/vf_loss logged",
        ("tiny_gsm8k", 2, tuple(GAE)),
    ),
    Check(
        "kl-ref",
        "check_run",
        240,
        True,
        "KL loss with a reference model: " + FINITE + ", actor/kl_loss logged",
        ("tiny_gsm8k", 2, tuple(KL)),
    ),
    Check("lora", "check_run", 240, False, "LoRA rank 8: " + FINITE, ("tiny_gsm8k", 2, tuple(LORA))),
    Check(
        "offload", "check_run", 240, False, "param + optimizer offload: " + FINITE, ("tiny_gsm8k", 2, tuple(OFFLOAD))
    ),
    Check(
        "offload-vl",
        "check_run",
        240,
        False,
        "tiny_geo3k (images) with param + optimizer offload: " + FINITE,
        ("tiny_geo3k", 2, tuple(OFFLOAD)),
    ),
    Check(
        "multi-turn-offload",
        "check_run",
        300,
        False,
        "tiny_tool_gsm8k with param + optimizer offload: " + FINITE,
        ("tiny_tool_gsm8k", 2, tuple(OFFLOAD)),
    ),
    Check("dynamic-bsz", "check_run", 240, False, "use_dynamic_bsz: " + FINITE, ("tiny_gsm8k", 2, tuple(DYN))),
    Check("grad-ckpt", "check_run", 240, False, "gradient checkpointing: " + FINITE, ("tiny_gsm8k", 2, tuple(CKPT))),
    Check(
        "dapo",
        "check_run",
        240,
        False,
        "tiny_geo3k_dapo (dynamic sampling, varied reward): " + FINITE,
        ("tiny_geo3k_dapo", 2, ()),
    ),
    Check(
        "multi-turn",
        "check_run",
        300,
        False,
        "tiny_tool_gsm8k (hf rollout, tool calls): " + FINITE,
        ("tiny_tool_gsm8k", 2, ()),
    ),
] + [
    Check(
        f"mem-{name}",
        "check_memory",
        300,
        name in MEMORY_QUICK,
        "2 steps on the device; every worker call's "
        "peak measured; planned vs measured per phase (reported, not asserted)",
        (name,),
    )
    for name in MEMORY_CONFIGS
]


@dataclass
class Context:
    device: str  # "cuda" | "cpu"
    work: Path  # models, data, runs
    name: str = ""  # the check running
    # what a check found so far: reported with its error when an assertion fails after it
    found: dict = field(default_factory=dict)

    @property
    def env(self) -> dict:
        """The environment of every process started: this repository first, the tiny models' cache, offline."""
        path = os.environ.get("PYTHONPATH")
        return {
            **os.environ,
            "PYTHONPATH": str(REPO) + (os.pathsep + path if path else ""),
            "VERL_NPU_CACHE": str(self.work / "cache"),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1" if self.device == "cpu" else os.environ.get("OMP_NUM_THREADS", "4"),
        }


# ------------------------------------------------------------------------------------------------ data and runs
DEMO_RECIPES = ("tiny_gsm8k", "tiny_geo3k", "tiny_geo3k_dapo", "tiny_tool_gsm8k")
# a reward that varies with the text: a random-init model's samples get different rewards, so every step
# has a real policy gradient (the demo reward scores them all 0), and DAPO's dynamic sampling keeps groups
VARIED_REWARD = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return (len(solution_str) * 7 + sum(map(ord, solution_str))) % 5 / 4.0\n"
)


def small_overrides(ctx: Context, recipe: str, out: Path, steps: int) -> list[str]:
    """A small, fast run of a demo recipe on the device: 4 prompts x 4 samples, no validation."""
    data = ctx.work / "data" / recipe
    args = [
        f"af_output_dir={out}",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}",
        f"trainer.device={ctx.device}",
        "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[console]",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "data.train_batch_size=4",
        f"{R}.n=4",
        f"{A}.ppo_mini_batch_size=4",
        f"{A}.ppo_micro_batch_size_per_gpu=8",
        f"{R}.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        f"custom_reward_function.path={ctx.work / 'varied_reward.py'}",
        "custom_reward_function.name=compute_score",
    ]
    if recipe == "tiny_geo3k_dapo":
        args += ["data.gen_batch_size=8"]
    return args


def train(
    ctx: Context,
    recipe: str,
    overrides: list[str],
    *,
    phases: bool = False,
    transfers: bool = False,
    timeout: int = 600,
) -> dict:
    """`verl-npu run RECIPE OVERRIDES` in a process of its own (`--train`): {"code", "output" (its
    stdout+stderr), "report" (what `_train_main` saw of the workers; with `transfers`, separate_async's
    weight transfers, `_watch_transfers`), "seconds"}."""
    spec = Path(tempfile.mkstemp(dir=ctx.work, prefix="train-", suffix=".json")[1])
    report = spec.with_suffix(".report.json")
    spec.write_text(
        json.dumps(
            {"recipe": recipe, "overrides": overrides, "phases": phases, "report": str(report), "transfers": transfers}
        )
    )
    start = time.time()
    code, output = run_process([sys.executable, __file__, "--train", str(spec)], ctx.env, timeout)
    out = {
        "code": code,
        "output": output,
        "seconds": round(time.time() - start, 1),
        "report": json.loads(report.read_text()) if report.is_file() else {},
    }
    if code != 0:
        raise RuntimeError(f"verl-npu run {recipe} {' '.join(overrides)} exited {code}:\n" + tail(output))
    return out


def run_process(argv: list[str], env: dict, timeout: float) -> tuple[int | None, str]:
    """(exit code, stdout + stderr) of `argv` run from the repository root; on timeout its whole
    process group (the training processes it started too) is killed and the code is None."""
    proc = subprocess.Popen(
        argv, env=env, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return None, output + f"\n[cuda_check] timed out after {timeout:.0f} s: killed"


def _train_main(spec_path: str) -> int:
    """The `--train` process: `verl_npu.cli.main(["run", ...])` with the trainer's run_training and
    build_workers wrapped, to record the actor's dtypes after the run and, with "phases", each worker
    call's peak device memory."""
    import torch

    from verl_npu import cli
    from verl_npu.trainer import entry

    spec = json.loads(Path(spec_path).read_text())
    report: dict = {"phases": {}}
    run_training, build_workers = entry.run_training, entry.build_workers

    def build(rc, steps, device):
        group = build_workers(rc, steps, device)
        if spec["phases"]:
            _measure_phases(group, device, report["phases"])
        return group

    def run(rc, after_fit=None, device=None):
        def inspect(workers):
            report.update(_describe_workers(workers))
            if after_fit is not None:
                after_fit(workers)

        return run_training(rc, after_fit=inspect, device=device)

    entry.build_workers, entry.run_training = build, run
    if spec.get("transfers"):
        from cuda_check_async import watch_transfers

        watch_transfers(report.setdefault("transfers", []))
    if importlib.util.find_spec("matplotlib") is None:
        # the trainer draws training_curves.png with matplotlib (a dependency the GPU machine lacks);
        # without this the run would end in an ImportError after its last step (the env check names it)
        from verl_npu.trainer import ppo

        ppo.plot_training_curves = lambda *args, **kwargs: None
        report["notes"] = ["matplotlib is not installed: training_curves.png not drawn"]
    try:
        code = cli.main(["run", spec["recipe"], "--demo-data", *spec["overrides"]])
    finally:
        entry.build_workers, entry.run_training = build_workers, run_training
        report["torch_max_memory_allocated"] = (
            torch.cuda.max_memory_allocated() if torch.cuda.is_initialized() else None
        )
        Path(spec["report"]).write_text(json.dumps(report))
    return code


def _measure_phases(group, device, peaks: dict) -> None:
    """Wrap `group`'s broadcast / scatter (as bench/memory_grid.py's `_marked` does) so that each worker
    call of a planned phase records its peak: reset_peak_memory before, the peak after (the last call of
    each kind is kept: the second step's). On cuda the peak is torch's max_memory_allocated; on cpu the
    process's peak RSS (not the tensors' bytes the planner predicts: only the plumbing is tested there)."""
    from memory_grid import PHASES

    for meth in ("broadcast", "scatter"):
        inner = getattr(group, meth)

        def call(method, *args, _inner=inner, **kwargs):
            if method not in PHASES:
                return _inner(method, *args, **kwargs)
            device.synchronize()
            device.reset_peak_memory()
            start = device.memory()["allocated_gb"]
            out = _inner(method, *args, **kwargs)
            device.synchronize()
            mem = device.memory()
            peaks[PHASES[method]] = {
                "peak_bytes": int(mem["peak_gb"] * 2**30),
                "start_bytes": int(start * 2**30),
                # the caching allocator's peak: what the device really had to hold
                "reserved_peak_bytes": (device.torch_module.max_memory_reserved() if device.is_accelerator else None),
            }
            return out

        setattr(group, meth, call)


def _describe_workers(group) -> dict:
    """The actor's (and critic's / reference's) parameter dtypes and devices, and the compute dtype."""
    workers = getattr(group, "workers", None)
    if not workers:
        return {"workers": "not in this process"}
    out = {}
    for role, worker in workers.items():
        engine = getattr(worker, "engine", None)
        module = getattr(engine, "module", None)
        if module is None:
            continue
        params = list(module.parameters())
        trainable = [p for p in params if p.requires_grad]
        out[role] = {
            "param_dtypes": sorted({str(p.dtype) for p in params}),
            "trainable_dtypes": sorted({str(p.dtype) for p in trainable}),
            "param_devices": sorted({p.device.type for p in params}),
            "compute_dtype": str(engine.compute_dtype),
            "mixed_precision": _mixed_precision(engine),
            "params": sum(p.numel() for p in params),
            "trainable": sum(p.numel() for p in trainable),
        }
        ref = getattr(getattr(worker, "ref", None), "module", None)
        if ref is not None:
            out[role]["ref_param_dtypes"] = sorted({str(p.dtype) for p in ref.parameters()})
    return out


def _mixed_precision(engine) -> str:
    """How the engine computes: FSDP2's mixed-precision policy (sharded, as with offloading), autocast
    (one unsharded worker on a bf16 device), or plain fp32."""
    import torch
    from torch.distributed.fsdp import FSDPModule

    if isinstance(engine.module, FSDPModule):
        state = engine.module._get_fsdp_state() if hasattr(engine.module, "_get_fsdp_state") else None
        policy = getattr(getattr(state, "_mp_policy", None), "param_dtype", None)
        return f"FSDP2 MixedPrecisionPolicy(param_dtype={policy})"
    ctx = engine.autocast()
    return f"autocast({ctx.fast_dtype})" if isinstance(ctx, torch.autocast) else "none (fp32)"


def training_rows(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "training/global_step" in r]


def assert_finite(rows: list[dict]) -> None:
    """Every metric finite, and the actor had a gradient to train on (grad norm > 0 at some step)."""
    bad = [(r["step"], k, v) for r in rows for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)]
    assert not bad, f"metrics not finite: {bad[:10]}"
    norms = [r.get("actor/grad_norm") for r in rows]
    assert any(n for n in norms), f"actor/grad_norm {norms}: no step trained on a gradient"


def run_numbers(rows: list[dict], report: dict, seconds: float) -> dict:
    """Step time (the steps after the first, which holds the warm-up), the last step's headline
    metrics and the actor's dtypes."""
    times = [r["timing_s/step"] for r in rows if "timing_s/step" in r]
    later = times[1:] or times
    last = rows[-1] if rows else {}
    keys = (
        "critic/score/mean",
        "actor/pg_loss",
        "actor/entropy",
        "actor/grad_norm",
        "actor/kl_loss",
        "critic/vf_loss",
        "response_length/mean",
    )
    return {
        "steps": [r["step"] for r in rows],
        "timing_s/step": round(sum(later) / len(later), 3) if later else None,
        "wall_s": seconds,
        **{k: last[k] for k in keys if k in last},
        "actor": report.get("actor"),
        "notes": report.get("notes", []),
    }


# ------------------------------------------------------------------------------------------------ check bodies
def check_setup(ctx: Context, memory_configs: list[str]) -> dict:
    """Tiny models and synthetic data of the demo recipes and of the memory configurations that will
    run, made once before the checks run in parallel (they share them)."""
    from verl_npu.config import load_recipe
    from verl_npu.demo import prepare_assets

    (ctx.work / "varied_reward.py").write_text(VARIED_REWARD)
    made = []
    for recipe in DEMO_RECIPES:
        rc = load_recipe(recipe, small_overrides(ctx, recipe, ctx.work / "runs" / "setup", 1))
        made += prepare_assets(rc, demo_data=True)
    import memory_grid

    for name in memory_configs:
        memory_grid.overrides(name, ctx.work / "memory")
    memory_grid.build_model(ctx.work / "memory" / "models", "lm", memory_grid.MID)
    import cuda_check_more

    cuda_check_more.setup(ctx)
    return {"made": len(made)}


# the modules of pyproject.toml's dependencies
DEPENDENCIES = (
    "torch",
    "torchvision",
    "transformers",
    "peft",
    "tokenizers",
    "omegaconf",
    "yaml",
    "ray",
    "pyarrow",
    "pandas",
    "numpy",
    "PIL",
    "qwen_vl_utils",
    "mathruler",
    "pylatexenc",
    "tensorboard",
    "safetensors",
    "tqdm",
    "matplotlib",
)


def check_env(ctx: Context) -> dict:
    import torch
    import transformers

    from verl_npu.device import detect_device, varlen_attention_kernel

    out = ctx.found
    out.update(
        {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cuda_build": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(),
            "flash_attn_installed": importlib.util.find_spec("flash_attn") is not None,
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "missing_dependencies": [m for m in DEPENDENCIES if importlib.util.find_spec(m) is None],
        }
    )
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(
            gpu=torch.cuda.get_device_name(0),
            capability=list(torch.cuda.get_device_capability(0)),
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            gpus=torch.cuda.device_count(),
            bf16=torch.cuda.is_bf16_supported(),
            nccl_available=torch.distributed.is_nccl_available(),
        )
    detected = out["detected"] = {}
    for requested in (None, "cuda") if ctx.device == "cuda" else (None, "cpu"):
        try:
            info = detect_device(requested)
            detected[str(requested)] = {
                "kind": info.kind,
                "backend": info.dist_backend,
                "visible_devices_env": info.visible_devices_env,
                "count": info.count(),
                "describe": info.describe(),
                "compute_dtype": str(info.train_dtype()),
                "attn_implementation": info.attn_implementation(),
                "memory_gb": {k: round(v, 2) for k, v in info.memory().items()},
            }
        except Exception as exc:  # noqa: BLE001 - recorded, then asserted below
            detected[str(requested)] = {"error": f"{type(exc).__name__}: {exc}"}
    out["varlen_kernel"] = varlen_attention_kernel(ctx.device)
    expected = "flash_attn" if ctx.device == "cuda" and out["flash_attn_installed"] else "sdpa_sequences"
    assert out["varlen_kernel"] == expected, f"varlen kernel {out['varlen_kernel']}, expected {expected}"
    want = {
        "kind": ctx.device,
        "backend": "nccl" if ctx.device == "cuda" else "gloo",
        "visible_devices_env": "CUDA_VISIBLE_DEVICES" if ctx.device == "cuda" else None,
    }
    for requested, info in detected.items():
        got = {k: info.get(k) for k in want}
        assert got == want, f"trainer.device={requested}: detected {got}, expected {want}"
    if ctx.device == "cuda":
        assert detected["cuda"]["compute_dtype"] == "torch.bfloat16", "cuda computes in bf16 (the card has it)"
    return out


def _hub_id(recipe_text: str) -> str:
    """The hub id of the model an accelerator recipe's EDIT_ME model path names (…/Qwen2.5-7B-Instruct)."""
    for line in recipe_text.splitlines():
        if line.strip().startswith("path:") and "EDIT_ME" in line:
            return "Qwen/" + line.split("/")[-1].strip().strip('"')
    return "Qwen/Qwen2.5-0.5B-Instruct"


def check_validate(ctx: Context) -> dict:
    import yaml

    def validate(name: str, overrides: list[str]) -> dict:
        done = subprocess.run(
            [sys.executable, "-m", "verl_npu.cli", "validate", name, *overrides],
            env=ctx.env,
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=120,
        )
        lines = [ln.strip() for ln in done.stdout.splitlines() if ln.strip()]
        problems = [ln[2:].split(":")[0] for ln in lines if ln.startswith("- ")]
        plan = [ln for ln in lines if ln.startswith("memory plan:")]
        if done.returncode == 0:
            summary = plan[-1] if plan else (lines[-1] if lines else "")
        else:
            summary = f"{len(problems)} problem(s): {', '.join(problems)}" if problems else " / ".join(lines[-3:])
        return {
            "rc": done.returncode,
            "traceback": "Traceback" in done.stdout,
            "summary": summary,
            "output_tail": tail(done.stdout, 12),
        }

    jobs = {}
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        name = path.stem
        if name.startswith("tiny_"):
            raw = yaml.safe_load(path.read_text())
            # a stages recipe's overrides name their stage (sft.trainer.device=..., rl.trainer.device=...)
            stages = [s["name"] for s in raw.get("stages", [])] if isinstance(raw, dict) else []
            jobs[name] = [f"{stage}.trainer.device={ctx.device}" for stage in stages] or [
                f"trainer.device={ctx.device}"
            ]
        else:
            jobs[name + " (as shipped)"] = []
            jobs[name + " (hub id)"] = [
                f"af_output_dir={ctx.work / 'runs' / name}",
                "data.train_files=/data/train.parquet",
                "data.val_files=/data/test.parquet",
                f"actor_rollout_ref.model.path={_hub_id(path.read_text())}",
                f"trainer.device={ctx.device}",
            ]
    with ThreadPoolExecutor(4) as pool:
        results = ctx.found["recipes"] = dict(
            zip(jobs, pool.map(lambda kv: validate(kv[0].split(" ")[0], kv[1]), jobs.items()))
        )
    failed = [n for n, r in results.items() if n.startswith("tiny_") and r["rc"] != 0]
    tracebacks = [n for n, r in results.items() if r["traceback"]]
    assert not failed and not tracebacks, f"tiny recipes failing: {failed}; tracebacks: {tracebacks}"
    return {"recipes": results, "tiny_ok": sum(n.startswith("tiny_") for n in results)}


def run_folder(ctx: Context) -> Path:
    """This check's own output folder, empty (a --work folder may be reused)."""
    out = ctx.work / "runs" / ctx.name
    shutil.rmtree(out, ignore_errors=True)
    return out


def check_text_resume(ctx: Context) -> dict:
    out = run_folder(ctx)
    args = [
        a
        for a in small_overrides(ctx, "tiny_gsm8k", out, 4)
        if not a.startswith(("trainer.save_freq", "trainer.resume_mode"))
    ]
    first = train(ctx, "tiny_gsm8k", args + ["trainer.save_freq=2", "trainer.resume_mode=auto"])
    rows_first = training_rows(out)
    assert [r["step"] for r in rows_first] == [1, 2, 3, 4], f"first run steps {[r['step'] for r in rows_first]}"
    args6 = [a.replace("total_training_steps=4", "total_training_steps=6") for a in args]
    second = train(ctx, "tiny_gsm8k", args6 + ["trainer.save_freq=2", "trainer.resume_mode=auto"])
    assert "resumed from" in second["output"] and "global_step_4" in second["output"], (
        "the second run did not say it resumed from global_step_4:\n" + tail(second["output"])
    )
    rows = training_rows(out)
    steps = [r["step"] for r in rows]
    assert steps == [1, 2, 3, 4, 5, 6], f"metrics.jsonl steps {steps}"
    assert_finite(rows)
    ckpts = out / "checkpoints"
    assert (ckpts / "latest_checkpointed_iteration.txt").read_text().strip() == "6"
    layout = sorted(
        str(p.relative_to(ckpts / "global_step_6")) for p in (ckpts / "global_step_6").rglob("*") if p.is_file()
    )
    # verl's names (trainer_state.json is ours: verl's data.pt holds the same, pickled)
    for needed in (
        "actor/huggingface/config.json",
        "actor/huggingface/model.safetensors",
        "trainer_state.json",
        "actor/model_world_size_1_rank_0.pt",
        "actor/optim_world_size_1_rank_0.pt",
        "actor/extra_state_world_size_1_rank_0.pt",
    ):
        assert needed in layout, f"global_step_6 lacks {needed}: {layout}"
    actor = second["report"].get("actor", {})
    if ctx.device == "cuda":
        assert actor.get("param_devices") == ["cuda"], f"actor parameters on {actor.get('param_devices')}"
        assert actor.get("trainable_dtypes") == ["torch.float32"], "fp32 master weights"
    return {
        **run_numbers(rows[4:], second["report"], second["seconds"]),
        "first_run_s": first["seconds"],
        "first_run_timing_s/step": run_numbers(rows_first, first["report"], 0)["timing_s/step"],
        "checkpoints": sorted(p.name for p in ckpts.iterdir()),
        "global_step_6": layout,
    }


def check_run(ctx: Context, recipe: str, steps: int, extra: tuple) -> dict:
    out = run_folder(ctx)
    done = train(ctx, recipe, small_overrides(ctx, recipe, out, steps) + list(extra))
    rows = training_rows(out)
    ctx.found.update(run_numbers(rows, done["report"], done["seconds"]))
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), f"steps {[r['step'] for r in rows]}"
    assert_finite(rows)
    if any(a.startswith("algorithm.adv_estimator=gae") for a in extra):
        assert all("critic/vf_loss" in r for r in rows), "no critic/vf_loss"
    if f"{A}.use_kl_loss=true" in extra:
        assert all("actor/kl_loss" in r for r in rows), "no actor/kl_loss"
    return run_numbers(rows, done["report"], done["seconds"])


def check_memory(ctx: Context, name: str) -> dict:
    """A memory_grid.py configuration, 2 steps on the device, each phase's peak against the plan."""
    import memory_grid

    from verl_npu.config import load_recipe
    from verl_npu.device import detect_device
    from verl_npu.memory.plan import model_size
    from verl_npu.memory.recipe import plan_recipe

    recipe, args, model = memory_grid.overrides(name, ctx.work / "memory")
    args = [a.replace("trainer.device=cpu", f"trainer.device={ctx.device}") for a in args]
    workers = memory_grid.CONFIGS[name][2]
    assert workers == 1, f"{name}: {workers} workers; this machine runs one"
    done = train(ctx, recipe, args, phases=True)
    measured = ctx.found["measured"] = done["report"]["phases"]
    device = detect_device(ctx.device)
    accelerator = device.is_accelerator and str(device.train_dtype()) == "torch.bfloat16"
    total = int(device.memory()["total_gb"] * 2**30)
    rc = load_recipe(recipe, args)
    size = model_size(json.loads((model / "config.json").read_text()))
    plan = plan_recipe(rc, total, ctx.device, {"actor": size}, accelerator=accelerator)
    planned = {p.name: p.total for p in plan.phases}
    phases = {}
    for phase, got in measured.items():
        want = planned.get(phase)
        peak = got["peak_bytes"]
        phases[phase] = {
            "planned_mb": round(want / 1e6, 1) if want else None,
            "measured_mb": round(peak / 1e6, 1),
            "start_mb": round(got["start_bytes"] / 1e6, 1),
            "reserved_mb": _mb(got["reserved_peak_bytes"]),
            "error": round(want / peak - 1, 3) if want and peak else None,
        }
    expected = {memory_grid.PHASES[m] for m in ("generate_sequences", "update_actor")}
    assert expected <= set(phases), f"phases measured: {sorted(phases)}"
    return {
        "params": size.params,
        "measured_kind": "max_memory_allocated"
        if device.is_accelerator
        else "peak RSS (cpu: not what the plan predicts)",
        "planned_compute_bytes": 2 if accelerator else 4,
        "phases": phases,
        "wall_s": done["seconds"],
        "actor": done["report"].get("actor"),
        "plan_peak": plan.peak.name,
        "run_max_memory_allocated_mb": _mb(done["report"]["torch_max_memory_allocated"]),
    }


def _mb(value: int | None) -> float | None:
    return None if value is None else round(value / 1e6, 1)


# ------------------------------------------------------------------------------------------------ the driver
def tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _check_main(name: str, device: str, work: str, memory_configs: list[str]) -> int:
    """The `--check NAME` process: run it, print its numbers as the last line (JSON)."""
    ctx = Context(device, Path(work), name)
    try:
        if name == "setup":
            numbers = check_setup(ctx, memory_configs)
        else:
            check = next(c for c in CHECKS if c.name == name)
            module, _, fn = check.fn.rpartition(":")
            numbers = getattr(importlib.import_module(module) if module else sys.modules[__name__], fn)(
                ctx, *check.args
            )
    except BaseException:
        traceback.print_exc()
        print("\nFOUND " + json.dumps(ctx.found, default=str))
        return 1
    print("\nRESULT " + json.dumps(numbers, default=str))
    return 0


def run_check(name: str, timeout: float, ctx: Context, extra: tuple = ()) -> dict:
    start = time.time()
    code, output = run_process(
        [sys.executable, __file__, "--check", name, "--device", ctx.device, "--work", str(ctx.work), *extra],
        ctx.env,
        timeout,
    )
    result = {"name": name, "ok": False, "numbers": {}, "seconds": round(time.time() - start, 1), "error": ""}
    lines = output.splitlines()
    last = [ln for ln in lines if ln.startswith("RESULT ")]
    if code == 0 and last:
        result.update(ok=True, numbers=json.loads(last[-1][len("RESULT ") :]))
    else:
        found = [ln for ln in lines if ln.startswith("FOUND ")]
        text = "\n".join(ln for ln in lines if not ln.startswith("FOUND "))
        result.update(
            numbers=json.loads(found[-1][len("FOUND ") :]) if found else {}, error=tail(text), log=tail(text, LOG_LINES)
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="\n".join(__doc__.splitlines()[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default="cuda_check_out", help="results folder (default ./cuda_check_out)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where the checks run (default cuda)")
    parser.add_argument("--quick", action="store_true", help="a smaller subset (the checks marked quick in --list)")
    parser.add_argument("--jobs", type=int, help="checks run at once (default 3 on cuda, 1 on cpu)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these checks only (names from --list)")
    parser.add_argument("--work", help="folder for models, data and runs (default: a new temporary folder)")
    parser.add_argument(
        "--budget",
        type=int,
        help="seconds for everything (default 280 on cuda, none on cpu): "
        "each check's timeout is cut to what is left, and one is not started with less than "
        f"{MIN_START} s left (recorded as skipped)",
    )
    parser.add_argument("--list", action="store_true", help="the checks and what each asserts")
    parser.add_argument("--check", help=argparse.SUPPRESS)
    parser.add_argument("--memory-configs", default="", help=argparse.SUPPRESS)  # setup: what to build
    parser.add_argument("--train", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train:
        return _train_main(args.train)
    if args.check:
        return _check_main(args.check, args.device, args.work, [n for n in args.memory_configs.split(",") if n])
    if args.list:
        for c in CHECKS:
            print(f"{c.name:14s}{' (quick)' if c.quick else '        '} {c.asserts}")
        return 0
    unknown = set(args.only or ()) - {c.name for c in CHECKS}
    if unknown:
        parser.error(f"--only: unknown check(s) {sorted(unknown)}; see --list")
    checks = [c for c in CHECKS if (not args.quick or c.quick) and (not args.only or c.name in args.only)]
    jobs = args.jobs or (3 if args.device == "cuda" else 1)
    budget = args.budget if args.budget is not None else (280 if args.device == "cuda" else None)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="cuda_check_"))
    work.mkdir(parents=True, exist_ok=True)
    ctx = Context(args.device, work)
    out = Path(args.out)
    scale = 1 if args.device == "cuda" else SLOWER
    started = time.time()
    meta = {
        "device": args.device,
        "quick": args.quick,
        "jobs": jobs,
        "work": str(work),
        "argv": sys.argv[1:],
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "seconds": 0,
    }
    print(f"[cuda_check] work folder {work}; results to {out}", flush=True)
    memory = ",".join(c.args[0] for c in checks if c.fn == "check_memory")
    results = [run_check("setup", min(300 * scale, budget or math.inf), ctx, ("--memory-configs", memory))]
    print(f"[cuda_check] setup: {'ok' if results[0]['ok'] else 'FAILED'} ({results[0]['seconds']} s)", flush=True)
    order = checks  # in the list's order, the most telling first: a spent --budget skips the last ones

    def one(check: Check) -> dict:
        left = math.inf if budget is None else budget - (time.time() - started)
        if left < MIN_START:
            result = {
                "name": check.name,
                "ok": False,
                "numbers": {},
                "seconds": 0,
                "error": f"skipped: less than {MIN_START} s of the --budget of {budget} s was left",
            }
        else:
            result = run_check(check.name, min(check.timeout * scale, left), ctx)
        print(
            f"[cuda_check] {check.name}: {'ok' if result['ok'] else 'FAILED'} ({result['seconds']} s) "
            f"{headline(result)[:300]}",
            flush=True,
        )
        return result

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for future in as_completed([pool.submit(one, c) for c in order]):
            results.append(future.result())
            meta["seconds"] = round(time.time() - started, 1)
            write_results(out, meta, _in_list_order(results))
    results = _in_list_order(results)
    env = next((r for r in results if r["name"] == "env" and r["ok"]), None)
    meta.update(seconds=round(time.time() - started, 1), gpu=(env or {}).get("numbers", {}).get("gpu", ""))
    write_results(out, meta, results)
    ok = sum(r["ok"] for r in results)
    print(markdown(meta, results).split("\n\n## ")[0])  # the tables, without the failures' tails
    print(f"[cuda_check] {ok}/{len(results)} checks passed in {meta['seconds']} s: {out / 'cuda_check.md'}")
    return 0 if ok == len(results) else 1


def _in_list_order(results: list[dict]) -> list[dict]:
    rank = {"setup": -1, **{c.name: i for i, c in enumerate(CHECKS)}}
    return sorted(results, key=lambda r: rank[r["name"]])


# the stages beyond one RL run (SFT, distillation, activation offload, torch_memory, shm): bench/cuda_check_more.py
from cuda_check_async import ASYNC_CHECKS  # noqa: E402
from cuda_check_more import MORE_CHECKS  # noqa: E402

CHECKS += ASYNC_CHECKS + MORE_CHECKS

if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # the --check / --train processes: the traceback is the error tail the driver keeps
        traceback.print_exc()
        sys.exit(1)
