"""Shared prompts in the padding-free forward: each distinct prompt of a micro-batch runs once.

GRPO (and every estimator with `rollout.n > 1`) trains on n responses per prompt, so a batch
holds every prompt n times. The padding-free path (`use_remove_padding=true`) packs real tokens
into one row; `shared_prompt_layout` packs each distinct prompt once, followed by the responses
of all rows that carry it:

    [prompt A][response A1][response A2]...[prompt B][response B1]...

Attention (`verl_npu.models.varlen`, `packed_attention(key_index=...)`) keeps every row's view of
its own sequence: a prompt attends causally to itself; a response attends to its prompt's tokens
and causally to its own, never to a sibling response. Positions (1-D, or Qwen-VL's 3-D rope) are
each token's position in its own row, and a prompt's images are encoded once. So every log-prob is
the one the row computes alone (up to floating-point summation order), and in the backward the
gradient of a shared prompt token is the sum over its rows, exactly as when each row carries its
own copy. What is saved is the repeated prompt compute: (n - 1) x prompt tokens per prompt in every
linear layer, the vision tower included (`docs/performance.md`).

Rows share a prompt when their prompt columns (token ids and padding) are identical and so are
their multimodal inputs (`pixel_values`, `image_grid_thw`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SharedPromptLayout:
    """Where each packed token comes from and what each attention sequence sees.

    `token_index` [T]: flat index (row x L + column) into the [N, L] batch of each packed token.
    `query_lengths` [S]: tokens of each attention sequence (a prompt, or one row's response).
    `key_index` / `key_lengths`: packed positions of each sequence's keys, sequence after sequence.
    `packed_of` [N x L]: the packed position holding (row, column), also for the rows whose prompt
    is another row's (-1 where the batch has padding).
    `representatives`: one row per distinct prompt, in packed order (whose images are encoded)."""

    token_index: torch.Tensor
    query_lengths: torch.Tensor
    key_index: torch.Tensor
    key_lengths: torch.Tensor
    packed_of: torch.Tensor
    representatives: list[int]


def _same_inputs(a: dict | None, b: dict | None) -> bool:
    a, b = a or {}, b or {}
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def prompt_groups(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    multi_modal_inputs: list[dict] | None = None,
) -> list[list[int]]:
    """Rows grouped by identical prompt (ids, padding and multimodal inputs), in order of first row."""
    prompt_cols = input_ids.shape[1] - response_length
    prompts = torch.where(attention_mask[:, :prompt_cols].bool(), input_ids[:, :prompt_cols], -1)
    _, keys = torch.unique(prompts, dim=0, return_inverse=True)  # one id per distinct prompt row
    by_key: dict[int, list[list[int]]] = {}
    groups: list[list[int]] = []
    for row, key in enumerate(keys.tolist()):
        candidates = by_key.setdefault(key, [])
        for group in candidates:
            if multi_modal_inputs is None or _same_inputs(multi_modal_inputs[group[0]], multi_modal_inputs[row]):
                group.append(row)
                break
        else:
            candidates.append([row])
            groups.append(candidates[-1])
    return groups


def shared_prompt_layout(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    multi_modal_inputs: list[dict] | None = None,
    groups: list[list[int]] | None = None,
) -> SharedPromptLayout | None:
    """The packed layout with each distinct prompt once, or None when no two rows share a prompt (or
    a row has an empty prompt): then the plain padding-free layout is as good. `groups`: the rows'
    `prompt_groups` (of the same arguments) when the caller has them already."""
    if groups is None:
        groups = prompt_groups(input_ids, attention_mask, response_length, multi_modal_inputs)
    if len(groups) == len(input_ids):
        return None
    n, length = input_ids.shape
    prompt_cols = length - response_length
    mask = attention_mask.bool().cpu()
    packed_of = torch.full((n * length,), -1, dtype=torch.long)
    tokens, query_lengths, keys, key_lengths = [], [], [], []
    start = 0
    for group in groups:
        prompt_at = mask[group[0], :prompt_cols].nonzero().squeeze(-1)
        if len(prompt_at) == 0:
            return None
        prompt = torch.arange(start, start + len(prompt_at))
        tokens.append(group[0] * length + prompt_at)
        query_lengths.append(len(prompt_at))
        keys.append(prompt)
        key_lengths.append(len(prompt_at))
        start += len(prompt_at)
        for row in group:
            packed_of[row * length + prompt_at] = prompt
        for row in group:
            response_at = prompt_cols + mask[row, prompt_cols:].nonzero().squeeze(-1)
            if len(response_at) == 0:
                continue
            response = torch.arange(start, start + len(response_at))
            tokens.append(row * length + response_at)
            packed_of[row * length + response_at] = response
            query_lengths.append(len(response_at))
            keys.append(torch.cat([prompt, response]))
            key_lengths.append(len(prompt) + len(response_at))
            start += len(response_at)
    device = input_ids.device
    return SharedPromptLayout(
        token_index=torch.cat(tokens).to(device),
        query_lengths=torch.tensor(query_lengths),
        key_index=torch.cat(keys),
        key_lengths=torch.tensor(key_lengths),
        packed_of=packed_of.to(device),
        representatives=[group[0] for group in groups],
    )
