"""What the controller ships to its workers (and gets back) per training step, by worker call.

    python bench/datapath_bytes.py [--recipe tiny_geo3k] [--steps 2] [--workers 2] [--json out.json] [override ...]

Runs a demo recipe (default tiny_geo3k, its own settings: 8 pictures x 32 samples, hf rollout; the demo
data made in a temporary folder) on `--workers` Ray workers for `--steps` steps, with `RayWorkerGroup.scatter`
wrapped: every call's arguments (one chunk per rank) and every rank's result are pickled (protocol 5,
tensors with their storage, as Ray ships them in-band) and counted by worker method. Prints the bytes per
step of each call, sent and returned, and the total. Extra `key=value` overrides change the run, e.g.
`actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.ppo_mini_batch_size=4` (a reference
pass and the old-log-prob pass: four worker calls a step). Run it with PYTHONPATH at another checkout to
measure that one (the numbers in docs/architecture.md: main before the thinner data path, and after).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import tempfile
from collections import defaultdict
from pathlib import Path


def measure(recipe: str, steps: int, workers: int, overrides: list[str]) -> dict:
    from verl_npu.config import check_paths, load_recipe
    from verl_npu.demo import prepare_assets
    from verl_npu.trainer.entry import run_training
    from verl_npu.workers import ray_group

    out = Path(tempfile.mkdtemp(prefix="datapath_bytes_"))
    rc = load_recipe(
        recipe,
        [
            f"af_output_dir={out / 'run'}",
            f"data.train_files={out / 'data' / 'train.parquet'}",
            f"data.val_files={out / 'data' / 'test.parquet'}",
            f"trainer.total_training_steps={steps}",
            f"trainer.n_gpus_per_node={workers}",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.val_before_train=false",
            "trainer.logger=[console]",
            f"ray_init.num_cpus={workers}",
            "trainer.resume_mode=disable",
            *overrides,
        ],
    )
    prepare_assets(rc, demo_data=True)
    check_paths(rc)
    sent: dict[str, int] = defaultdict(int)
    returned: dict[str, int] = defaultdict(int)
    calls: dict[str, int] = defaultdict(int)
    real_scatter = ray_group.RayWorkerGroup.scatter

    def counted(self, method, chunks, *args, role="actor", **kwargs):
        results = real_scatter(self, method, chunks, *args, role=role, **kwargs)
        sent[method] += sum(len(pickle.dumps((chunk, args, kwargs), protocol=5)) for chunk in chunks)
        returned[method] += sum(len(pickle.dumps(result, protocol=5)) for result in results)
        calls[method] += 1
        return results

    ray_group.RayWorkerGroup.scatter = counted
    try:
        if run_training(rc) != 0:
            sys.exit("the run failed")
    finally:
        ray_group.RayWorkerGroup.scatter = real_scatter
    return {
        method: {
            "calls_per_step": calls[method] / steps,
            "sent_bytes_per_step": sent[method] / steps,
            "returned_bytes_per_step": returned[method] / steps,
        }
        for method in calls
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="tiny_geo3k", help="a demo recipe (a tiny:// model)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    per_call = measure(args.recipe, args.steps, args.workers, args.overrides)
    print(
        f"{'worker call':<24} {'calls':>6} {'sent KiB':>10} {'returned KiB':>13}   (per step, {args.workers} workers)"
    )
    for method, m in per_call.items():
        print(
            f"{method:<24} {m['calls_per_step']:>6.1f} {m['sent_bytes_per_step'] / 1024:>10.1f} "
            f"{m['returned_bytes_per_step'] / 1024:>13.1f}"
        )
    total_sent = sum(m["sent_bytes_per_step"] for m in per_call.values())
    total_back = sum(m["returned_bytes_per_step"] for m in per_call.values())
    print(f"{'total':<24} {'':>6} {total_sent / 1024:>10.1f} {total_back / 1024:>13.1f}")
    if args.json:
        args.json.write_text(
            json.dumps({"recipe": args.recipe, "overrides": args.overrides, "per_call": per_call}, indent=1)
        )


if __name__ == "__main__":
    main()
