"""Record short CPU runs' metrics and final weights, and check that a code change left them bit-identical.

    python bench/metrics_identical.py record base.json [--repo DIR]   # e.g. DIR: a checkout of main
    python bench/metrics_identical.py record new.json
    python bench/metrics_identical.py compare base.json new.json
    python bench/metrics_identical.py check base.json                  # record into a temp file, then compare

Each scenario is one or more `verl-npu run` commands (a subprocess each, in the checkout given by --repo,
default this one) into a fresh folder: the tiny picture demo on 1 worker and on 2 Ray workers, each with a
resume (2 steps, then the same folder to step 3), a GAE run with a critic, KL in the reward and the adaptive
KL controller, a LoRA run, a reward-model run, the DAPO demo (dynamic sampling, overlong shaping) and a
GSPO/loss-mode variant. What is compared: every metric of every row of metrics.jsonl (training and
validation), except wall-clock ones (timing_s/*, perf/*, */perf/*, throughput), and the sha256 of every
file of the last checkpoint's Hugging Face export (the trained weights). Equal means equal: no tolerance.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

VARIED_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(sum(map(ord, solution_str)) % 7) / 6.0
"""

#: metrics that measure wall-clock time or memory, not what was computed
WALL_CLOCK = ("timing_s/", "perf/", "throughput", "time_per", "_time", "memory")


def _geo(out: Path, data: Path, **extra) -> list[str]:
    values = {
        "af_output_dir": out,
        "data.train_files": data / "geo" / "train.parquet",
        "data.val_files": data / "geo" / "test.parquet",
        "data.train_batch_size": 4,
        "data.max_response_length": 3,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
        "actor_rollout_ref.actor.use_kl_loss": "true",
        "actor_rollout_ref.actor.kl_loss_coef": 0.05,
        "actor_rollout_ref.actor.entropy_coeff": 0.01,
        "actor_rollout_ref.rollout.n": 4,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
        "custom_reward_function.path": data / "varied_reward.py",
        "trainer.total_training_steps": 3,
        "trainer.save_freq": 2,
        "trainer.test_freq": 3,
        "trainer.logger": "[console,file]",
        "ray_init.num_cpus": 2,
    }
    values.update(extra)
    return [f"{k}={v}" for k, v in values.items()]


def _text(out: Path, data: Path, **extra) -> list[str]:
    values = {
        "af_output_dir": out,
        "data.train_files": data / "text" / "train.parquet",
        "data.val_files": data / "text" / "test.parquet",
        "data.train_batch_size": 4,
        "data.max_prompt_length": 32,
        "data.max_response_length": 4,
        "actor_rollout_ref.model.path": "tiny://qwen2",
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
        "actor_rollout_ref.actor.use_kl_loss": "false",
        "actor_rollout_ref.rollout.n": 2,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 4,
        "custom_reward_function.path": data / "varied_reward.py",
        "trainer.total_training_steps": 3,
        "trainer.save_freq": 3,
        "trainer.test_freq": 3,
        "trainer.val_before_train": "false",
        "trainer.logger": "[console,file]",
        "ray_init.num_cpus": 2,
    }
    values.update(extra)
    return [f"{k}={v}" for k, v in values.items()]


