"""Benchmark: padding-free (packed, variable-length attention) vs padded log-prob forward+backward on CPU.

One training micro-batch as `response_log_probs` runs it in the update: 32 rows of left-padded
prompts (lengths 20..60) plus right-padded responses of up to 32 tokens, forward and backward,
fp32, for three layouts:

- padded: [32, L] with an attention mask (use_remove_padding=false);
- packed: one [1, T] row through `verl_npu.models.varlen` (use_remove_padding=true);
- packed-dense-mask: one [1, T] row through transformers' SDPA, which builds a [T, T]
  block-diagonal mask from the restarting position ids (what use_remove_padding did before).

Responses are either all 32 tokens long ("equal") or 1..32 tokens ("mixed", where packing skips
the padding). Models: random-init Qwen2 configs built in memory (the tiny test model and a small
one); the median of `--repeats` timed runs after one warm-up.

Usage:  python bench/packing_cpu.py [--repeats 3] [--threads 1]
Results are recorded by hand in bench/results/vs_trl.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

SIZES = {
    "tiny (h128, 2 layers)": dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
    "small (h512, 4 layers)": dict(
        hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2
    ),
}
ROWS, RESPONSE = 32, 32


def batch(mixed: bool, vocab: int, generator: torch.Generator):
    prompt_lens = torch.randint(20, 61, (ROWS,), generator=generator)
    if mixed:
        response_lens = torch.randint(1, RESPONSE + 1, (ROWS,), generator=generator)
    else:
        response_lens = torch.full((ROWS,), RESPONSE)
    width = int(prompt_lens.max())
    ids = torch.randint(3, vocab, (ROWS, width + RESPONSE), generator=generator)
    cols = torch.arange(width + RESPONSE)
    prompt_mask = cols[None, :width] >= width - prompt_lens[:, None]
    response_mask = cols[None, :RESPONSE] < response_lens[:, None]
    mask = torch.cat([prompt_mask, response_mask], 1).long()
    return ids * mask, mask


def timed_step(model, ids, mask, layout: str) -> float:
    import contextlib

    import verl_npu.models.forward as forward

    start = time.perf_counter()
    real = forward.packed_attention
    if layout == "packed-dense-mask":  # the model's own SDPA on the packed row: a [T, T] mask
        forward.packed_attention = lambda *args, **kwargs: contextlib.nullcontext()
    try:
        lp, _ = forward.response_log_probs(model, ids, mask, RESPONSE, remove_padding=layout != "padded")
    finally:
        forward.packed_attention = real
    (lp * mask[:, -RESPONSE:]).sum().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cell (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.set_num_threads(args.threads)
    print(
        f"{ROWS} rows, prompts 20-60 tokens, responses {RESPONSE} (equal) or 1-{RESPONSE} (mixed), fp32, "
        f"forward+backward, median of {args.repeats}, {args.threads} threads"
    )
    print("| model | responses | padded s | packed (varlen) s | packed, dense mask (before) s | padded / packed |")
    print("|---|---|---|---|---|---|")
    for name, size in SIZES.items():
        torch.manual_seed(0)
        cfg = Qwen2Config(vocab_size=512, max_position_embeddings=4096, **size)
        cfg._attn_implementation = "sdpa"
        model = Qwen2ForCausalLM(cfg).float()
        for mixed in (False, True):
            ids, mask = batch(mixed, cfg.vocab_size, torch.Generator().manual_seed(1))
            times = {}
            for layout in ("padded", "packed", "packed-dense-mask"):
                timed_step(model, ids, mask, layout)  # warm-up
                times[layout] = statistics.median(timed_step(model, ids, mask, layout) for _ in range(args.repeats))
            print(
                f"| {name} | {'mixed' if mixed else 'equal'} | {times['padded']:.4f} | {times['packed']:.4f} | "
                f"{times['packed-dense-mask']:.4f} | {times['padded'] / times['packed']:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
