"""Shared prompts in the padding-free forward: each distinct prompt runs once, and every row still
gets the log-probs, entropy and gradients it gets alone (the padded path's numbers)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from run_helpers import assert_packed_matches_padded
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from verl_npu.models import varlen
from verl_npu.models.forward import response_log_probs
from verl_npu.models.loading import enable_activation_checkpointing
from verl_npu.models.shared_prompt import prompt_groups, shared_prompt_layout

RESPONSE = 5


def _rows(prompt_enc, prompt_of_row: list[int], response_lengths: list[int], pad_id: int, seed: int = 0):
    """[N, L] ids / mask: row r = prompt prompt_of_row[r] (left-padded) + a random response of
    response_lengths[r] tokens (right-padded to RESPONSE)."""
    g = torch.Generator().manual_seed(seed)
    ids = prompt_enc["input_ids"][prompt_of_row]
    mask = prompt_enc["attention_mask"][prompt_of_row]
    response_mask = (torch.arange(RESPONSE)[None, :] < torch.tensor(response_lengths)[:, None]).long()
    responses = torch.randint(3, 200, (len(prompt_of_row), RESPONSE), generator=g).masked_fill(
        response_mask == 0, pad_id
    )
    return torch.cat([ids, responses], 1), torch.cat([mask, response_mask], 1), response_mask.bool()


def _dense_row_attention(q, k, v, rows_tokens, scale):
    """Reference: each row attends causally over its own tokens (prompt + response), [T, H, D] layout;
    the output of a packed token is its row's output there (any row holding it: they agree)."""
    out = torch.zeros_like(q)
    for tokens in rows_tokens:
        idx = torch.tensor(tokens)
        qi, ki, vi = q[idx].transpose(0, 1), k[idx].transpose(0, 1), v[idx].transpose(0, 1)
        ki = ki.repeat_interleave(q.shape[1] // k.shape[1], 0)
        vi = vi.repeat_interleave(q.shape[1] // v.shape[1], 0)
        out[idx] = torch.nn.functional.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale).transpose(
            0, 1
        )
    return out


def test_prompt_groups_need_the_same_ids_padding_and_images():
    ids = torch.tensor([[0, 5, 6, 9], [0, 5, 6, 8], [5, 5, 6, 7], [0, 5, 6, 1], [0, 5, 6, 2]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1], [0, 1, 1, 1]])
    pix = [torch.ones(2), torch.ones(2), torch.ones(2), torch.zeros(2), torch.ones(2)]
    mm = [{"pixel_values": p} for p in pix]
    assert prompt_groups(ids, mask, 1) == [[0, 1, 3, 4], [2]]
    assert prompt_groups(ids, mask, 1, mm) == [[0, 1, 4], [2], [3]]  # row 3: same text, other image
    assert shared_prompt_layout(ids[[0, 2]], mask[[0, 2]], 1) is None  # nothing shared: the plain layout


def test_shared_attention_equals_each_row_attending_alone():
    """The kernel with per-sequence keys (prompt + own response, causal from the end) gives every
    token what its own row's causal attention gives."""
    ids = torch.tensor([[0, 4, 5, 6, 7, 8, 0], [0, 4, 5, 6, 9, 0, 0], [1, 2, 3, 4, 5, 6, 7], [0, 4, 5, 6, 3, 2, 1]])
    mask = (ids != 0).long()
    layout = shared_prompt_layout(ids, mask, 3)
    assert layout is not None and layout.representatives == [0, 2]
    rows_tokens = [layout.packed_of.view(4, 7)[r][mask[r].bool()].tolist() for r in range(4)]
    t = len(layout.token_index)
    assert t == 3 + 2 + 1 + 4 + 3 + 3  # prompt A once, responses 2, 1, 3; prompt B and its response
    torch.manual_seed(0)
    q, k, v = torch.randn(t, 4, 8), torch.randn(t, 2, 8), torch.randn(t, 2, 8)
    cu = varlen._cumulative(layout.query_lengths)
    cu_k = varlen._cumulative(layout.key_lengths)
    index = layout.key_index
    out = varlen.VARLEN_KERNELS["sdpa_sequences"](
        q, k.index_select(0, index), v.index_select(0, index), cu, 0.3, cu_k=cu_k
    )
    torch.testing.assert_close(out, _dense_row_attention(q, k, v, rows_tokens, 0.3), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "activation-checkpointing"])
def test_shared_prompt_log_probs_and_gradients_equal_the_padded_path(tiny_lm_path, monkeypatch, checkpointing):
    tok = AutoTokenizer.from_pretrained(tiny_lm_path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    if checkpointing:
        enable_activation_checkpointing(model)
        model.train()
    enc = tok(["a much longer prompt than the others here", "hi", "a medium prompt"], return_tensors="pt", padding=True)
    # prompt 0 three times (one response empty), prompt 1 once, prompt 2 twice
    prompt_of_row = [0, 0, 1, 2, 0, 2]
    ids, mask, resp = _rows(enc, prompt_of_row, [5, 2, 4, 3, 0, 5], tok.pad_token_id)
    seen = []
    real = varlen.varlen_attention_forward
    monkeypatch.setattr(
        varlen,
        "varlen_attention_forward",
        lambda m, q, k, v, a, **kw: seen.append(q.shape[2]) or real(m, q, k, v, a, **kw),
    )
    assert_packed_matches_padded(model, ids, mask, resp, RESPONSE)
    # each distinct prompt ran once: the packed row holds 3 prompts + all response tokens
    prompt_tokens = enc["attention_mask"].sum()
    assert set(seen) == {int(prompt_tokens) + int(resp.sum())}
    assert int(prompt_tokens) + int(resp.sum()) < int(mask.sum())


def _vl_batch(path):
    proc = AutoProcessor.from_pretrained(path)
    proc.tokenizer.padding_side = "left"
    red, blue = Image.new("RGB", (56, 56), (255, 0, 0)), Image.new("RGB", (56, 56), (0, 0, 255))
    text = proc.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "sides?"}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    enc = proc(text=[text, text], images=[red, blue], return_tensors="pt", padding=True)
    one = [proc(text=[text], images=[im], return_tensors="pt") for im in (red, blue)]
    mm = [{"pixel_values": o["pixel_values"], "image_grid_thw": o["image_grid_thw"]} for o in one]
    return proc.tokenizer, enc, mm


