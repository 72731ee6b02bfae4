"""What LoRA's shared reference saves: the bytes of the reference copy that a LoRA run does not build.

Without LoRA, a run with a KL term holds a second model (the reference policy) in the compute dtype
(bf16 on accelerators, fp32 on CPU). With `actor_rollout_ref.model.lora_rank` > 0 the reference is
the actor with its adapters off, so that copy is gone. This script:
1. counts, for a few model shapes (built on the meta device: no memory, no download), the parameter
   bytes of that reference copy in bf16, and the LoRA adapter's own parameters at rank 64 (all-linear);
2. builds the real worker for the tiny text model twice (lora_rank 0 and 4, use_kl_loss=true) and
   reports the parameter bytes each holds (actor + reference) and the process's peak RSS after
   `init_model`, each in its own process.

Run by hand: `python bench/lora_memory.py` (writes nothing; paste the tables into bench/results/lora_memory.md).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: published shapes of the Qwen2.5 text models (config.json facts)
SHAPES = {
    "Qwen2.5-0.5B": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "Qwen2.5-3B": dict(
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "Qwen2.5-7B": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
}


def shape_table(rank: int = 64) -> list[str]:
    """Markdown rows: model, parameters, reference copy in bf16 (GiB), LoRA parameters at `rank`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config

    rows = [
        "| model | parameters | reference copy saved (bf16) | LoRA parameters (r=64, all-linear) |",
        "|---|---|---|---|",
    ]
    for name, shape in SHAPES.items():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(Qwen2Config(**shape))
            params = sum(p.numel() for p in model.parameters())
            peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=32, target_modules="all-linear"))
            adapter = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        rows.append(f"| {name} | {params / 1e9:.2f} B | {params * 2 / 2**30:.2f} GiB | {adapter / 1e6:.1f} M |")
    return rows


def _measure_worker(rank: int) -> dict:
    """In this process: build the tiny worker with `lora_rank`=rank, return its parameter bytes and peak RSS."""
    import tempfile

    sys.path[:0] = [str(REPO / "tests" / "helpers"), str(REPO / "tests" / "e2e")]
    from test_e2e_cpu import _gsm8k_like, tiny_overrides

    from verl_npu.config import load_recipe
    from verl_npu.device import detect_device
    from verl_npu.workers.actor import ActorRolloutRefWorker

    tmp = Path(tempfile.mkdtemp())
    data = _gsm8k_like(tmp / "gsm")
    rc = load_recipe(
        "tiny_gsm8k",
        tiny_overrides(
            tmp, data, **{"actor_rollout_ref.model.path": "tiny://qwen2", "actor_rollout_ref.model.lora_rank": rank}
        ),
    )
    worker = ActorRolloutRefWorker(rc.typed, device=detect_device("cpu"), total_training_steps=1)
    worker.init_model()
    modules = [worker.module] + ([worker.ref_module] if worker.ref_module is not None else [])
    held = sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
    return {
        "lora_rank": rank,
        "reference_module": worker.ref_module is not None,
        "parameter_bytes": held,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(_measure_worker(args.worker)))
        return
    print("\n".join(shape_table()))
    print("\n| tiny worker | reference module | parameter bytes held | peak RSS after init_model |\n|---|---|---|---|")
    for rank in (0, 4):
        out = subprocess.run(
            [sys.executable, __file__, "--worker", str(rank)], capture_output=True, text=True, check=True, cwd=REPO
        )
        got = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"| lora_rank={rank} | {'separate copy' if got['reference_module'] else 'actor, adapters off'} | "
            f"{got['parameter_bytes']:,} | {got['peak_rss_mib']:.0f} MiB |"
        )


if __name__ == "__main__":
    main()
