"""Models: tiny local models (``tiny://`` paths), model/tokenizer/processor loading, log-probs.

Names are imported on first use, so ``import verl_npu.models.tiny`` (used by config validation
to recognise ``tiny://`` paths) does not pull in torch or transformers.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "is_tiny_uri": "verl_npu.models.tiny",
    "materialize": "verl_npu.models.tiny",
    "build_tiny_qwen25vl": "verl_npu.models.tiny",
    "build_tiny_qwen2": "verl_npu.models.tiny",
    "load_tokenizer_and_processor": "verl_npu.models.loading",
    "load_policy_model": "verl_npu.models.loading",
    "is_vision_language": "verl_npu.models.loading",
    "resolve_model_path": "verl_npu.models.loading",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'verl_npu.models' has no attribute {name!r}")
