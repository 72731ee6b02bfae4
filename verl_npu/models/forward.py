"""Per-token log-probabilities of responses under a policy model, and values under a value model.

`response_log_probs` is the one function that turns (prompt + response) token ids into the
log-probability of each response token, for any transformers causal LM and for Qwen2/2.5-VL
(images in, 3-D rope positions from the model's own position logic). `response_values` reads a value
model's output before each response token with the same inputs and paths (the critic's forward).
Two paths give the same numbers:

- padded: the batch as a [N, L] tensor with an attention mask;
- padding-free (`use_remove_padding`): all real tokens packed into one [1, T] row with
  per-sequence position ids, so no compute is spent on padding. Attention stays inside each
  sequence through a variable-length attention kernel (`verl_npu.models.varlen`: batched per-sequence
  SDPA on CPU, flash-attention varlen on CUDA, the fused NPU attention on Ascend; no [T, T] mask).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from verl_npu.device import varlen_attention_kernel
from verl_npu.errors import UserError
from verl_npu.models.fused_logprobs import compiled_log_probs_entropy, fused_head, log_probs_entropy, suppress_logits
from verl_npu.models.shared_prompt import prompt_groups, shared_prompt_layout
from verl_npu.models.varlen import packed_attention


def vision_marker_ids(config) -> list[int]:
    """Image/video marker tokens: a response must never contain them (the model would look for
    pixels behind them), so engines forbid sampling them."""
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return [int(getattr(config, n)) for n in names if getattr(config, n, None) is not None]


# Model types whose forward accepts packed sequences described only by restarting position ids.
_PACKING_MODEL_TYPES = {"qwen2", "qwen2_5_vl", "qwen2_vl", "qwen3", "llama", "mistral"}


@dataclass
class VisionTokens:
    """Token ids that mark images / videos in the sequence (None for text-only models)."""

    image_token_id: int | None
    video_token_id: int | None

    @classmethod
    def of(cls, model) -> VisionTokens:
        cfg = model.config
        return cls(getattr(cfg, "image_token_id", None), getattr(cfg, "video_token_id", None))

    @property
    def is_vision(self) -> bool:
        return self.image_token_id is not None


def mm_token_type_ids(input_ids: torch.Tensor, vt: VisionTokens) -> torch.Tensor:
    """0 for text, 1 for image placeholder tokens, 2 for video ones (Qwen-VL convention)."""
    types = torch.zeros_like(input_ids, dtype=torch.int32)
    if vt.image_token_id is not None:
        types[input_ids == vt.image_token_id] = 1
    if vt.video_token_id is not None:
        types[input_ids == vt.video_token_id] = 2
    return types


def merge_multi_modal_inputs(rows: list[dict | None] | None, device=None) -> dict[str, torch.Tensor]:
    """Concatenate per-row processor outputs (pixel_values, image_grid_thw, ...) in row order: for one forward
    (moved to `device`), or the images of one trajectory (the agent loop adds a tool turn's; device None:
    where they are)."""
    if not rows:
        return {}
    merged: dict[str, list[torch.Tensor]] = {}
    for row in rows:
        for key, value in (row or {}).items():
            merged.setdefault(key, []).append(value)
    return {
        k: torch.cat(v, dim=0) if device is None else torch.cat(v, dim=0).to(device) for k, v in merged.items() if v
    }


def supports_remove_padding(model) -> bool:
    return getattr(model.config, "model_type", None) in _PACKING_MODEL_TYPES


def _text_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp(min=0)


def rope_positions(
    model,
    input_ids,
    attention_mask,
    mm_inputs,
    vt: VisionTokens,
    *,
    response_length: int = 0,
    rows_mm: list[dict] | None = None,
    groups: list[list[int]] | None = None,
) -> torch.Tensor:
    """Position ids as the model itself computes them: [N, L] for text models; [3, N, L] 3-D rope for
    Qwen-VL with images (via the model's own `get_rope_index`).

    With `response_length`, `rows_mm` (each row's own multimodal inputs) and `groups` (rows with the same
    prompt, `shared_prompt.prompt_groups`), 3-D positions are computed for one row per distinct prompt
    only (`_shared_rope_positions`): the same numbers, without running the model's per-row loop n times."""
    if vt.is_vision and "image_grid_thw" in mm_inputs:
        inner = getattr(model, "model", model)
        if response_length and rows_mm is not None and groups is not None and len(groups) < len(input_ids):
            shared = _shared_rope_positions(inner, input_ids, attention_mask, rows_mm, groups, response_length, vt)
            if shared is not None:
                return shared
        positions, _ = inner.get_rope_index(
            input_ids,
            mm_token_type_ids=mm_token_type_ids(input_ids, vt),
            image_grid_thw=mm_inputs.get("image_grid_thw"),
            video_grid_thw=mm_inputs.get("video_grid_thw"),
            attention_mask=attention_mask,
        )
        return positions
    text = _text_positions(attention_mask)
    return text.unsqueeze(0).expand(3, -1, -1) if vt.is_vision else text


def _shared_rope_positions(inner, input_ids, attention_mask, rows_mm, groups, response_length, vt):
    """`get_rope_index`'s [3, N, L] positions, computed on one row per group of rows with the same prompt
    (ids, padding and images), or None where this does not apply (a response holds image or video tokens).

    `get_rope_index` numbers each row's real tokens segment by segment: a text segment continues from the
    position after the previous segment, one per token. Responses are text after their prompt, so a row's
    real response tokens continue its prompt's last segment: the k-th real response token of any row of a
    group has the position the group's representative row gives response column k when every one of its
    response columns counts as a real text token. Padding keeps position 0, as in `get_rope_index`."""
    prompt_cols = input_ids.shape[1] - response_length
    real = attention_mask[:, prompt_cols:].bool()
    if bool((mm_token_type_ids(input_ids[:, prompt_cols:], vt)[real] != 0).any()):
        return None
    reps = [group[0] for group in groups]
    rep_ids, rep_mask = input_ids[reps], attention_mask[reps].clone()
    rep_mask[:, prompt_cols:] = 1
    types = mm_token_type_ids(rep_ids, vt)
    types[:, prompt_cols:] = 0
    grids = {}
    for key in ("image_grid_thw", "video_grid_thw"):
        parts = [rows_mm[r][key] for r in reps if rows_mm[r] and rows_mm[r].get(key) is not None]
        grids[key] = torch.cat(parts).to(input_ids.device) if parts else None
    rep_positions, _ = inner.get_rope_index(rep_ids, mm_token_type_ids=types, attention_mask=rep_mask, **grids)
    group_of = torch.empty(len(input_ids), dtype=torch.long)
    for index, group in enumerate(groups):
        group_of[group] = index
    group_of = group_of.to(input_ids.device)
    per_row = rep_positions[:, group_of]  # [3, N, L]: each row's representative's
    ordinal = (real.long().cumsum(1) - 1).clamp(min=0)  # the k of each real response token
    response = per_row[:, :, prompt_cols:].gather(2, ordinal.unsqueeze(0).expand(3, -1, -1))
    positions = per_row.clone()
    positions[:, :, prompt_cols:] = torch.where(real, response, torch.zeros_like(response))
    return positions


def _token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = logits.float()
    return torch.gather(F.log_softmax(logits, dim=-1), -1, targets.unsqueeze(-1)).squeeze(-1)


def _entropy(logits: torch.Tensor, chunk: int = 0) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim. `chunk` > 0 computes it `chunk` tokens at a
    time (actor.entropy_from_logits_with_chunking), so the fp32 softmax temporaries never cover
    all tokens at once; the values are the same."""
    if chunk <= 0 or logits.shape[:-1].numel() <= chunk:
        logp = F.log_softmax(logits.float(), dim=-1)
        return -(logp.exp() * logp).sum(-1)
    flat = logits.reshape(-1, logits.shape[-1])
    return torch.cat([_entropy(part) for part in flat.split(chunk)]).reshape(logits.shape[:-1])


def sum_pi_squared(logits: torch.Tensor, chunk: int = 0) -> torch.Tensor:
    """``Σ_v softmax(logits)_v²`` over the last dim, as ``exp(logsumexp(2z) - 2·logsumexp(z))`` in float32;
    `chunk` > 0: that many tokens at a time (as `_entropy`)."""
    if chunk <= 0 or logits.shape[:-1].numel() <= chunk:
        z = logits.float()
        return torch.exp(torch.logsumexp(2.0 * z, dim=-1) - 2.0 * torch.logsumexp(z, dim=-1))
    flat = logits.reshape(-1, logits.shape[-1])
    return torch.cat([sum_pi_squared(part) for part in flat.split(chunk)]).reshape(logits.shape[:-1])


def response_log_probs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    *,
    multi_modal_inputs: list[dict] | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    remove_padding: bool = False,
    return_logits: bool = False,
    sp_group=None,
    entropy_chunk: int = 0,
    fused: bool = False,
    compile: bool = False,
    with_sum_pi_squared: bool = False,
):
    """log p(token_t | tokens_<t) for the last `response_length` positions of each row.

    `input_ids` / `attention_mask` are [N, L] = left-padded prompt followed by right-padded
    response. Logits are divided by `temperature` (the sampling temperature, so the numbers
    match the distribution the rollout sampled from). Returns (log_probs [N, R], entropy [N, R]
    or None), plus the temperature-scaled logits [N, R, V] as a third item when `return_logits`
    (for the exact "full" KL); positions under padding hold values that callers mask out.

    `sp_group` (Ulysses sequence parallelism, padding-free path only): every rank of the group
    passes the same rows; each runs the model on its 1/P slice of the packed tokens, attention
    all-to-alls between them, and the logits are gathered back, so every rank returns the full
    result. Gradients come out scaled by P, which cancels FSDP's average over the SP peers.

    `fused` (`model.use_fused_kernels`): the model's output projection computes the log-probs and
    entropy itself, a chunk of tokens at a time (verl_npu.models.fused_logprobs), never holding the
    float32 [tokens x vocab] logits; the numbers are the same. A pass that returns the logits (the
    exact "full" KL) is not fused.

    `compile` (`actor.use_torch_compile`): the log-softmax / gather / entropy formula runs through
    torch.compile (`fused_logprobs.compiled_log_probs_entropy`); the numbers are the same.

    `with_sum_pi_squared` (`actor.calculate_sum_pi_squared`, not with `return_logits`): the third item is
    ``Σ_v π_v²`` [N, R] of the same temperature-scaled distribution (`sum_pi_squared`); such a pass is not
    fused, since it needs the logits.
    """
    if with_sum_pi_squared and return_logits:
        raise ValueError("response_log_probs: with_sum_pi_squared and return_logits are exclusive")
    extra = "sum_pi_squared" if with_sum_pi_squared else ("logits" if return_logits else None)
    # the rollout never samples image / video marker tokens: the log-probs describe that distribution
    suppress = torch.tensor(vision_marker_ids(model.config), dtype=torch.long, device=input_ids.device)
    # a pass that returns the logits or Σπ² needs the logits: it is not fused (head None)
    fusing = fused_head(model, temperature, with_entropy, compile, suppress) if fused and extra is None else None
    with fusing or contextlib.nullcontext() as head:
        device = input_ids.device
        vt = VisionTokens.of(model)
        mm = merge_multi_modal_inputs(multi_modal_inputs, device)
        # rows with the same prompt: their 3-D rope positions are computed once, their prompt packed once
        groups = (
            prompt_groups(input_ids, attention_mask, response_length, multi_modal_inputs)
            if vt.is_vision and "image_grid_thw" in mm
            else None
        )
        positions = rope_positions(
            model,
            input_ids,
            attention_mask,
            mm,
            vt,
            response_length=response_length,
            rows_mm=multi_modal_inputs,
            groups=groups,
        )
        n, length = input_ids.shape
        targets = torch.roll(input_ids, shifts=-1, dims=1)  # targets[:, t] = input_ids[:, t + 1]

        if remove_padding:
            _check_remove_padding(model, "actor_rollout_ref.model.use_remove_padding")
            keep, flat_ids, packed_pos, needed, wanted = _packed_layout(
                input_ids, attention_mask, response_length, positions
            )
            if sp_group is not None:
                if head is not None:  # the fused head needs the targets of the tokens it sees: this rank's slice
                    from verl_npu.models import ulysses

                    head.targets = ulysses.pad_and_shard(targets[keep].unsqueeze(0), 1, sp_group)[0]
                raw = _sequence_parallel_logits(model, flat_ids, packed_pos, mm, sp_group)[wanted]
            else:
                if head is not None:
                    head.targets = targets[needed].unsqueeze(0)
                raw = _packed_outputs(
                    model,
                    input_ids,
                    attention_mask,
                    response_length,
                    multi_modal_inputs,
                    positions,
                    (keep, flat_ids, packed_pos, needed, wanted),
                    mm,
                    groups,
                )
                # raw: [len(wanted), V] ([len(wanted), 2] with a fused head)
            lp_flat, ent_flat, logits = _log_probs_entropy(
                raw, targets[needed], temperature, with_entropy, head, compile, entropy_chunk, suppress, extra
            )
            log_probs = torch.zeros(n, length, dtype=lp_flat.dtype, device=device)
            log_probs[needed] = lp_flat
            entropy = None
            if with_entropy:
                entropy = torch.zeros(n, length, dtype=lp_flat.dtype, device=device)
                entropy[needed] = ent_flat
            if extra is not None:  # logits [n, L, V] or Σπ² [n, L]
                packed_logits, logits = logits, logits.new_zeros(n, length, *logits.shape[1:])
                logits[needed] = packed_logits
        else:
            # only the last R + 1 positions need logits (the first R of them predict the response): the
            # lm head, log-softmax and entropy run on those only; the rest is zero-padded on the left
            n_keep = response_length + 1
            left = length - n_keep
            if head is not None:
                head.targets = targets[:, left:]
            out = model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=positions,
                use_cache=False,
                logits_to_keep=n_keep,
                **mm,
            )
            log_probs, entropy, logits = _log_probs_entropy(
                out.logits, targets[:, left:], temperature, with_entropy, head, compile, entropy_chunk, suppress, extra
            )
            log_probs = F.pad(log_probs, (left, 0))
            entropy = F.pad(entropy, (left, 0)) if entropy is not None else None
            if extra == "logits":
                logits = F.pad(logits, (0, 0, left, 0))  # [N, L, V]
            elif extra is not None:
                logits = F.pad(logits, (left, 0))  # Σπ² [N, L]

        # logits at position t predict token t+1: responses occupy [L-R, L), so read [L-R-1, L-1)
        start = length - response_length - 1
        log_probs = log_probs[:, start : length - 1]
        if entropy is not None:
            entropy = entropy[:, start : length - 1]
        if extra is not None:
            return log_probs, entropy, logits[:, start : length - 1]
        return log_probs, entropy


def _log_probs_entropy(
    raw, targets, temperature, with_entropy, head, compile, entropy_chunk=0, suppress=None, extra=None
):
    """(log-probs, entropy or None, third) from the model's output `raw`: logits, or with a fused `head`
    the [..., 2] (log-prob, entropy) it computed. `third`: Σπ² with `extra` == "sum_pi_squared", else
    the scaled logits (None with a fused head). `entropy_chunk` > 0 (plain path) computes the entropy
    (and Σπ²) that many tokens at a time. The tokens `suppress` get probability 0."""
    if head is not None:
        return raw[..., 0], (raw[..., 1] if with_entropy else None), None
    logits = suppress_logits(raw / temperature if temperature != 1.0 else raw, suppress)
    if compile:
        lp, ent = compiled_log_probs_entropy()(logits, targets, with_entropy)
    elif with_entropy and entropy_chunk > 0:
        lp, ent = _token_log_probs(logits, targets), _entropy(logits, entropy_chunk)
    else:
        lp, ent = log_probs_entropy(logits, targets, with_entropy)  # one log-softmax for both
    return lp, ent, (sum_pi_squared(logits, entropy_chunk) if extra == "sum_pi_squared" else logits)


def _check_remove_padding(model, key: str) -> None:
    """UserError naming `key` (the role's use_remove_padding) when the model cannot run packed."""
    if not supports_remove_padding(model):
        raise UserError(f"{key}=true is not supported for model type {model.config.model_type!r}; set {key}=false")


def _packed_layout(input_ids, attention_mask, response_length, positions):
    """The padding-free layout of a batch: (keep [N, L]: real tokens, flat_ids [1, T], packed positions
    ([1, T], or [4, 1, T] with the text positions first for 3-D rope: they delimit the sequences),
    needed [N, L]: the real positions whose output predicts a response token, wanted: their indices
    in the packed row)."""
    length = input_ids.shape[1]
    keep = attention_mask.bool()
    flat_ids = input_ids[keep].unsqueeze(0)
    text_pos = _text_positions(attention_mask)[keep].unsqueeze(0)
    if positions.dim() == 3:  # [3, N, L] -> [4, 1, T]: text positions first (they delimit sequences)
        packed_pos = torch.cat([text_pos.unsqueeze(0), positions[:, keep].unsqueeze(1)], dim=0)
    else:
        packed_pos = text_pos
    # outputs only where a response token is predicted: real tokens in columns [L-R-1, L-1)
    needed = torch.zeros_like(keep)
    needed[:, length - response_length - 1 : length - 1] = True
    needed &= keep
    wanted = needed[keep].nonzero().squeeze(-1)  # their indices in the packed row
    return keep, flat_ids, packed_pos, needed, wanted


def _takes_logits_to_keep(model) -> bool:
    """Whether the model's forward selects its output positions itself (`logits_to_keep`): causal LMs and
    `VisionLanguageValueModel` do, token-classification models do not."""
    return _forward_takes(type(model), "logits_to_keep")


@functools.cache
def _forward_takes(cls, name: str) -> bool:
    return name in inspect.signature(cls.forward).parameters


def _packed_outputs(
    model, input_ids, attention_mask, response_length, multi_modal_inputs, positions, layout, mm, groups=None
):
    """The model's output (`.logits[0]`) at the packed positions `wanted` of `layout` (`_packed_layout`),
    in row-major order of `needed`: one packed row of the real tokens, or with each distinct prompt once
    (rollout.n > 1: verl_npu.models.shared_prompt), under variable-length attention. `groups`: the rows'
    `prompt_groups` when the caller has them already."""
    keep, flat_ids, packed_pos, needed, wanted = layout
    kernel = varlen_attention_kernel(input_ids.device.type)
    # responses with images of their own (multi-turn tool images) are packed row by row: a shared
    # layout encodes only its representative rows' images
    image_id = getattr(getattr(model, "config", None), "image_token_id", None)
    response_images = image_id is not None and bool((input_ids[:, -response_length:] == image_id).any())
    shared = (
        None
        if response_images
        else shared_prompt_layout(input_ids, attention_mask, response_length, multi_modal_inputs, groups=groups)
    )
    if shared is None:
        lengths, keys = keep.sum(1), {}
    else:
        flat_ids, packed_pos, wanted, mm = _shared_inputs(
            shared, input_ids, attention_mask, positions, needed, multi_modal_inputs
        )
        lengths, keys = shared.query_lengths, {"key_index": shared.key_index, "key_lengths": shared.key_lengths}
    selects = _takes_logits_to_keep(model)
    with packed_attention(model, lengths, kernel, **keys):
        out = model(
            input_ids=flat_ids,
            position_ids=packed_pos,
            attention_mask=None,
            use_cache=False,
            **({"logits_to_keep": wanted} if selects else {}),
            **mm,
        )
    logits = out.logits.squeeze(0)  # a view (see varlen_attention_forward)
    return logits if selects else logits[wanted]


def response_values(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    *,
    multi_modal_inputs: list[dict] | None = None,
    remove_padding: bool = False,
    remove_padding_key: str = "critic.model.use_remove_padding",
) -> torch.Tensor:
    """Values [N, R] (float32) of the response tokens under a value model (one output per position: a
    token-classification model, or `value_model.VisionLanguageValueModel`): the value of response
    token t is the output at the position that predicts it, the hidden state of the token before it,
    as `response_log_probs` reads the log-prob of token t. The inputs are those of `response_log_probs`
    (images, 3-D rope positions from the model's own logic); `remove_padding`: the padding-free path,
    each distinct prompt once, the same values up to summation order (`remove_padding_key` is the
    setting an error names). A text value model reads the token ids only, also of rows with images (a text
    critic beside a vision-language actor)."""
    vt = VisionTokens.of(model)
    if not vt.is_vision:
        multi_modal_inputs = None
    mm = merge_multi_modal_inputs(multi_modal_inputs, input_ids.device)
    positions = rope_positions(model, input_ids, attention_mask, mm, vt)
    n, length = input_ids.shape
    start = length - response_length - 1
    if remove_padding:
        _check_remove_padding(model, remove_padding_key)
        layout = _packed_layout(input_ids, attention_mask, response_length, positions)
        packed = (
            _packed_outputs(
                model, input_ids, attention_mask, response_length, multi_modal_inputs, positions, layout, mm
            )
            .squeeze(-1)
            .float()
        )
        needed = layout[3]
        values = torch.zeros(n, length, dtype=packed.dtype, device=input_ids.device)
        values[needed] = packed
        return values[:, start : length - 1]
    if _takes_logits_to_keep(model):  # only the last R + 1 positions go through the head
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            use_cache=False,
            logits_to_keep=response_length + 1,
            **mm,
        )
        return out.logits.squeeze(-1).float()[:, :-1]
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False, **mm)
    return out.logits.squeeze(-1).float()[:, start : length - 1]


