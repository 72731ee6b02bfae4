"""The per-device memory plan of a recipe: pure arithmetic, no torch, so `validate` stays instant.

`verl_npu.memory.recipe.plan_recipe(rc, ...)` reads the resolved recipe and each role's
`config.json` and returns a `Plan`: per phase (rollout, old log-probs, ref log-probs, actor update,
critic update, reward model, checkpoint save) the bytes one device holds, broken into parts, plus a
host figure per node, the verdict against the device's memory and the knobs that would lower the
peak (each re-planned, with the bytes it saves). This module holds the formulas of the parts and the Plan; `verl_npu.memory.recipe` reads
the recipe and puts the phases together. `docs/memory.md` lists every formula; each function below
states its own.

Symbols: P parameters of a role, W the ranks a role's FSDP2 shards span (the world size; 1 when a
single worker runs without FSDP2), b the compute dtype's bytes (2 for bf16 on accelerators, 4 on CPU),
H hidden size, I MLP size, L layers, V vocabulary, T tokens of one micro-batch on one device,
Rt the response tokens of it whose logits are computed.

The activation coefficients were measured on CPU (fp32, transformers' Qwen2, one micro-batch, with
torch's MemTracker: bench/memory_measure.py) and are scaled by b/4 for bf16; logits stay float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GIB = 1 << 30
TIGHT = 0.10  # under 10% headroom: tight
#: fp32 elements a token keeps per decoder layer for backward (measured: bench/results/memory_plan.md)
ACT_PER_LAYER_H, ACT_PER_LAYER_I, ACT_RMPAD_EXTRA_H = 6.4, 4.7, 2.0
ACT_OUTSIDE_H = 8.0  # embeddings, final norm, the hidden states before the head
CKPT_LAYER_H, CKPT_RECOMPUTE_H, CKPT_RECOMPUTE_I = 1.0, 9.0, 6.0
LOGIT_COPIES_TRAIN = 3  # float32 log-softmax output, its gradient, the logits' gradient
LOGIT_COPIES_INFER = 4  # float32 logits, log-softmax, entropy's exp and product (old log-probs)
FUSED_CHUNK_BYTES = 64 << 20  # verl_npu.models.fused_logprobs.CHUNK_BYTES
WORKER_BASE_BYTES = GIB  # one worker process on an accelerator: Python, torch, transformers, the
# device runtime (not measured; the CPU's base below and some room for it)
CPU_WORKER_BASE_BYTES = 870 << 20  # one worker process on CPU: Python, torch, transformers, the data
CPU_ALLOCATOR_RETAINED = 0.2  # of the peak tensors: what the C allocator keeps beside them (below)
#: an accelerator's matmul library workspaces (cuBLAS and cuBLASLt), taken from the caching allocator by the first
#: matmul and kept: 66-74 MB allocated before the first phase beyond the weights and optimizer states (H200)
ACCELERATOR_WORKSPACE_BYTES = 64 << 20
RAY_BYTES = GIB // 2  # Ray's own processes (GCS, raylet) beside several workers (not measured)


# ------------------------------------------------------------------------------------------------ model numbers
@dataclass(frozen=True)
class ModelSize:
    """The numbers of a model that memory depends on, from its config.json."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = True
    vision: dict | None = None

    @property
    def layer_params(self) -> int:
        """q (+bias), k and v (+bias), o, gate/up/down, two norms: H*(heads*hd) + heads*hd
        + 2*(H*kv*hd + kv*hd) + heads*hd*H + 3*H*I + 2*H."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return h * q + q + 2 * (h * kv + kv) + q * h + 3 * h * self.intermediate + 2 * h

    @property
    def text_params(self) -> int:
        """V*H embeddings (+ V*H head when untied) + L layers + the final norm."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.layers * self.layer_params + self.hidden

    @property
    def vision_params(self) -> int:
        """Qwen2-VL style tower: patch embedding 3*t*p*p*Hv, per block qkv+proj 4*Hv^2+4*Hv, MLP
        3*Hv*Iv+2*Iv+Hv, two norms; merger (Hv*m^2)^2 + Hv*m^2 + (Hv*m^2)*out + out + Hv."""
        v = self.vision
        if not v:
            return 0
        hv, iv, depth = v["hidden"], v["intermediate"], v["depth"]
        block = 4 * hv * hv + 4 * hv + 3 * hv * iv + 2 * iv + hv + 2 * hv
        merged = hv * v["merge"] ** 2
        merger = merged * merged + merged + merged * v["out"] + v["out"] + hv
        return 3 * v["temporal"] * v["patch"] ** 2 * hv + depth * block + merger

    @property
    def params(self) -> int:
        return self.text_params + self.vision_params

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of every linear layer of one decoder layer (what LoRA adapts)."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]