def scenarios(data: Path) -> dict[str, list[tuple[str, callable]]]:
    """name -> [(recipe, overrides(out))]: the runs of one scenario, in order, into one folder."""
    two = {"trainer.n_gpus_per_node": 2}
    return {
        "geo_1worker": [("tiny_geo3k", lambda o: _geo(o, data))],
        "geo_1worker_resume": [
            ("tiny_geo3k", lambda o: _geo(o, data, **{"trainer.total_training_steps": 2})),
            ("tiny_geo3k", lambda o: _geo(o, data)),
        ],
        "geo_2workers": [("tiny_geo3k", lambda o: _geo(o, data, **two))],
        "geo_2workers_resume": [
            ("tiny_geo3k", lambda o: _geo(o, data, **two, **{"trainer.total_training_steps": 2})),
            ("tiny_geo3k", lambda o: _geo(o, data, **two)),
        ],
        "text_gae_kl_in_reward": [
            (
                "tiny_gsm8k",
                lambda o: _text(
                    o,
                    data,
                    **{
                        "algorithm.adv_estimator": "gae",
                        "algorithm.gamma": 0.99,
                        "algorithm.lam": 0.95,
                        "algorithm.use_kl_in_reward": "true",
                        "algorithm.kl_ctrl.type": "adaptive",
                        "algorithm.kl_ctrl.kl_coef": 0.02,
                        "critic.optim.lr": 1e-3,
                        "critic.ppo_micro_batch_size_per_gpu": 2,
                        "critic.cliprange_value": 0.5,
                        "actor_rollout_ref.actor.ppo_epochs": 2,
                    },
                ),
            )
        ],
        "text_lora": [
            (
                "tiny_gsm8k",
                lambda o: _text(
                    o,
                    data,
                    **{
                        "actor_rollout_ref.model.lora_rank": 4,
                        "actor_rollout_ref.model.lora_alpha": 8,
                        "actor_rollout_ref.actor.use_kl_loss": "true",
                        "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
                        "actor_rollout_ref.actor.optim.lr": 1e-2,
                    },
                ),
            )
        ],
        "text_reward_model": [
            (
                "tiny_gsm8k",
                lambda o: _text(
                    o,
                    data,
                    **{
                        "reward_model.enable": "true",
                        "reward_model.model.path": "tiny://qwen2rm",
                        "reward_model.micro_batch_size_per_gpu": 2,
                        "algorithm.adv_estimator": "rloo",
                    },
                ),
            )
        ],
        "text_gspo_loss_modes": [
            (
                "tiny_gsm8k",
                lambda o: _text(
                    o,
                    data,
                    **{
                        "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo",
                        "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",
                        "actor_rollout_ref.actor.clip_ratio_low": 3e-4,
                        "actor_rollout_ref.actor.clip_ratio_high": 4e-4,
                        "algorithm.norm_adv_by_std_in_grpo": "false",
                        "actor_rollout_ref.model.use_remove_padding": "false",
                        "actor_rollout_ref.actor.use_dynamic_bsz": "true",
                        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 64,
                    },
                ),
            )
        ],
        "geo_dapo": [
            (
                "tiny_geo3k_dapo",
                lambda o: _geo(
                    o,
                    data,
                    **{
                        "data.gen_batch_size": 4,
                        "actor_rollout_ref.actor.use_kl_loss": "false",
                        "algorithm.filter_groups.max_num_gen_batches": 3,
                    },
                ),
            )
        ],
    }


def _make_data(data: Path, repo: Path, env: dict) -> None:
    data.mkdir(parents=True, exist_ok=True)
    (data / "varied_reward.py").write_text(VARIED_REWARD)
    code = (
        "import sys; from pathlib import Path\n"
        "sys.path[:0] = ['tests/helpers', 'tests']  # the helpers' folder (a checkout before the move: tests/)\n"
        "from verl_npu.data.geometry3k import prepare_synthetic\n"
        "from run_helpers import text_data\n"
        f"prepare_synthetic(Path({str(data / 'geo')!r}), n_train=12, n_test=4, seed=0, image_size=56)\n"
        f"text_data(Path({str(data / 'text')!r}))\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, check=True)


def _hf_export(out: Path) -> dict[str, str]:
    """sha256 of each file of every role's Hugging Face export in the newest checkpoint."""
    ckpts = sorted((out / "checkpoints").glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    if not ckpts:
        return {}
    hashes = {}
    for path in sorted(ckpts[-1].rglob("*")):
        if path.is_file() and "huggingface" in path.parts and path.suffix in (".safetensors", ".bin"):
            hashes[str(path.relative_to(ckpts[-1]))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"step": ckpts[-1].name, **hashes}


def _metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if not any(w in k for w in WALL_CLOCK)} for row in rows]