def _shared_inputs(shared, input_ids, attention_mask, positions, needed, multi_modal_inputs):
    """The packed model inputs of a shared-prompt layout: token ids, positions (each token's position
    in its own row; [4, 1, T] with text positions first for 3-D rope), the packed positions whose
    logits predict the `needed` targets (row-major, as `targets[needed]`), and the multimodal inputs
    of one row per distinct prompt."""
    index = shared.token_index
    flat_ids = input_ids.reshape(-1)[index].unsqueeze(0)
    text_pos = _text_positions(attention_mask).reshape(-1)[index].unsqueeze(0)
    if positions.dim() == 3:
        packed_pos = torch.cat([text_pos.unsqueeze(0), positions.reshape(3, -1)[:, index].unsqueeze(1)], dim=0)
    else:
        packed_pos = text_pos
    wanted = shared.packed_of[needed.reshape(-1)]
    rows = [multi_modal_inputs[r] for r in shared.representatives] if multi_modal_inputs else None
    return flat_ids, packed_pos, wanted, merge_multi_modal_inputs(rows, input_ids.device)


def _decoder(model):
    """The module that turns token ids / embeddings into hidden states (the language model)."""
    inner = getattr(model, "model", model)
    return getattr(inner, "language_model", inner)


def _sequence_parallel_logits(model, flat_ids, packed_pos, mm: dict, sp_group) -> torch.Tensor:
    """Logits [T, V] of the packed sequence, computed by the SP group.

    The model runs as usual on the whole packed row (embeddings and image features are made inside
    its own forward, where FSDP gathers their weights); a hook hands the decoder only this rank's
    1/P slice of the tokens and positions, Ulysses attention all-to-alls between the ranks, and the
    logits of the slices are gathered back."""
    from verl_npu.models import ulysses

    p = ulysses.sp_size(sp_group)
    pad = (-flat_ids.shape[-1]) % p
    # padding gets positions that restart at 0: a sequence of its own, never attended to by real tokens
    pos_pad = torch.nn.functional.pad(packed_pos, (0, pad))

    def shard_inputs(module, args, kwargs):
        for key in ("input_ids", "inputs_embeds"):
            if kwargs.get(key) is not None:
                kwargs[key], _ = ulysses.pad_and_shard(kwargs[key], 1, sp_group)
        kwargs["position_ids"], _ = ulysses.pad_and_shard(kwargs["position_ids"], -1, sp_group)
        return args, kwargs

    name = ulysses.register_ulysses_attention()
    text_cfg = model.config.get_text_config()
    inner_impl = text_cfg._attn_implementation
    composite = text_cfg is not model.config
    hook = _decoder(model).register_forward_pre_hook(shard_inputs, with_kwargs=True)
    model.set_attn_implementation({"text_config": name} if composite else name)
    try:
        with ulysses.sequence_parallel(sp_group, pos_pad, inner=inner_impl):
            out = model(input_ids=flat_ids, position_ids=pos_pad, attention_mask=None, use_cache=False, **mm)
    finally:
        hook.remove()
        model.set_attn_implementation({"text_config": inner_impl} if composite else inner_impl)
    return ulysses.gather_sequence(out.logits, 1, sp_group, pad, grad_scale=float(p))[0]