def _int(node: dict, *keys: str) -> int | None:
    for key in keys:
        value = node.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def model_size(conf: dict | None) -> ModelSize | None:
    """The `ModelSize` of a config.json dict (text fields at the top or under text_config), or None
    when it lacks hidden size, layers, heads or vocabulary."""
    if not isinstance(conf, dict):
        return None
    text = {**conf, **(conf.get("text_config") or {})} if isinstance(conf.get("text_config"), dict) else conf
    hidden = _int(text, "hidden_size", "n_embd", "d_model")
    layers = _int(text, "num_hidden_layers", "n_layer", "num_layers")
    heads = _int(text, "num_attention_heads", "n_head")
    vocab = _int(text, "vocab_size") or _int(conf, "vocab_size")
    if not (hidden and layers and heads and vocab):
        return None
    kv = _int(text, "num_key_value_heads") or heads
    head_dim = _int(text, "head_dim") or hidden // heads
    inter = _int(text, "intermediate_size", "n_inner", "ffn_dim") or 4 * hidden
    tied = bool(text.get("tie_word_embeddings", conf.get("tie_word_embeddings", False)))
    vc, vision = conf.get("vision_config"), None
    if isinstance(vc, dict) and _int(vc, "depth", "num_hidden_layers"):
        vh = _int(vc, "hidden_size", "embed_dim") or hidden
        vision = {
            "hidden": vh,
            "depth": _int(vc, "depth", "num_hidden_layers"),
            "intermediate": _int(vc, "intermediate_size") or 4 * vh,
            "patch": _int(vc, "patch_size") or 14,
            "merge": _int(vc, "spatial_merge_size") or 2,
            "temporal": _int(vc, "temporal_patch_size") or 2,
            "out": _int(vc, "out_hidden_size") or hidden,
        }
    return ModelSize(hidden, layers, heads, kv, head_dim, inter, vocab, tied, vision)


def autocast_cast_params(m: ModelSize) -> int:
    """Parameters torch.autocast casts and keeps while a forward runs (one worker, no FSDP2): every weight a
    matmul reads, so all but the input embeddings (a lookup) unless they are tied to the head; norms and
    biases are a rounding error (counted)."""
    return m.params - (0 if m.tied else m.vocab * m.hidden)


def lora_params(m: ModelSize, rank: int) -> int:
    """Adapter parameters: r * (in + out) for every linear layer of every decoder layer."""
    return 0 if rank <= 0 else m.layers * sum(rank * (a + b) for a, b in m.linear_shapes())


# ------------------------------------------------------------------------------------------------ the parts
def weight_bytes(params: int, dtype_bytes: int, shards: int, offload: bool) -> int:
    """params * dtype_bytes / shards on the device (FSDP2 keeps 1/W of every parameter); 0 when offloaded."""
    return 0 if offload else math.ceil(params * dtype_bytes / shards)


def grad_bytes(trainable: int, shards: int, offload: bool, dtype_bytes: int = 4) -> int:
    """Gradients of the trainable parameters, in their dtype (float32: 4 * P / W); kept from one update to
    the next (zero_grad frees them only at the next update's start); on the host when offloaded."""
    return 0 if offload else math.ceil(dtype_bytes * trainable / shards)


def adam_bytes(trainable: int, shards: int, offload: bool, dtype_bytes: int = 4) -> int:
    """AdamW's two moments of the trainable parameters, in their dtype (float32: 8 * P / W; the master
    weights are the parameters themselves); on the host when offloaded."""
    return 0 if offload else math.ceil(2 * dtype_bytes * trainable / shards)


def activation_bytes(
    m: ModelSize, tokens: float, *, checkpointing: bool, remove_padding: bool, compute_bytes: int
) -> int:
    """What backward needs of one micro-batch of `tokens` tokens (per device, after Ulysses' 1/sp), in
    float32 elements times b/4:
    without checkpointing T * (L * (6.4 H + 4.7 I [+ 2 H padding-free]) + 8 H);
    with checkpointing  T * (L * H + 9 H [+ 2 H] + 6 I) (each layer's input, one layer recomputed)."""
    h, i, extra = m.hidden, m.intermediate, ACT_RMPAD_EXTRA_H * m.hidden if remove_padding else 0.0
    if checkpointing:
        per_token = m.layers * CKPT_LAYER_H * h + CKPT_RECOMPUTE_H * h + extra + CKPT_RECOMPUTE_I * i
    else:
        per_token = m.layers * (ACT_PER_LAYER_H * h + ACT_PER_LAYER_I * i + extra) + ACT_OUTSIDE_H * h
    return int(tokens * per_token * compute_bytes)


def checkpointed_split(m: ModelSize, tokens: float, *, remove_padding: bool, compute_bytes: int) -> tuple[int, int]:
    """With gradient checkpointing: (the layers' saved inputs T * L * H * b, one layer's recompute
    T * (9 H [+ 2 H] + 6 I) * b). The recompute comes after the logits' backward has freed them, so
    an update's peak holds the larger of the recompute and the logits, not both (measured)."""
    extra = ACT_RMPAD_EXTRA_H * m.hidden if remove_padding else 0.0
    saved = tokens * m.layers * CKPT_LAYER_H * m.hidden * compute_bytes
    recompute = tokens * (CKPT_RECOMPUTE_H * m.hidden + extra + CKPT_RECOMPUTE_I * m.intermediate) * compute_bytes
    return int(saved), int(recompute)


