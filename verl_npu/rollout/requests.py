"""Requests to and responses from a serving-style rollout engine (vLLM today, SGLang later).

Plain functions, no engine imported: our prompt rows become token prompts (with images as
`multi_modal_data`), per-prompt sampling seeds come from the prompt's uid, and the engine's
per-request completions become right-padded response / log-prob tensors in our row order
(prompt i's n samples are rows i*n .. i*n+n-1).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from verl_npu.batch import Batch
from verl_npu.errors import UserError
from verl_npu.rollout.base import SamplingParams


def prompt_seed(seed: int, uid: Any) -> int:
    """The sampling seed of one prompt: a function of the run seed and the prompt's uid only, so a
    prompt draws the same samples whichever rank, engine batch or resumed run generates it."""
    return int(seed) * 1_000_003 + zlib.crc32(str(uid).encode())


def collapse_image_tokens(ids: Sequence[int], image_token_id: int) -> list[int]:
    """`ids` with every run of consecutive `image_token_id` shortened to one token.

    Our dataset stores prompts with image placeholders expanded (one token per image patch
    group); serving engines expect one placeholder per image and expand it themselves."""
    out: list[int] = []
    for tok in ids:
        tok = int(tok)
        if tok == image_token_id and out and out[-1] == image_token_id:
            continue
        out.append(tok)
    return out


def token_prompts(
    raw_prompt_ids: Sequence[Sequence[int]],
    multi_modal_data: Sequence[Mapping[str, Any] | None] | None,
    image_token_id: int | None,
) -> list[dict[str, Any]]:
    """Engine token prompts (vLLM's `TokensPrompt` shape), one per row: `{"prompt_token_ids": [...]}` plus `multi_modal_data` for
    rows with images (their image placeholders collapsed, see `collapse_image_tokens`).

    Raises:
        UserError: a row has images but no image placeholder count matching them, or the model
            has no image token id.
    """
    prompts = []
    for row, ids in enumerate(raw_prompt_ids):
        ids = [int(t) for t in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        mm = multi_modal_data[row] if multi_modal_data is not None else None
        images = list((mm or {}).get("image") or [])
        if not images:
            prompts.append({"prompt_token_ids": ids})
            continue
        if image_token_id is None:
            raise UserError(
                f"prompt row {row} has images but the model config has no image_token_id; "
                f"use a vision-language model (e.g. Qwen2.5-VL) for image data"
            )
        collapsed = collapse_image_tokens(ids, image_token_id)
        placeholders = sum(1 for t in collapsed if t == image_token_id)
        if placeholders != len(images):
            raise UserError(
                f"prompt row {row} has {len(images)} image(s) but {placeholders} image placeholder(s) in its "
                f"tokens; each image needs exactly one <image> in the prompt text (check data.image_key and the prompt)"
            )
        prompts.append({"prompt_token_ids": collapsed, "multi_modal_data": {"image": images}})
    return prompts


# ---------------------------------------------------------------------------- sampling
def sampling_kwargs(
    params: SamplingParams, stop_token_ids: Sequence[int] = (), banned_token_ids: Sequence[int] = ()
) -> tuple[dict[str, Any], int]:
    """(`vllm.SamplingParams` keyword arguments, copies of each output) for `params`.

    Greedy decoding (do_sample false or temperature 0) asks vLLM for one sample (it rejects n>1
    when greedy) and the caller repeats it `params.n` times; all n greedy samples are the same
    anyway. top_k <= 0 means "no top-k" and is left out, so each vLLM version's own "off" value
    applies (-1 in old releases, 0 in new ones). `logprobs=0` returns the sampled token's
    log-prob. `stop_token_ids` (the model's EOS ids) are only sent when EOS is not ignored.
    `banned_token_ids` (image/video markers) get a -100 logit bias: never sampled.
    """
    kwargs: dict[str, Any] = dict(
        max_tokens=int(params.max_new_tokens), ignore_eos=bool(params.ignore_eos), logprobs=0, detokenize=False
    )
    if not params.ignore_eos and stop_token_ids:
        kwargs["stop_token_ids"] = [int(t) for t in stop_token_ids]
    if banned_token_ids:
        kwargs["logit_bias"] = {int(t): -100.0 for t in banned_token_ids}
    if params.greedy:
        kwargs.update(n=1, temperature=0.0, top_p=1.0)
        return kwargs, int(params.n)
    kwargs.update(n=int(params.n), temperature=float(params.temperature), top_p=float(params.top_p))
    if params.top_k > 0:
        kwargs["top_k"] = int(params.top_k)
    return kwargs, 1


# ---------------------------------------------------------------------------- outputs
def sampled_log_probs(
    token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any] | None] | None
) -> list[float] | None:
    """The log-prob of each sampled token from vLLM's per-position {token_id: Logprob} maps
    (what `logprobs=0` returns); None when vLLM returned none. A missing entry is NaN."""
    if logprobs is None:
        return None
    out = []
    for pos, tok in enumerate(token_ids):
        entry = logprobs[pos] if pos < len(logprobs) else None
        value = entry.get(int(tok)) if entry is not None else None
        if value is None:
            out.append(float("nan"))
        else:
            out.append(float(getattr(value, "logprob", value)))
    return out


def request_outputs_to_samples(outputs: Sequence[Any], repeat: int = 1) -> list[tuple[list[int], list[float] | None]]:
    """Flatten vLLM `RequestOutput`s (one per prompt, each with `.outputs` completions) to
    (token_ids, sampled log-probs) per sample, in row order: prompt i's samples are
    i*n .. i*n+n-1; each completion appears `repeat` times (greedy decoding, see sampling_kwargs)."""
    samples = []
    for request in outputs:
        for completion in request.outputs:
            ids = [int(t) for t in completion.token_ids]
            lps = sampled_log_probs(ids, getattr(completion, "logprobs", None))
            samples.extend([(ids, lps)] * repeat)
    return samples


def samples_to_tensors(
    samples: Sequence[tuple[Sequence[int], Sequence[float] | None]], width: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Right-padded `responses` LongTensor [N, width] (pad_id after each sample's tokens; longer
    samples are cut at width) and the sampled tokens' log-probs FloatTensor [N, width] (0.0 on
    padding), or None for the log-probs when any sample lacks them."""
    responses = torch.full((len(samples), width), int(pad_id), dtype=torch.long)
    have_lps = all(lps is not None for _, lps in samples)
    log_probs = torch.zeros((len(samples), width), dtype=torch.float32) if have_lps else None
    for row, (ids, lps) in enumerate(samples):
        ids = list(ids)[:width]
        if ids:
            responses[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        if log_probs is not None and ids:
            log_probs[row, : len(ids)] = torch.as_tensor(list(lps)[: len(ids)], dtype=torch.float32)
    return responses, log_probs


def rows_digest(rows: Batch) -> str:
    """A hash of a rollout's responses, masks and log-probs: the ranks of one TP group must return the same."""
    import hashlib

    h = hashlib.sha256()
    for key in ("responses", "response_mask", "rollout_log_probs"):
        if key in rows.tensors:
            h.update(rows[key].contiguous().cpu().numpy().tobytes())
    return h.hexdigest()
