"""Benchmark: peak memory and time of a log-prob pass, unfused vs `model.use_fused_kernels`.

A tiny random-init Qwen2 with a 151,936-token vocabulary (Qwen2.5's) and a small body, so the
[tokens x vocab] logits dominate memory as they do for real models. Each measurement runs in a
fresh process: the extra peak resident memory of one `response_log_probs` call (with entropy)
over the memory held before it, for the no-grad log-prob pass (old / reference log-probs) and
for a training pass (forward + backward).

Usage:  python bench/fused_logprobs.py [--tokens 2048] [--vocab 151936] [--out bench/results/fused_logprobs.md]
Run by hand; results are recorded in bench/results/fused_logprobs.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def measure(fused: bool, train: bool, tokens: int, vocab: int, rows: int) -> dict:
    """One pass in this process; returns the extra peak RSS (MB) and the seconds it took."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, str(REPO))
    from verl_npu.models.forward import response_log_probs

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config).float()
    length = tokens // rows
    ids = torch.randint(0, vocab, (rows, length))
    mask = torch.ones_like(ids)
    response = length // 2
    before = _rss_mb()
    start = time.perf_counter()
    with torch.set_grad_enabled(train):
        lp, ent = response_log_probs(model, ids, mask, response, with_entropy=True, remove_padding=True, fused=fused)
        if train:
            (lp.sum() - 0.01 * ent.sum()).backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB -> MB on Linux
    return {"fused": fused, "train": train, "extra_peak_mb": peak - before, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048, help="tokens in the batch (split over --rows rows)")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: fused,train as 0/1
    args = parser.parse_args()
    if args.one:
        fused, train = (bool(int(x)) for x in args.one.split(","))
        print(json.dumps(measure(fused, train, args.tokens, args.vocab, args.rows)))
        return
    results = []
    for train in (False, True):
        for fused in (False, True):
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    f"{int(fused)},{int(train)}",
                    "--tokens",
                    str(args.tokens),
                    "--rows",
                    str(args.rows),
                    "--vocab",
                    str(args.vocab),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(results[-1], flush=True)
    logits_mb = args.tokens * args.vocab * 4 / 2**20
    lines = [
        "# Fused log-probs: peak memory of a log-prob pass (`actor_rollout_ref.model.use_fused_kernels`)",
        "",
        f"Recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with "
        f"`python bench/fused_logprobs.py --tokens {args.tokens} --vocab {args.vocab}` on "
        f"{platform.machine()} CPU, torch fp32. Tiny random-init Qwen2 (hidden 64, 2 layers, vocabulary "
        f"{args.vocab:,}), {args.tokens} tokens in {args.rows} rows, entropy included, padding-free path. "
        f"One float32 [tokens x vocab] tensor is {logits_mb:.0f} MB. Extra peak resident memory of the "
        "call over what the process held before it (each in a fresh process).",
        "",
        "| pass | unfused: extra peak (MB) | fused: extra peak (MB) | unfused (s) | fused (s) |",
        "|---|---|---|---|---|",
    ]
    for train in (False, True):
        un = next(r for r in results if r["train"] == train and not r["fused"])
        fu = next(r for r in results if r["train"] == train and r["fused"])
        name = "log-prob (no grad)" if not train else "training (forward + backward)"
        lines.append(
            f"| {name} | {un['extra_peak_mb']:.0f} | {fu['extra_peak_mb']:.0f} | "
            f"{un['seconds']:.2f} | {fu['seconds']:.2f} |"
        )
    load = os.getloadavg()[0]
    lines += [
        "",
        f"Memory is the point of this table. Times are indicative only: load average {load:.1f} on "
        f"{os.cpu_count()} cores while recording; the fused backward recomputes each chunk's logits, so a "
        "training pass does about one more [tokens x vocab] projection.",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)


if __name__ == "__main__":
    main()