def test_vl_rows_share_a_prompt_only_with_the_same_picture(tiny_vl_path):
    """Two prompts with the same text and different pictures, three rows each: the images are
    encoded once per distinct prompt, the log-probs and gradients are the padded path's (where
    image / video marker tokens have probability 0, in every path, the fused one included)."""
    tok, enc, mm = _vl_batch(tiny_vl_path)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_path, dtype=torch.float32)
    prompt_of_row = [0, 1, 0, 1, 0, 1]
    ids, mask, resp = _rows(enc, prompt_of_row, [5, 1, 3, 5, 2, 4], tok.pad_token_id, seed=1)
    rows_mm = [mm[p] for p in prompt_of_row]
    assert prompt_groups(ids, mask, RESPONSE, rows_mm) == [[0, 2, 4], [1, 3, 5]]
    encoded = []
    hook = model.model.visual.register_forward_hook(lambda m, args, out: encoded.append(args[0].shape[0]))
    results = {}
    for name, kwargs in {
        "padded": {},
        "shared": {"remove_padding": True},
        "shared-fused": {"remove_padding": True, "fused": True},
    }.items():
        model.zero_grad()
        lp, ent = response_log_probs(
            model, ids, mask, RESPONSE, multi_modal_inputs=rows_mm, with_entropy=True, **kwargs
        )
        (lp[resp].sum() + ent[resp].mean()).backward()
        results[name] = (
            lp[resp].detach(),
            ent[resp].detach(),
            {n: p.grad.clone() for n, p in model.named_parameters()},
        )
    hook.remove()
    patches = mm[0]["pixel_values"].shape[0]
    assert encoded == [6 * patches, 2 * patches, 2 * patches]  # padded: every row's image; shared: each once
    for name in ("shared", "shared-fused"):
        torch.testing.assert_close(results[name][0], results["padded"][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(results[name][1], results["padded"][1], atol=1e-5, rtol=1e-5)
        for param, grad in results["padded"][2].items():
            torch.testing.assert_close(results[name][2][param], grad, atol=1e-5, rtol=1e-4, msg=f"{name}: {param}")


def test_vl_rope_positions_once_per_prompt_equal_the_models_own(tiny_vl_path):
    """3-D rope positions computed on one row per distinct prompt (`rope_positions` with groups) are the
    model's own `get_rope_index` of every row, exactly: responses of different lengths, a response with a
    gap in its attention mask, and prompts that end with text or with the picture itself."""
    from verl_npu.models.forward import VisionTokens, merge_multi_modal_inputs, mm_token_type_ids, rope_positions

    tok, enc, mm = _vl_batch(tiny_vl_path)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_path, dtype=torch.float32)
    vt = VisionTokens.of(model)
    ends_with_picture = enc["attention_mask"].clone(), enc["input_ids"].clone()
    last_image = int((enc["input_ids"][0] == vt.image_token_id).nonzero().max())
    for prompt_mask, prompt_ids in (
        (enc["attention_mask"], enc["input_ids"]),
        (
            torch.cat(
                [
                    torch.zeros_like(ends_with_picture[0][:, last_image + 1 :]),
                    ends_with_picture[0][:, : last_image + 1],
                ],
                1,
            ),
            torch.cat(
                [
                    torch.full_like(ends_with_picture[1][:, last_image + 1 :], tok.pad_token_id),
                    ends_with_picture[1][:, : last_image + 1],
                ],
                1,
            ),
        ),
    ):
        prompts = {"input_ids": prompt_ids, "attention_mask": prompt_mask}
        prompt_of_row = [0, 1, 0, 1, 0, 1]
        ids, mask, _ = _rows(prompts, prompt_of_row, [5, 1, 3, 5, 0, 4], tok.pad_token_id, seed=2)
        mask[3, -3] = 0  # a gap (as tool output left out of the attention would leave)
        rows_mm = [mm[p] for p in prompt_of_row]
        merged = merge_multi_modal_inputs(rows_mm, "cpu")
        groups = prompt_groups(ids, mask, RESPONSE, rows_mm)
        assert groups == [[0, 2, 4], [1, 3, 5]]
        real = model.model.get_rope_index
        rows_seen = []
        model.model.get_rope_index = lambda input_ids, **kw: rows_seen.append(len(input_ids)) or real(input_ids, **kw)
        shared = rope_positions(model, ids, mask, merged, vt, response_length=RESPONSE, rows_mm=rows_mm, groups=groups)
        del model.model.get_rope_index
        assert rows_seen == [2]  # one row per distinct prompt
        own, _ = model.model.get_rope_index(
            ids,
            mm_token_type_ids=mm_token_type_ids(ids, vt),
            image_grid_thw=merged["image_grid_thw"],
            attention_mask=mask,
        )
        assert torch.equal(shared, own)
        assert torch.equal(rope_positions(model, ids, mask, merged, vt), own)
