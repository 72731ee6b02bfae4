"""What the config checks read from a local model folder's config.json: heads, length limit, and the
Ulysses size rule that depends on them. Imports no torch (a hub id is looked up in the Hugging Face cache)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from verl_npu.hub import cached_folder, looks_like_hub_id

LONG_RESPONSE = 8192
TOKENS_PER_SP_RANK = 2048


def model_config(path: Any) -> dict | None:
    """`<path>/config.json` as a dict, or None when the path is not a readable local model folder.
    A hub id that is not a local folder is read from its snapshot in the Hugging Face cache, if
    the cache holds it (nothing is downloaded here)."""
    if not isinstance(path, str) or "://" in path:
        return None
    folder = Path(os.path.expanduser(path))
    if not folder.is_dir() and looks_like_hub_id(path):
        folder = cached_folder(path) or folder
    cfg_file = folder / "config.json"
    try:
        conf = json.loads(cfg_file.read_text())
    except (OSError, ValueError):
        return None
    return conf if isinstance(conf, dict) else None


def model_heads(path: Any) -> tuple[int, int] | None:
    """(attention heads, key-value heads) from `<path>/config.json` (the text model's config for
    VLMs), or None when the path is not a readable local model folder."""
    conf = model_config(path)
    if conf is None:
        return None
    text_config = conf.get("text_config")
    text = text_config if isinstance(text_config, dict) else {}
    heads = conf.get("num_attention_heads") or text.get("num_attention_heads")
    kv = conf.get("num_key_value_heads") or text.get("num_key_value_heads") or heads
    if not isinstance(heads, int) or not isinstance(kv, int):
        return None
    return heads, kv


_POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
    "model_max_length",
)


def _factors(node: Any) -> list[float]:
    """Every numeric `factor` inside a rope_scaling / rope_parameters value (per-layer-type dicts too)."""
    if not isinstance(node, dict):
        return []
    found = [float(node["factor"])] if isinstance(node.get("factor"), (int, float)) else []
    for value in node.values():
        found += _factors(value)
    return found


def model_length_limit(path: Any) -> tuple[int, str] | None:
    """An upper bound of the longest sequence vLLM lets an engine of this model hold, with the
    config field it comes from; None when unknown (no readable config, or no length field).

    vLLM takes the smallest length field of the text config (times the RoPE scaling factor) and
    refuses a larger max_model_len. This bound is deliberately generous (the largest field, the
    largest factor, text and top-level configs alike), so exceeding it always fails in vLLM."""
    conf = model_config(path)
    if conf is None:
        return None
    nodes = [conf] + [
        conf[k] for k in ("text_config", "language_config", "llm_config") if isinstance(conf.get(k), dict)
    ]
    lengths = [
        (int(n[k]), k)
        for n in nodes
        for k in _POSITION_KEYS
        if isinstance(n.get(k), int) and not isinstance(n.get(k), bool) and n[k] > 0
    ]
    if not lengths:
        return None
    factor = max([1.0] + [f for n in nodes for k in ("rope_scaling", "rope_parameters") for f in _factors(n.get(k))])
    length, field = max(lengths)
    if factor > 1:
        return int(length * factor), f"{field}={length} x rope factor {factor:g}"
    return length, f"{field}={length}"


def ulysses_size(response_length: int, world: int, heads: tuple[int, int] | None) -> int:
    """The seed's long-sequence rule: response_length // 2048 when responses exceed 8192 tokens
    (else 1), lowered until it divides the device count and fits the attention heads."""
    if response_length <= LONG_RESPONSE:
        return 1
    # a size above the device count never divides it: start there (a huge length stays a short loop)
    sp = max(1, min(response_length // TOKENS_PER_SP_RANK, world))
    while sp > 1:
        fits_heads = heads is None or (heads[0] % sp == 0 and (heads[1] % sp == 0 or sp % heads[1] == 0))
        if world % sp == 0 and fits_heads:
            break
        sp -= 1
    return sp
