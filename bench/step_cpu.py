"""verl-npu's side of bench/vs_trl.py, timed in CPU seconds of this process as well as wall seconds.

On a shared machine the wall clock of a step swings with the other processes (bench/results/vs_trl.md: 0.15 s
to 0.66 s for the same step); the CPU time this process spends in a step moves much less, so two
checkouts can be compared on a busy machine by running this in each, alternately:

    PYTHONPATH=. python bench/step_cpu.py --task vl

Same inputs and settings as `bench/vs_trl.py --sides verl` (its `prepare_inputs` and `verl_side`), one
torch thread. Prints one JSON line: the median over steps 3..N of the step's CPU seconds (`step_cpu_s`),
of the rollout's (`gen_cpu_s`) and of the step's wall seconds (`step_s`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=["vl", "text"], default="vl", help="picture task or text task")
    parser.add_argument("--steps", type=int, default=12, help="training steps (the medians are over steps 3..N)")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error("--steps must be at least 3")
    import torch
    import vs_trl

    from verl_npu.rollout.hf import HFRollout
    from verl_npu.trainer.ppo import PPOTrainer

    torch.set_num_threads(1)
    cpu: dict[str, list[float]] = {"step": [], "gen": []}

    def cpu_timed(cls, name, key):
        inner = getattr(cls, name)

        def timed(*a, **k):
            start = time.process_time()
            try:
                return inner(*a, **k)
            finally:
                cpu[key].append(time.process_time() - start)

        setattr(cls, name, timed)

    cpu_timed(PPOTrainer, "train_step", "step")
    cpu_timed(HFRollout, "generate", "gen")
    with tempfile.TemporaryDirectory(prefix="step_cpu_") as tmp:
        work = Path(tmp)
        os.environ["VERL_NPU_CACHE"] = str(work / "models")
        model, data = vs_trl.prepare_inputs(args.task, args.steps, work)
        result = vs_trl.verl_side(args.task, args.steps, model, data, work / "verl", True)
    print(
        json.dumps(
            {
                "task": args.task,
                "step_cpu_s": round(statistics.median(cpu["step"][2:]), 4),
                "gen_cpu_s": round(statistics.median(cpu["gen"][2:]), 4),
                "step_s": round(statistics.median(result["step_s"][2:]), 4),
                "loadavg": [round(x, 2) for x in os.getloadavg()],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
