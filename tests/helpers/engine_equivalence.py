"""Bit-for-bit equivalence of two source trees on tiny CPU runs (a helper, not a pytest file).

    python tests/helpers/engine_equivalence.py run TREE OUT [NAME ...]   # the runs of RUNS with TREE's verl_npu
    python tests/helpers/engine_equivalence.py compare OUT_A OUT_B       # every metric and checkpoint tensor, ==

Each run is `verl-npu run` in a subprocess with PYTHONPATH=TREE, writing OUT/NAME (the runs of BF16 with
the device's compute dtype patched to bf16, so that one worker autocasts; those of RESUMED run a second
time in the same folder and resume). Set VERL_NPU_CACHE to one folder for both trees. `compare` reports,
per run, the metric keys whose values differ (timing_s/*, perf/* and memory keys are left out) and the
checkpoint files whose tensors differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run_helpers import text_data, text_run_overrides  # noqa: E402

GAE = {
    "algorithm.adv_estimator": "gae",
    "algorithm.gamma": 1.0,
    "algorithm.lam": 0.95,
    "critic.optim.lr": 1e-3,
    "critic.ppo_micro_batch_size_per_gpu": 2,
    "critic.cliprange_value": 0.5,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
}
STEPS3 = {"trainer.total_training_steps": 3, "trainer.save_freq": 3}
KL = {
    "actor_rollout_ref.actor.use_kl_loss": "true",
    "actor_rollout_ref.actor.kl_loss_coef": 0.05,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
}
#: name -> (recipe, overrides beyond text_run_overrides)
RUNS = {
    "a_grpo_kl_2mini": ("tiny_gsm8k", {**STEPS3, **KL, "actor_rollout_ref.actor.ppo_mini_batch_size": 2}),
    "b_grpo_1mini": ("tiny_gsm8k", {**STEPS3}),
    "c_gae_critic": ("tiny_gsm8k", {**STEPS3, **GAE, "actor_rollout_ref.actor.ppo_mini_batch_size": 2}),
    "d_reward_model": (
        "tiny_gsm8k",
        {
            **STEPS3,
            "reward_model.enable": "true",
            "reward_model.model.path": "tiny://qwen2rm",
            "reward_model.micro_batch_size_per_gpu": 2,
        },
    ),
    "e_lora": (
        "tiny_gsm8k",
        {
            **STEPS3,
            **KL,
            "actor_rollout_ref.model.lora_rank": 4,
            "actor_rollout_ref.model.lora_alpha": 8,
            "actor_rollout_ref.actor.optim.lr": 0.05,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        },
    ),
    "f_two_workers": (
        "tiny_gsm8k",
        {
            **STEPS3,
            **KL,
            **GAE,
            "trainer.n_gpus_per_node": 2,
            "ray_init.num_cpus": 2,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        },
    ),
    "g_geo3k_vision": (
        "tiny_geo3k",
        {
            "trainer.total_training_steps": 2,
            "trainer.save_freq": 2,
            "actor_rollout_ref.model.path": "tiny://qwen25vl",
            "data.max_prompt_length": 128,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
        },
    ),
    "h_dynamic_epochs": (
        "tiny_gsm8k",
        {
            **STEPS3,
            **GAE,
            "actor_rollout_ref.actor.use_dynamic_bsz": "true",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 80,
            "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": "true",
            "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 80,
            "critic.ppo_max_token_len_per_gpu": 80,
            "actor_rollout_ref.actor.ppo_epochs": 2,
            "actor_rollout_ref.actor.shuffle": "true",
            "critic.shuffle": "true",
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        },
    ),
    # two steps saved each step, then the same folder again to step 3: resumed from global_step_2
    "i_resume_critic_kl": (
        "tiny_gsm8k",
        {
            **KL,
            **GAE,
            "trainer.total_training_steps": 2,
            "trainer.save_freq": 1,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        },
    ),
}
#: runs whose device computes in bf16 (DeviceInfo.train_dtype patched): one worker autocasts
BF16 = {
    "j_bf16_autocast_critic_rm_kl": (
        "tiny_gsm8k",
        {
            **STEPS3,
            **KL,
            **GAE,
            "reward_model.enable": "true",
            "reward_model.model.path": "tiny://qwen2rm",
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        },
    )
}
RUNS.update(BF16)
#: the CLI with the device's compute dtype patched to bf16
BF16_CLI = (
    "import sys, torch; from verl_npu.device import DeviceInfo; "
    "DeviceInfo.train_dtype = lambda self: torch.bfloat16; from verl_npu.cli import main; sys.exit(main())"
)
#: runs continued by a second `verl-npu run` in the same folder with these overrides
RESUMED = {"i_resume_critic_kl": {"trainer.total_training_steps": 3}}
SKIPPED_PREFIXES = ("timing_s/", "perf/", "actor/perf/")
#: checkpoint entries that differ between two runs of the same tree: Python's `random` is seeded
#: from the OS at start-up and nothing in a run reseeds it
UNSEEDED = ("/rng/random/", "/rng/numpy/")
#: files that describe other files (sizes, checksums) or that no run writes twice alike (peft writes
#: target_modules from a set: its order changes from process to process)
UNCOMPARED_JSON = ("manifest.json", "trainer_state.json")


def _json(path: Path):
    def normal(value):
        if isinstance(value, dict):
            return {k: normal(v) for k, v in value.items()}
        if isinstance(value, list):
            items = [normal(v) for v in value]
            return sorted(items) if all(isinstance(v, str) for v in items) else items
        return value

    return normal(json.loads(path.read_text()))


def run(tree: Path, out: Path, names: list[str]) -> None:
    data, geo = out / "data", out / "geo_data"
    if not (data / "train.parquet").exists():
        text_data(data)
    if not (geo / "train.parquet").exists():
        from verl_npu.data.geometry3k import prepare_synthetic

        prepare_synthetic(geo, n_train=8, n_test=4, seed=0, image_size=56)
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    for name in names or list(RUNS):
        recipe, extra = RUNS[name]
        over = text_run_overrides(out / name, geo if recipe == "tiny_geo3k" else data, **extra)
        start = time.time()
        cli = ["-c", BF16_CLI] if name in BF16 else ["-m", "verl_npu.cli"]
        proc = subprocess.run(
            [sys.executable, *cli, "run", recipe, *over], cwd=tree, env=env, capture_output=True, text=True
        )
        if name in RESUMED and proc.returncode == 0:
            again = text_run_overrides(out / name, data, **{**extra, **RESUMED[name]})
            proc = subprocess.run(
                [sys.executable, "-m", "verl_npu.cli", "run", recipe, *again],
                cwd=tree,
                env=env,
                capture_output=True,
                text=True,
            )
        (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
        print(f"{name}: exit {proc.returncode} in {time.time() - start:.0f}s", flush=True)


def _metrics(folder: Path) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(SKIPPED_PREFIXES) and "memory" not in k} for r in rows]


def _tensors(path: Path) -> dict:
    import torch

    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    obj = torch.load(path, weights_only=False, map_location="cpu")
    flat: dict = {}

    def walk(prefix, value):
        if hasattr(value, "to_local"):
            value = value.to_local()
        if torch.is_tensor(value):
            flat[prefix] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}/{k}", v)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(f"{prefix}/{i}", v)
        else:
            flat[prefix] = repr(value)

    walk("", obj)
    return flat


def compare(a: Path, b: Path) -> bool:
    import torch

    same_everywhere = True
    for name in RUNS:
        if not (a / name / "metrics.jsonl").exists() or not (b / name / "metrics.jsonl").exists():
            print(f"{name}: missing in {'a' if not (a / name / 'metrics.jsonl').exists() else 'b'}")
            same_everywhere = False
            continue
        ma, mb = _metrics(a / name), _metrics(b / name)
        diffs = []
        if len(ma) != len(mb):
            diffs.append(f"{len(ma)} vs {len(mb)} rows")
        for ra, rb in zip(ma, mb):
            for key in sorted(set(ra) | set(rb)):
                if ra.get(key, "<absent>") != rb.get(key, "<absent>"):
                    diffs.append(f"step {ra.get('step')} {key}: {ra.get(key, '<absent>')} vs {rb.get(key, '<absent>')}")
        files_a = sorted(
            p.relative_to(a / name)
            for p in (a / name / "checkpoints").rglob("*")
            if p.is_file() and p.suffix in (".pt", ".safetensors", ".json")
        )
        files_b = sorted(
            p.relative_to(b / name)
            for p in (b / name / "checkpoints").rglob("*")
            if p.is_file() and p.suffix in (".pt", ".safetensors", ".json")
        )
        if files_a != files_b:
            diffs.append(f"checkpoint files differ: {sorted(set(map(str, files_a)) ^ set(map(str, files_b)))}")
        tensors = 0
        for rel in files_a:
            if rel not in files_b or rel.suffix == ".json":
                if (
                    rel.suffix == ".json"
                    and rel in files_b
                    and rel.name not in UNCOMPARED_JSON
                    and _json(a / name / rel) != _json(b / name / rel)
                ):
                    diffs.append(f"{rel} differs")
                continue
            ta, tb = _tensors(a / name / rel), _tensors(b / name / rel)
            if set(ta) != set(tb):
                diffs.append(f"{rel}: keys differ {sorted(set(ta) ^ set(tb))[:5]}")
            for key in sorted(k for k in set(ta) & set(tb) if not k.startswith(UNSEEDED)):
                va, vb = ta[key], tb[key]
                tensors += 1
                if torch.is_tensor(va) != torch.is_tensor(vb):
                    same = False
                elif torch.is_tensor(va):
                    same = va.dtype == vb.dtype and va.shape == vb.shape and torch.equal(va, vb)
                else:
                    same = va == vb
                if not same:
                    diffs.append(f"{rel} {key} differs")
        same_everywhere &= not diffs
        print(
            f"{name}: {'IDENTICAL' if not diffs else 'DIFFERENT'} ({len(ma)} metric rows, "
            f"{len(files_a)} checkpoint files, {tensors} tensors/values)"
        )
        for line in diffs[:20]:
            print("   ", line)
    return same_everywhere


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve(), sys.argv[4:])
    else:
        sys.exit(0 if compare(Path(sys.argv[2]), Path(sys.argv[3])) else 1)
