import pytest
import torch

from verl_npu.batch import Batch, trim_left_padding
from verl_npu.workers.balance import balance_for_ranks
from verl_npu.workers.micro import micro_batch_indices


def _batch():
    return Batch({"x": torch.arange(6).view(6, 1)}, {"name": list("abcdef")})


def test_select_split_concat_keep_rows_aligned():
    b = _batch()
    sel = b.select([4, 1])
    assert sel["x"].view(-1).tolist() == [4, 1] and sel["name"] == ["e", "b"]
    parts = b.chunk(3)
    assert [p["name"] for p in parts] == [["a", "b"], ["c", "d"], ["e", "f"]]
    again = Batch.concat(parts)
    assert torch.equal(again["x"], b["x"]) and again["name"] == b["name"]
    rep = b.slice(0, 2).repeat_interleave(3)
    assert rep["name"] == ["a", "a", "a", "b", "b", "b"]
    assert rep["x"].view(-1).tolist() == [0, 0, 0, 1, 1, 1]


def test_batch_rejects_misaligned_fields():
    with pytest.raises(ValueError, match="disagree"):
        Batch({"x": torch.zeros(3, 1)}, {"y": [1, 2]})
    b = _batch()
    with pytest.raises(ValueError, match="rows"):
        b.set("new", [1, 2])
    with pytest.raises(ValueError, match="equal parts"):
        b.chunk(4)


def test_micro_batches_by_rows_and_by_token_budget():
    mask = torch.tensor([[1] * 5 + [0] * 3, [1] * 8, [1] * 2 + [0] * 6, [1] * 3 + [0] * 5])
    assert micro_batch_indices(mask, micro_batch_size=3) == [[0, 1, 2], [3]]
    # lengths 5, 8, 2, 3 with a budget of 10 tokens
    assert micro_batch_indices(mask, max_token_len=10) == [[0], [1, 2], [3]]
    groups = micro_batch_indices(mask, max_token_len=13)
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3]
    assert all(mask[g].sum() <= 13 for g in groups)


def test_trim_left_padding_keeps_response_columns():
    b = Batch(
        {
            "input_ids": torch.tensor([[0, 0, 5, 6, 7], [0, 4, 5, 6, 0]]),
            "attention_mask": torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 0]]),
        }
    )
    t = trim_left_padding(b)
    assert t["input_ids"].tolist() == [[0, 5, 6, 7], [4, 5, 6, 0]]
    assert b["input_ids"].shape == (2, 5)  # original untouched


def test_balance_gives_each_rank_equal_rows_and_similar_tokens():
    lengths = [100, 90, 80, 60, 40, 20, 10, 5]
    mask = torch.zeros(8, 100, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    order = balance_for_ranks(mask, 2)
    assert sorted(order) == list(range(8))
    halves = [order[:4], order[4:]]
    totals = [sum(lengths[i] for i in h) for h in halves]
    assert abs(totals[0] - totals[1]) <= 20
    naive = [sum(lengths[:4]), sum(lengths[4:])]
    assert abs(totals[0] - totals[1]) < abs(naive[0] - naive[1])
    assert balance_for_ranks(mask, 1) == list(range(8))