def inference_bytes(m: ModelSize, tokens: float, compute_bytes: int) -> int:
    """A forward without gradients keeps one layer's working set: T * (4 H + 3 I) * b."""
    return int(tokens * (4 * m.hidden + 3 * m.intermediate) * compute_bytes)


def vision_activation_bytes(
    m: ModelSize, patches: float, *, checkpointing: bool, frozen: bool, compute_bytes: int
) -> int:
    """The vision tower's saved activations for `patches` patches: like a decoder layer, depth *
    (6.4 Hv + 4.7 Iv) per patch (depth * Hv + one block with checkpointing); a frozen tower keeps
    one block's working set only (no gradient flows into it)."""
    v = m.vision
    if not v or patches <= 0:
        return 0
    block = ACT_PER_LAYER_H * v["hidden"] + ACT_PER_LAYER_I * v["intermediate"]
    if frozen:
        per = 4 * v["hidden"] + 3 * v["intermediate"]
    elif checkpointing:
        per = v["depth"] * v["hidden"] + block
    else:
        per = v["depth"] * block
    return int(patches * per * compute_bytes)


def logits_bytes(logit_tokens: float, vocab: int, *, copies: int, fused: bool) -> int:
    """The [tokens x vocab] float32 logits: copies * 4 * Rt * V; with use_fused_kernels the head runs
    a chunk of 64 MiB of float32 logits at a time: copies * min(64 MiB, 4 * Rt * V)."""
    one = 4 * logit_tokens * vocab
    return int(copies * (min(FUSED_CHUNK_BYTES, one) if fused else one))


def cpu_allocator_retained_bytes(peak_tensor_bytes: int) -> int:
    """What a CPU worker process keeps beyond its live tensors at its peak: 0.2 x the peak phase's
    tensors. glibc's malloc serves tensors up to 32 MiB from its heap once a large block has been freed
    (the mmap threshold moves up), and freed heap blocks between live ones are kept, not returned:
    the heap grows past the live tensors (bench/results/memory_plan.md: the base and the fraction fitted on
    four one-worker configurations, checked on 24 others)."""
    return int(CPU_ALLOCATOR_RETAINED * peak_tensor_bytes)


def kv_bytes_per_token(m: ModelSize, tp: int, dtype_bytes: int) -> int:
    """vLLM's KV cache per token on one TP rank: 2 (K, V) * L * max(1, kv_heads / tp) * head_dim * bytes."""
    return 2 * m.layers * max(1, m.kv_heads // tp) * m.head_dim * dtype_bytes


# ------------------------------------------------------------------------------------------------ the plan
@dataclass
class Part:
    name: str
    bytes: int
    formula: str = ""


@dataclass
class Phase:
    name: str
    parts: list[Part]
    note: str = ""

    @property
    def total(self) -> int:
        return sum(p.bytes for p in self.parts)


@dataclass
class Plan:
    device_name: str
    device_bytes: int
    phases: list[Phase]
    host: list[Part]
    notes: list[str] = field(default_factory=list)
    knobs: list[tuple[str, int]] = field(default_factory=list)  # (override, bytes saved at the peak)
    problems: list[str] = field(default_factory=list)  # e.g. a KV cache too small for one sequence
    device_assumed: bool = False  # the device's memory is the kind's usual card, not known (run then only warns)

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    @property
    def verdict(self) -> str:
        """fits / tight (< 10% headroom) / will not fit (or unknown without a device size)."""
        if self.problems or (self.device_bytes and self.peak.total > self.device_bytes):
            return "will not fit"
        if not self.device_bytes:
            return "unknown"
        return "tight" if self.peak.total > (1 - TIGHT) * self.device_bytes else "fits"

    def as_dict(self) -> dict:
        return {
            "device": self.device_name,
            "device_bytes": self.device_bytes,
            "verdict": self.verdict,
            "peak_phase": self.peak.name,
            "peak_bytes": self.peak.total,
            "phases": [
                {
                    "name": p.name,
                    "total_bytes": p.total,
                    "note": p.note,
                    "parts": [{"name": q.name, "bytes": q.bytes, "formula": q.formula} for q in p.parts],
                }
                for p in self.phases
            ],
            "host": {
                "total_bytes": sum(p.bytes for p in self.host),
                "parts": [{"name": q.name, "bytes": q.bytes, "formula": q.formula} for q in self.host],
            },
            "knobs": [{"override": k, "saves_bytes": s} for k, s in self.knobs],
            "problems": list(self.problems),
            "notes": list(self.notes),
        }
