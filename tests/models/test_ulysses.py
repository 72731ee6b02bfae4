"""Ulysses sequence parallelism: real gloo groups of 2 processes give the single-process numbers."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_workers import gloo_group, spawn_gloo

from verl_npu.models import ulysses


def _sum_over_ranks(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().clone()
    dist.all_reduce(t)
    return t


# ----------------------------------------------------------------------------- collectives


def _collectives_worker(rank: int, world: int, port: int) -> None:
    with gloo_group(rank, world, port):
        try:
            group = dist.group.WORLD
            for force_fallback in (False, True):
                ulysses._A2A_UNSUPPORTED = force_fallback  # True: the all_gather-based all-to-all
                gen = torch.Generator().manual_seed(0)
                full = torch.randn(2, 4, 7, 3, generator=gen)  # [B, H, T, D], T=7 is not a multiple of 2
                w_out = torch.randn(2, 7, 4, 3, generator=gen)
                w_heads = torch.randn(2, 4, 8, 3, generator=gen)

                # single process: the same two loss terms on the whole tensor
                ref_x = full.clone().requires_grad_(True)
                ref_pad = F.pad(ref_x, (0, 0, 0, 1))
                ref_loss = (ref_x.transpose(1, 2) * w_out).sum() + (ref_pad.pow(2) * w_heads).sum()
                ref_loss.backward()

                x = full.clone().requires_grad_(True)
                local, pad = ulysses.pad_and_shard(x, 2, group)
                assert pad == 1 and local.shape == (2, 4, 4, 3)
                assert torch.equal(local, F.pad(full, (0, 0, 0, 1))[:, :, rank * 4 : rank * 4 + 4])

                heads = ulysses.seq_to_heads(local, group)  # [B, H/P, T, D]
                assert heads.shape == (2, 2, 8, 3)
                assert torch.equal(heads, F.pad(full, (0, 0, 0, 1))[:, rank * 2 : rank * 2 + 2])

                back = ulysses.heads_to_seq(heads.transpose(1, 2), group)  # [B, T/P, H, D]
                assert torch.equal(back, local.transpose(1, 2))
                gathered = ulysses.gather_sequence(back, 1, group, pad)
                assert torch.equal(gathered, full.transpose(1, 2))

                loss = (gathered * w_out).sum() + (heads.pow(2) * w_heads[:, rank * 2 : rank * 2 + 2]).sum()
                loss.backward()
                torch.testing.assert_close(_sum_over_ranks(x.grad), ref_x.grad, rtol=0, atol=1e-6)
                # this rank's gradient only covers its own tokens of the gathered term
                assert not torch.equal(x.grad, ref_x.grad)

                # grad_scale multiplies the slice of the gradient
                y = torch.ones(2, 3, requires_grad=True)
                ulysses.gather_sequence(y, 0, group, 0, grad_scale=2.0).sum().backward()
                assert torch.equal(y.grad, torch.full((2, 3), 2.0))
        finally:
            ulysses._A2A_UNSUPPORTED = False


def test_all_to_alls_and_gather_round_trip_with_exact_gradients():
    spawn_gloo(_collectives_worker)


# ----------------------------------------------------------------------------- model equivalence


def _packed_batch(vocab: int, lengths: list[int], seed: int):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (1, sum(lengths)), generator=gen)
    pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    return ids, pos


def _log_probs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    targets = torch.roll(ids, -1, dims=1)
    return torch.gather(F.log_softmax(logits.float(), -1), -1, targets.unsqueeze(-1)).squeeze(-1)


def _compare_model(model, ids, pos, rank, inner: str) -> None:
    group = dist.group.WORLD
    world = dist.get_world_size()
    loss_weights = torch.linspace(-1.0, 1.0, ids.shape[1]).unsqueeze(0)

    model.set_attn_implementation("sdpa")
    ref_logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    ref_lp = _log_probs(ref_logits, ids)
    (ref_lp * loss_weights).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    model.set_attn_implementation(ulysses.register_ulysses_attention())
    local_ids, pad = ulysses.pad_and_shard(ids, 1, group)
    local_pos, _ = ulysses.pad_and_shard(pos, 1, group)
    assert local_ids.shape[1] == (ids.shape[1] + pad) // world
    global_pos = F.pad(pos, (0, pad))
    with ulysses.sequence_parallel(group, global_pos, inner=inner):
        local_logits = model(input_ids=local_ids, position_ids=local_pos, use_cache=False).logits
    assert ulysses.get_sp_group() is None  # state restored after the block
    logits = ulysses.gather_sequence(local_logits, 1, group, pad)
    assert logits.shape == ref_logits.shape
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-5)
    lp = _log_probs(logits, ids)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)
    (lp * loss_weights).sum().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(
            _sum_over_ranks(param.grad),
            ref_grads[name],
            rtol=1e-4,
            atol=1e-5,
            msg=lambda m, name=name: f"{inner} {name}: {m}",
        )
    model.zero_grad(set_to_none=True)

    # the mask matters: attending across the packed sequences changes the numbers
    with ulysses.sequence_parallel(group, torch.arange(ids.shape[1] + pad).unsqueeze(0), inner=inner):
        wrong = model(input_ids=local_ids, position_ids=local_pos, use_cache=False).logits
    wrong = ulysses.gather_sequence(wrong.detach(), 1, group, pad)
    assert (wrong - ref_logits).abs().max() > 1e-3

    # a KV cache would hold only this rank's tokens: refused with a clear message
    with ulysses.sequence_parallel(group, global_pos, inner=inner), pytest.raises(ValueError, match="use_cache=False"):
        model(input_ids=local_ids, position_ids=local_pos, use_cache=True)


def _model_worker(rank: int, world: int, port: int, model_path: str) -> None:
    with gloo_group(rank, world, port, wait_for_peers=True):
        from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

        # tiny Qwen2 (4 heads, 2 kv heads): kv heads split evenly over the 2 ranks; SDPA inside
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        assert ulysses.check_heads(model.config, world) is None
        ids, pos = _packed_batch(model.config.vocab_size, [6, 9, 4], seed=1)  # T=19: one padding token
        _compare_model(model, ids, pos, rank, inner="sdpa")

        # 1 kv head < 2 ranks: kv heads are repeated before the all-to-all; eager attention inside
        torch.manual_seed(0)
        config = Qwen2Config(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            tie_word_embeddings=True,
        )
        small = Qwen2ForCausalLM(config).float()
        ids, pos = _packed_batch(64, [5, 7, 8], seed=2)  # T=20: no padding
        _compare_model(small, ids, pos, rank, inner="eager")


def test_tiny_qwen2_with_sp2_matches_one_process(tiny_lm_path):
    spawn_gloo(_model_worker, str(tiny_lm_path))


# ----------------------------------------------------------------------------- single process


def test_packed_causal_mask_is_block_diagonal_and_causal():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 0]])  # sequences of 3 and 2 tokens, then two padding tokens
    mask = ulysses.packed_causal_mask(pos)[0, 0]
    expected = torch.zeros(7, 7, dtype=torch.bool)
    expected[:3, :3] = torch.ones(3, 3).tril().bool()
    expected[3:5, 3:5] = torch.ones(2, 2).tril().bool()
    expected[5, 5] = expected[6, 6] = True
    assert torch.equal(mask, expected)
    # 3-D rope positions: row 0 holds the text positions
    assert torch.equal(ulysses.packed_causal_mask(torch.stack([pos, pos * 0, pos * 0]))[0, 0], expected)


def test_check_heads():
    from transformers import Qwen2Config

    cfg = Qwen2Config(num_attention_heads=8, num_key_value_heads=2, hidden_size=64)
    assert ulysses.check_heads(cfg, 1) is None
    assert ulysses.check_heads(cfg, 2) is None
    assert ulysses.check_heads(cfg, 4) is None  # 4 % 2 == 0: kv heads are repeated
    assert ulysses.check_heads(cfg, 8) is None
    assert "num_attention_heads=8" in ulysses.check_heads(cfg, 3)
    cfg = Qwen2Config(num_attention_heads=12, num_key_value_heads=4, hidden_size=96)
    msg = ulysses.check_heads(cfg, 6)  # 12 % 6 == 0 but neither of 4 and 6 divides the other
    assert msg is not None and "num_key_value_heads=4" in msg


def test_without_sp_group_the_attention_equals_plain_sdpa():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    ids, pos = _packed_batch(64, [4, 6], seed=3)
    model.set_attn_implementation("sdpa")
    ref = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    model.set_attn_implementation(ulysses.register_ulysses_attention())
    assert ulysses.get_sp_group() is None
    # no context: the mask comes from the position ids the model passes to attention
    out = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    # and the packing is respected: the second sequence alone gives the same logits
    alone = model(input_ids=ids[:, 4:], position_ids=pos[:, 4:], use_cache=False).logits
    torch.testing.assert_close(out[:, 4:], alone, rtol=0, atol=1e-5)
    local, pad = ulysses.pad_and_shard(ids, 1)
    assert pad == 0 and torch.equal(local, ids)
