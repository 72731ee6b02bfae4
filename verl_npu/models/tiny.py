"""Tiny random-init models built locally, addressed as ``tiny://NAME`` model paths.

Nothing is downloaded: the tokenizer is a small byte-level BPE trained here on a built-in
corpus, the weights are random with a fixed seed (0, or ``N`` for ``tiny://NAME?seed=N``). Three
models exist:

- ``tiny://qwen25vl``: a Qwen2.5-VL (vision tower + text decoder) with a
  ``Qwen2_5_VLProcessor``; the CPU demo's model.
- ``tiny://qwen2``: a Qwen2 causal LM with the same text sizes and tokenizer.
- ``tiny://qwen2rm``: a Qwen2 sequence-classification model (one label: a reward model), same sizes and tokenizer.

Other sizes of the same model: any integer size key of ``TEXT_SIZES`` (and, for qwen25vl, of
``VISION_SIZES``; ``vision_hidden_size`` / ``vision_intermediate_size`` for the tower's) in the query,
e.g. ``tiny://qwen2?seed=1&num_hidden_layers=1&hidden_size=64`` (a smaller student for distillation). The
tokenizer, and so the vocabulary, is the same whatever the sizes.

A built folder is a normal Hugging Face model folder (``config.json``, ``model.safetensors``,
``generation_config.json``, tokenizer and, for the VL model, processor files) that plain
``transformers`` ``Auto*`` classes load.

Why the vocabulary is small (512): the CPU demo trains a random-init model with RL and its
first sampled tokens are close to uniform over the vocabulary; with 151k entries it would
never emit a useful token by chance.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path

from verl_npu.errors import UserError

logger = logging.getLogger(__name__)

TINY_SCHEME = "tiny://"

# Bump when anything that changes the built files changes: it is part of the cache folder name.
BUILD_VERSION = 1

# Every Qwen2.5 special token, in Qwen's order. They are appended after the BPE vocabulary
# (as in Qwen, where they follow the 151,643 regular tokens).
QWEN25_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)

VOCAB_SIZE = 512  # regular BPE tokens + the 22 special tokens
PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"

# ChatML as Qwen uses it, written for this project. A message's content is a string or a list of
# parts; an image part ({"type": "image"} or any part with an "image" key) becomes the vision
# placeholder that the processor later expands to one <|image_pad|> per merged patch.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'video' or 'video' in part -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}"
    "{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

# Pre-tokenizer split: the same pattern (and NFC normalizer) that transformers' Qwen2Tokenizer
# installs. transformers may load a folder with model_type "qwen2" through that class, which rebuilds
# the pipeline; using the identical split keeps tokens the same whichever class loads the folder.
# Digits are split one by one, so each digit 0-9 is one token and numbers are digit sequences.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TEXT_SIZES = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
}
VISION_SIZES = {
    "depth": 2,
    "hidden_size": 64,
    "num_heads": 2,
    "intermediate_size": 128,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
}
IMAGE_MIN_PIXELS = 56 * 56
IMAGE_MAX_PIXELS = 224 * 224


def is_tiny_uri(s) -> bool:
    """True when ``s`` is a string starting with ``tiny://``."""
    return isinstance(s, str) and s.startswith(TINY_SCHEME)


def parse_tiny_uri(uri: str) -> tuple[str, int, dict[str, int]]:
    """``(name, seed, sizes)`` of ``tiny://NAME`` (seed 0, the default sizes) or
    ``tiny://NAME?seed=N&KEY=V&...``: ``seed`` is the seed of the random initial weights (N a
    non-negative integer), every other ``KEY`` an integer size key of the model (see `tiny_sizes`)
    with V a positive integer; ``sizes`` holds those overrides only.

    Raises:
        UserError: ``uri`` is not a tiny path, names no known tiny model, has a malformed or unknown
            query key, or sizes the model cannot have (`tiny_sizes`).
    """
    if not is_tiny_uri(uri):
        raise UserError(f"{uri!r} is not a tiny model path; expected one of: {_known_uris()}")
    name, _, query = uri[len(TINY_SCHEME) :].partition("?")
    name = name.strip("/")
    if name not in TINY_BUILDERS:
        raise UserError(f"unknown tiny model {uri!r}; known tiny models: {_known_uris()}")
    seed, sizes = 0, {}
    for item in query.split("&") if query else []:
        key, _, value = item.partition("=")
        if key == "seed" and value.isdigit():
            seed = int(value)
        elif key != "seed" and key in _integer_size_keys(name) and value.isdigit() and int(value) > 0:
            sizes[key] = int(value)
        else:
            raise UserError(
                f"tiny model path {uri!r}: bad option {item!r}. Options: the weight seed, written "
                f"{TINY_SCHEME}{name}?seed=N with N a non-negative integer (e.g. {TINY_SCHEME}{name}?seed=1), and "
                f"sizes KEY=V with V a positive integer, joined by '&' (e.g. {TINY_SCHEME}{name}?seed=1&"
                f"num_hidden_layers=1&hidden_size=64); size keys: {', '.join(_integer_size_keys(name))}"
            )
    tiny_sizes(name, sizes)  # refuses sizes the model cannot have, before anything is built
    return name, seed, sizes


