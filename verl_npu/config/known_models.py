"""Known model shapes: the config.json facts the memory plan needs for the hub models that the shipped
recipes and upstream verl's example scripts name, for when no config.json is readable here (a hub id
not in the local cache, a placeholder path such as "EDIT_ME: /path/to/Qwen2.5-7B-Instruct").

Source of every row: the model's public config.json on huggingface.co (huggingface.co/ID/blob/main/
config.json), fields copied as numbers; the parameter counts they give are checked in
tests/memory/test_memory_plan.py against the counts the model cards state. Nothing is downloaded. A path
matches a row by its last component, case-insensitive, up to the size ("Qwen2.5-7B-Instruct",
"qwen2.5-7b", "Qwen2.5-7B-Instrct" all match Qwen2.5-7B): base, instruct and math variants of one
size share their shapes.
"""

from __future__ import annotations

import re

_QWEN25_VISION = {
    "depth": 32,
    "hidden_size": 1280,
    "num_heads": 16,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}


def _text(hidden, inter, layers, heads, kv, vocab, tied, head_dim=None):
    row = {
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
    }
    if head_dim:
        row["head_dim"] = head_dim
    return row


#: family key (lower-case name up to the size) -> (hub id the facts are from, config.json fields)
KNOWN: dict[str, tuple[str, dict]] = {
    "qwen2-7b": ("Qwen/Qwen2-7B-Instruct", _text(3584, 18944, 28, 28, 4, 152064, False)),
    "qwen2.5-0.5b": ("Qwen/Qwen2.5-0.5B-Instruct", _text(896, 4864, 24, 14, 2, 151936, True)),
    "qwen2.5-1.5b": ("Qwen/Qwen2.5-1.5B-Instruct", _text(1536, 8960, 28, 12, 2, 151936, True)),
    "qwen2.5-3b": ("Qwen/Qwen2.5-3B-Instruct", _text(2048, 11008, 36, 16, 2, 151936, True)),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", _text(3584, 18944, 28, 28, 4, 152064, False)),
    "qwen2.5-math-7b": ("Qwen/Qwen2.5-Math-7B", _text(3584, 18944, 28, 28, 4, 152064, False)),
    "qwen2.5-14b": ("Qwen/Qwen2.5-14B-Instruct", _text(5120, 13824, 48, 40, 8, 152064, False)),
    "qwen2.5-32b": ("Qwen/Qwen2.5-32B-Instruct", _text(5120, 27648, 64, 40, 8, 152064, False)),
    "qwen2.5-vl-3b": (
        "Qwen/Qwen2.5-VL-3B-Instruct",
        {
            **_text(2048, 11008, 36, 16, 2, 151936, True),
            "vision_config": {**_QWEN25_VISION, "intermediate_size": 3420, "out_hidden_size": 2048},
        },
    ),
    "qwen2.5-vl-7b": (
        "Qwen/Qwen2.5-VL-7B-Instruct",
        {
            **_text(3584, 18944, 28, 28, 4, 152064, False),
            "vision_config": {**_QWEN25_VISION, "intermediate_size": 3420, "out_hidden_size": 3584},
        },
    ),
    "qwen2.5-vl-32b": (
        "Qwen/Qwen2.5-VL-32B-Instruct",
        {
            **_text(5120, 27648, 64, 40, 8, 152064, False),
            "vision_config": {**_QWEN25_VISION, "intermediate_size": 3456, "out_hidden_size": 5120},
        },
    ),
    "qwen3-0.6b": ("Qwen/Qwen3-0.6B", _text(1024, 3072, 28, 16, 8, 151936, True, 128)),
    "qwen3-1.7b": ("Qwen/Qwen3-1.7B", _text(2048, 6144, 28, 16, 8, 151936, True, 128)),
    "qwen3-4b": ("Qwen/Qwen3-4B", _text(2560, 9728, 36, 32, 8, 151936, True, 128)),
    "qwen3-8b": ("Qwen/Qwen3-8B", _text(4096, 12288, 36, 32, 8, 151936, False, 128)),
    "qwen3-32b": ("Qwen/Qwen3-32B", _text(5120, 25600, 64, 64, 8, 151936, False, 128)),
}

_FAMILY = re.compile(r"^(qwen[0-9.]*(?:-vl|-math)?-[0-9.]+b)(?:$|[-_])")


def known_config(path) -> tuple[str, dict] | None:
    """(the hub id the facts are from, a config.json-like dict) for a model path whose last
    component names a known model, else None."""
    if not isinstance(path, str) or not path.strip():
        return None
    name = path.strip().rstrip("/").replace("\\", "/").rsplit("/", 1)[-1].lower()
    m = _FAMILY.match(name)
    if not m or m.group(1) not in KNOWN:
        return None
    hub_id, conf = KNOWN[m.group(1)]
    return hub_id, dict(conf)