def record(result_path: Path, repo: Path, only: list[str]) -> None:
    work = Path(tempfile.mkdtemp(prefix="metrics_identical_"))
    env = dict(
        os.environ,
        PYTHONPATH=str(repo),
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        VERL_NPU_CACHE=str(work / "cache"),
    )
    env.pop("RAY_ADDRESS", None)
    _make_data(work / "data", repo, env)
    result: dict = {"repo": str(repo), "commit": _commit(repo), "scenarios": {}}
    for name, runs in scenarios(work / "data").items():
        if only and name not in only:
            continue
        out = work / name
        started = time.time()
        for recipe, overrides in runs:
            cmd = [sys.executable, "-m", "verl_npu.cli", "run", recipe, *overrides(out)]
            proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(
                    f"{name}: {' '.join(map(str, cmd))}\nfailed ({proc.returncode}):\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
                )
        result["scenarios"][name] = {"metrics": _metrics(out), "weights": _hf_export(out)}
        print(
            f"{name}: {len(result['scenarios'][name]['metrics'])} metric rows, {time.time() - started:.0f}s", flush=True
        )
    result_path.write_text(json.dumps(result, indent=1, sort_keys=True))
    print(f"recorded {result_path}")


def _commit(repo: Path) -> str:
    proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    return (proc.stdout.strip() or "unknown") + (" (with uncommitted changes)" if dirty.strip() else "")


def compare(base_path: Path, new_path: Path, only: list[str] = ()) -> int:
    base, new = json.loads(base_path.read_text()), json.loads(new_path.read_text())
    if only:
        base["scenarios"] = {k: v for k, v in base["scenarios"].items() if k in only}
    problems = []
    for name, b in base["scenarios"].items():
        n = new["scenarios"].get(name)
        if n is None:
            problems.append(f"{name}: not recorded in {new_path}")
            continue
        if len(b["metrics"]) != len(n["metrics"]):
            problems.append(f"{name}: {len(b['metrics'])} metric rows, now {len(n['metrics'])}")
        for i, (rb, rn) in enumerate(zip(b["metrics"], n["metrics"])):
            for key in sorted(set(rb) | set(rn)):
                if rb.get(key, "<absent>") != rn.get(key, "<absent>"):
                    problems.append(
                        f"{name} row {i} (step {rb.get('step')}): {key}: {rb.get(key, '<absent>')!r} "
                        f"-> {rn.get(key, '<absent>')!r}"
                    )
        if b["weights"] != n["weights"]:
            problems.append(f"{name}: final weights differ: {b['weights']} -> {n['weights']}")
    count = sum(len(s["metrics"]) for s in base["scenarios"].values())
    if problems:
        print("\n".join(problems[:200]))
        print(f"DIFFERENT: {len(problems)} differences ({base['commit']} vs {new['commit']})")
        return 1
    print(
        f"identical: {len(base['scenarios'])} scenarios, {count} metric rows and the final weights "
        f"({base['commit']} vs {new['commit']})"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("result", type=Path)
    rec.add_argument("--repo", type=Path, default=HERE)
    rec.add_argument("--only", nargs="*", default=[])
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("base", type=Path)
    cmp_.add_argument("new", type=Path)
    chk = sub.add_parser("check")
    chk.add_argument("base", type=Path)
    chk.add_argument("--only", nargs="*", default=[])
    args = parser.parse_args()
    if args.cmd == "record":
        record(args.result, args.repo.resolve(), args.only)
        return 0
    if args.cmd == "compare":
        return compare(args.base, args.new)
    new = Path(tempfile.mkdtemp(prefix="metrics_new_")) / "new.json"
    record(new, HERE, args.only)
    return compare(args.base, new, args.only)


if __name__ == "__main__":
    sys.exit(main())