def tiny_sizes(name: str, overrides: dict | None = None) -> tuple[dict, dict | None]:
    """The text and vision sizes (vision: None for the text-only models) of tiny model ``name`` with
    ``overrides`` applied (`_split_sizes`).

    Raises:
        UserError: an unknown key, or a hidden size not divisible into the attention heads, or query
            heads not divisible into key/value heads (text model or vision tower).
    """
    text, vision = _split_sizes(overrides or {}, TEXT_SIZES, VISION_SIZES if name == "qwen25vl" else {})
    problems = []
    if text["hidden_size"] % text["num_attention_heads"]:
        problems.append(
            f"hidden_size {text['hidden_size']} is not a multiple of num_attention_heads {text['num_attention_heads']}"
        )
    if text["num_attention_heads"] % text["num_key_value_heads"]:
        problems.append(
            f"num_attention_heads {text['num_attention_heads']} is not a multiple of "
            f"num_key_value_heads {text['num_key_value_heads']}"
        )
    if vision and vision["hidden_size"] % vision["num_heads"]:
        problems.append(
            f"vision_hidden_size {vision['hidden_size']} is not a multiple of num_heads {vision['num_heads']}"
        )
    if problems:
        raise UserError(f"tiny model {TINY_SCHEME}{name}: {'; '.join(problems)}; change the sizes in the path's query")
    return text, vision or None


def _integer_size_keys(name: str) -> list[str]:
    """The size keys a ``tiny://NAME`` query may set: the integer ones of the model's size tables."""
    text = [k for k, v in TEXT_SIZES.items() if isinstance(v, int)]
    if name != "qwen25vl":
        return text
    return text + [f"vision_{k}" if k in TEXT_SIZES else k for k, v in VISION_SIZES.items() if isinstance(v, int)]


# ----------------------------------------------------------------------------- corpus + tokenizer

_INSTRUCTION = (
    "Reason step by step before you answer. Put your reasoning between <think> and </think> tags, "
    "then write the final answer inside \\boxed{}."
)
_SHAPES = [
    "triangle",
    "square",
    "rectangle",
    "pentagon",
    "hexagon",
    "circle",
    "polygon",
    "rhombus",
    "trapezoid",
    "parallelogram",
    "quadrilateral",
    "octagon",
    "shape",
    "figure",
]
_PARTS = [
    "side",
    "sides",
    "angle",
    "angles",
    "radius",
    "diameter",
    "area",
    "perimeter",
    "length",
    "height",
    "base",
    "vertex",
    "vertices",
    "edge",
    "diagonal",
    "chord",
    "arc",
    "segment",
    "line",
    "point",
    "center",
    "midpoint",
    "hypotenuse",
    "leg",
    "measure",
    "value",
]
_SENTENCES = [
    "How many sides does the {shape} in the picture have?",
    "The figure shows a regular {shape}. How many sides does it have?",
    "Count the sides of the shaded shape. How many are there?",
    "Find the {part} of the {shape} if each side is {a} and the height is {b}.",
    "In the {shape} ABCD, the {part} is {a}. What is x?",
    "Find x. Round to the nearest tenth if necessary.",
    "The {part} of triangle ABC is {a} and angle B measures {b} degrees. Find the {part} of AC.",
    "Solve for y when {a} x + {b} = {c}.",
    "If the {part} equals {a}, what is the {part} of the {shape}?",
    "What is the sum of the interior angles of a {shape}?",
    "Use the diagram to find the value of x in the {shape}.",
    "The answer is {a}. The {shape} has {n} sides, so the answer is {n}.",
    "Let me count the corners of the {shape}: there are {n} of them.",
    "Therefore the {part} is $\\frac{{{a}}}{{{b}}}$ and x = {c}.",
    "So $\\sqrt{{{a}}} \\times {b} = {c}$ and $\\angle ABC = {b}^\\circ$.",
    "The area is $\\pi r^2 = {a} \\pi$ and $\\triangle ABC \\cong \\triangle DEF$.",
    "Since $x^2 + y^2 = {c}$, we get $x = \\sqrt{{{a}}}$ and $\\sin \\theta = \\frac{{1}}{{2}}$.",
]


def _training_corpus() -> list[str]:
    """The built-in tokenizer corpus: geometry problems with numbers, the reasoning/answer format,
    chat-template role words and LaTeX bits. A pure function (fixed seed) so builds repeat."""
    rng = random.Random(1234)
    lines: list[str] = []
    for _ in range(1500):
        template = rng.choice(_SENTENCES)
        lines.append(
            template.format(
                shape=rng.choice(_SHAPES),
                part=rng.choice(_PARTS),
                a=rng.randint(1, 999),
                b=rng.randint(1, 180),
                c=round(rng.uniform(0, 100), 1),
                n=rng.randint(3, 8),
            )
        )
    for _ in range(300):
        n = rng.randint(0, 99)
        lines.append(f"<think> The {rng.choice(_SHAPES)} has {n} {rng.choice(_PARTS)}. </think> \\boxed{{{n}}}")
        lines.append(_INSTRUCTION)
        lines.append(f"system\nuser\n{rng.choice(_SENTENCES).split('{')[0]}\nassistant\n")
    lines.append(" ".join(str(d) for d in range(10)))
    return lines


def build_tokenizer(out_dir: str | Path | None = None):
    """Train the tiny byte-level BPE (``VOCAB_SIZE`` tokens incl. the Qwen2.5 special tokens at the
    end) and wrap it as a transformers fast tokenizer with the ChatML chat template; pad is
    ``<|endoftext|>``, eos is ``<|im_end|>``, no BOS is added. Saved to ``out_dir`` when given."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(QWEN25_SPECIAL_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: any text round-trips
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer=trainer)
    tok.add_special_tokens(list(QWEN25_SPECIAL_TOKENS))

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=TEXT_SIZES["max_position_embeddings"],
        padding_side="left",  # prompts are left-padded for generation
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    if out_dir is not None:
        hf_tok.save_pretrained(str(out_dir))
    return hf_tok


def _token_ids(tokenizer) -> dict[str, int]:
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN25_SPECIAL_TOKENS}
    assert all(isinstance(i, int) and i >= 0 for i in ids.values()), ids
    return ids


# ----------------------------------------------------------------------------- model builders


def _save_model(model, out_dir: Path, ids: dict[str, int]) -> None:
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        bos_token_id=ids[PAD_TOKEN], eos_token_id=[ids[EOS_TOKEN], ids[PAD_TOKEN]], pad_token_id=ids[PAD_TOKEN]
    )
    model.save_pretrained(str(out_dir), safe_serialization=True)


def _seeded_init(seed: int, make_model):
    """Build a model with torch's global RNG seeded, without disturbing the caller's RNG."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = make_model()
    return model.float().eval()


def build_tiny_qwen25vl(out_dir: str | Path, *, seed: int = 0, **size_overrides) -> Path:
    """Write a tiny random-init Qwen2.5-VL model folder to ``out_dir`` and return it.

    Sizes are ``TEXT_SIZES`` / ``VISION_SIZES`` (head_dim 32, mrope_section [4, 6, 6], vision
    out_hidden_size = text hidden size) with word embeddings tied; ``size_overrides`` replaces
    any of those keys (text or vision). The folder holds the weights (safetensors), config,
    generation config, tokenizer and a ``Qwen2_5_VLProcessor`` (``Qwen2VLImageProcessor`` with
    min_pixels 56x56, max_pixels 224x224, patch 14, merge 2).
    """
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    text, vision = _split_sizes(size_overrides, TEXT_SIZES, VISION_SIZES)
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    tokenizer = build_tokenizer()
    ids = _token_ids(tokenizer)

    pixel_kwargs = dict(
        min_pixels=IMAGE_MIN_PIXELS,
        max_pixels=IMAGE_MAX_PIXELS,
        patch_size=vision["patch_size"],
        merge_size=vision["spatial_merge_size"],
        temporal_patch_size=vision["temporal_patch_size"],
    )
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(**pixel_kwargs),
        video_processor=Qwen2VLVideoProcessor(**pixel_kwargs),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(out_dir))

    rope_theta = text.pop("rope_theta")
    config = Qwen2_5_VLConfig(
        text_config=dict(
            **text,
            vocab_size=len(tokenizer),
            hidden_act="silu",
            rope_parameters={
                "rope_type": "default",
                "rope_theta": rope_theta,
                "mrope_section": _mrope_section(head_dim),
            },
            bos_token_id=ids[PAD_TOKEN],
            eos_token_id=ids[EOS_TOKEN],
            pad_token_id=ids[PAD_TOKEN],
            tie_word_embeddings=True,
        ),
        vision_config=dict(
            **vision,
            out_hidden_size=text["hidden_size"],
            fullatt_block_indexes=[vision["depth"] - 1],  # last block attends globally, as in Qwen
            hidden_act="silu",
            in_channels=3,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    # Qwen's configs also carry these ids at the top level; some loaders read them from there.
    config.bos_token_id = ids[PAD_TOKEN]
    config.eos_token_id = ids[EOS_TOKEN]
    config.pad_token_id = ids[PAD_TOKEN]
    model = _seeded_init(seed, lambda: Qwen2_5_VLForConditionalGeneration(config))
    _save_model(model, out_dir, ids)
    return out_dir


def _tiny_qwen2_config(out_dir: str | Path, size_overrides: dict, **extra):
    """``out_dir`` (created, with the shared tokenizer written to it), a Qwen2Config of ``TEXT_SIZES``
    with ``size_overrides`` applied and ``extra`` fields set, and the tokenizer's special ids: what
    the text LM and the reward model builders share."""
    from transformers import Qwen2Config

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    text, _ = _split_sizes(size_overrides, TEXT_SIZES, {})
    tokenizer = build_tokenizer(out_dir)
    ids = _token_ids(tokenizer)
    rope_theta = text.pop("rope_theta")
    config = Qwen2Config(
        **text,
        vocab_size=len(tokenizer),
        hidden_act="silu",
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        bos_token_id=ids[PAD_TOKEN],
        eos_token_id=ids[EOS_TOKEN],
        pad_token_id=ids[PAD_TOKEN],
        **extra,
    )
    return out_dir, config, ids


def build_tiny_qwen2(out_dir: str | Path, *, seed: int = 0, **size_overrides) -> Path:
    """Write a tiny random-init Qwen2 causal LM folder (``TEXT_SIZES``, tied embeddings, the same
    tokenizer as the VL model) to ``out_dir`` and return it; ``size_overrides`` replaces text sizes."""
    from transformers import Qwen2ForCausalLM

    out_dir, config, ids = _tiny_qwen2_config(out_dir, size_overrides, tie_word_embeddings=True)
    model = _seeded_init(seed, lambda: Qwen2ForCausalLM(config))
    _save_model(model, out_dir, ids)
    return out_dir


def _split_sizes(overrides: dict, text_defaults: dict, vision_defaults: dict) -> tuple[dict, dict]:
    """Apply ``overrides`` to copies of the text / vision size dicts; an unknown key is a UserError.
    A key present in both (``hidden_size``, ``intermediate_size``) can be aimed at the vision tower
    with a ``vision_`` prefix; without the prefix it means the text model."""
    text, vision = dict(text_defaults), dict(vision_defaults)
    for key, value in overrides.items():
        if key.startswith("vision_") and key[len("vision_") :] in vision:
            vision[key[len("vision_") :]] = value
        elif key in text:
            text[key] = value
        elif key in vision:
            vision[key] = value
        else:
            known = sorted(set(text) | {f"vision_{k}" if k in text else k for k in vision})
            raise UserError(f"unknown tiny model size key {key!r}; known keys: {', '.join(known)}")
    return text, vision


def _mrope_section(head_dim: int) -> list[int]:
    """Split head_dim/2 rotary frequencies over (time, height, width) like Qwen's [16, 24, 24]
    (1/4, 3/8, 3/8): [4, 6, 6] for head_dim 32."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def build_tiny_qwen2_rm(out_dir: str | Path, *, seed: int = 0, **size_overrides) -> Path:
    """Write a tiny random-init Qwen2 sequence-classification model (a reward model: one label,
    ``TEXT_SIZES``, the same tokenizer as the other tiny models) to ``out_dir`` and return it."""
    import torch
    from transformers import Qwen2ForSequenceClassification

    out_dir, config, _ = _tiny_qwen2_config(out_dir, size_overrides, num_labels=1)
    model = _seeded_init(seed + 1, lambda: Qwen2ForSequenceClassification(config))
    with torch.no_grad():  # random init gives scores near 0: spread them so tests can tell rows apart
        model.score.weight.mul_(20.0)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


# ----------------------------------------------------------------------------- cache

TINY_BUILDERS = {"qwen25vl": build_tiny_qwen25vl, "qwen2": build_tiny_qwen2, "qwen2rm": build_tiny_qwen2_rm}


def default_cache_dir() -> Path:
    """``$VERL_NPU_CACHE`` or ``~/.cache/verl_npu``."""
    return Path(os.environ.get("VERL_NPU_CACHE") or Path.home() / ".cache" / "verl_npu").expanduser()


def build_hash(name: str, seed: int = 0, sizes: dict | None = None) -> str:
    """12 hex chars identifying what a build of ``name`` contains: the build version, sizes (the
    defaults with ``sizes`` applied), seed and the transformers/tokenizers versions (which decide
    the file formats)."""
    import tokenizers
    import transformers

    text, vision = tiny_sizes(name, sizes)
    recipe = {
        "build_version": BUILD_VERSION,
        "name": name,
        "seed": seed,
        "text": text,
        "vision": vision,
        "vocab": VOCAB_SIZE,
        "pixels": [IMAGE_MIN_PIXELS, IMAGE_MAX_PIXELS],
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def materialize(uri: str, cache_dir: str | Path | None = None) -> Path:
    """Return the local folder of the tiny model ``uri`` (``tiny://qwen25vl``, ``tiny://qwen2`` or
    ``tiny://qwen2rm``, optionally with ``?seed=N`` for other random initial weights and size keys for
    other sizes: `parse_tiny_uri`), building it first if the cache lacks it.

    The folder is ``<cache_dir or default_cache_dir()>/tiny/<name>-<build_hash(name, seed, sizes)>/``. A build goes
    into a private temporary sibling folder that is then renamed into place, so the final folder
    exists only complete; when another process renamed its build first, that one is used and ours
    is discarded.
    """
    name, seed, sizes = parse_tiny_uri(uri)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    final = root / "tiny" / f"{name}-{build_hash(name, seed, sizes)}"
    if (final / "config.json").is_file():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.building-", dir=final.parent))
    except OSError as err:
        where = "VERL_NPU_CACHE" if cache_dir is None and os.environ.get("VERL_NPU_CACHE") else "the cache folder"
        raise UserError(
            f"cannot build the tiny model {uri}: {where} {root} is not writable ({err.strerror or err}); "
            "set VERL_NPU_CACHE to a writable folder (e.g. VERL_NPU_CACHE=/tmp/verl_npu_cache)"
        ) from None
    logger.info("building tiny model %s into %s (once; later runs reuse it)", uri, final)
    try:
        TINY_BUILDERS[name](tmp, seed=seed, **sizes)
        (tmp / "verl_npu_tiny.json").write_text(
            json.dumps(
                {
                    "uri": uri,
                    "seed": seed,
                    "sizes": sizes,
                    "build_hash": build_hash(name, seed, sizes),
                    "build_version": BUILD_VERSION,
                }
            )
            + "\n"
        )
        try:
            os.rename(tmp, final)
        except OSError as err:
            if not (final / "config.json").is_file():
                raise UserError(
                    f"cannot put the tiny model build into {final} ({err}); the folder exists but is "
                    "incomplete (not made by verl-npu?): delete it and run again"
                ) from err
            # another process finished first: use its folder, drop ours (finally below)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _known_uris() -> str:
    return ", ".join(TINY_SCHEME + n for n in TINY_BUILDERS)
