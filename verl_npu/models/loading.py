"""Load the policy model, tokenizer and processor named by ``actor_rollout_ref.model.path``.

Paths may be ``tiny://NAME`` (built locally by `verl_npu.models.tiny`), a local folder (``~`` is
expanded) or a Hugging Face hub id, which works only where the hub is reachable or the model is in
the local Hugging Face cache. Every mistake a user can make here (missing folder, a folder that is
not a model, a model folder without weights, tokenizer files or (vision-language) processor files,
tokenizer without a chat template, bad override key, missing external library) raises a
`UserError` naming the path or key, what is missing and how to get it.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from pathlib import Path

import torch

from verl_npu.errors import UserError
from verl_npu.hub import hub_folder, looks_like_hub_id
from verl_npu.models.tiny import is_tiny_uri, materialize

logger = logging.getLogger(__name__)

MODEL_KEY = "actor_rollout_ref.model"

# Files any of which makes a folder hold weights transformers can load.
_SINGLE_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.pt")
_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def resolve_model_path(path) -> str:
    """The local path for ``path``: ``tiny://NAME`` is materialized (built on first use) and its
    cache folder returned; a leading ``~`` is expanded; a hub id (``owner/name[@revision]``) that
    is not a local folder becomes its snapshot folder in the Hugging Face cache
    (`verl_npu.hub.hub_folder`: a UserError when it is not there and cannot be downloaded);
    anything else is returned unchanged."""
    if path is None or str(path).strip() == "":
        raise UserError(f"{MODEL_KEY}.path is empty: set it to a model folder, a hub id or tiny://qwen25vl")
    path = str(path)
    if is_tiny_uri(path):
        return str(materialize(path))
    if path.startswith("~"):
        path = os.path.expanduser(path)
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        return checkpoint_model_folder(path)
    if looks_like_hub_id(path) and not os.path.exists(path):
        folder, how = hub_folder(path, f"{MODEL_KEY}.path")
        if how == "download":
            logger.info("hub id %s downloaded to %s", path, folder)
        return str(folder)
    return path


def checkpoint_model_folder(path: str) -> str:
    """A checkpoint folder in verl's layout named as a model: an SFT run's `global_step_N/`, an RL run's
    `global_step_N/` (its `actor/`) or `global_step_N/actor/` -> its `huggingface/` folder, when that holds the full
    weights (saved with `hf_model` in checkpoint.save_contents); a UserError saying how to get them otherwise.
    Any other folder is returned unchanged (the folder checks report what it lacks)."""
    folder = os.path.join(path, "actor") if os.path.isfile(os.path.join(path, "actor", "fsdp_config.json")) else path
    hf = os.path.join(folder, "huggingface")
    if not (os.path.isfile(os.path.join(folder, "fsdp_config.json")) and os.path.isdir(hf)):
        return path
    if _has_weights(hf):
        logger.info("model path %s is a checkpoint folder: loading its huggingface/ export %s", path, hf)
        return hf
    raise UserError(
        f"model path {path} is a checkpoint folder whose huggingface/ holds no weights (the run saved only its "
        "sharded files). Fix: train with checkpoint.save_contents=[model,optimizer,extra,hf_model] (SFT) or "
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model] (RL), or merge the "
        f"shards: python -m verl.model_merger merge --backend fsdp --local_dir {folder} --target_dir <hf folder>"
    )


def _check_path_exists(path: str, original) -> None:
    """UserError when ``path`` (as `resolve_model_path` returned it) is not a local folder."""
    if os.path.isdir(path):
        return
    shown = f"{original!r}" + (f" (resolved to {path!r})" if str(original) != path else "")
    if os.path.exists(path):
        raise UserError(f"{MODEL_KEY}.path {shown} is a file; it must be a model folder (with config.json)")
    raise UserError(
        f"{MODEL_KEY}.path {shown} does not exist. Set it to a local model folder (config.json, "
        "weights, tokenizer files), a Hugging Face hub id in the local cache (owner/name), or "
        "tiny://qwen25vl / tiny://qwen2 for a tiny local model."
    )


#: keyword arguments of every model load: transformers 5.25 turned on its hub kernels by default
#: (`use_kernels`), which swap layers' forwards for kernels fetched from the Hugging Face Hub at load time: a
#: download at run time, numbers that differ from the layers verl-npu computes itself (the fused head, the
#: rollout's own decode step), and CUDA builds on other devices. Off, as with earlier transformers.
MODEL_LOAD_KWARGS = {"use_kernels": False}


def load_config(path, *, trust_remote_code: bool = False):
    """The transformers config of the model at ``path`` (resolved as in `resolve_model_path`)."""
    from transformers import AutoConfig

    local = resolve_model_path(path)
    _check_path_exists(local, path)
    if os.path.isdir(local) and not os.path.isfile(os.path.join(local, "config.json")):
        below = _model_folders_below(local)
        hint = f" Model folders below it: {', '.join(below)}." if below else ""
        raise UserError(
            f"{MODEL_KEY}.path {path!r}: the folder has no config.json, so it is not a Hugging Face "
            f"model folder (it holds: {_listing(local)}).{hint} Point the path at the folder that has config.json, "
            "or download the model into a folder of its own (`huggingface-cli download ORG/NAME --local-dir DIR`) "
            "and point the path at DIR."
        )
    try:
        return AutoConfig.from_pretrained(local, trust_remote_code=trust_remote_code)
    except ValueError as err:
        if "trust_remote_code" in str(err) or "model type" in str(err) or "model_type" in str(err):
            raise UserError(
                f"{MODEL_KEY}.path {path!r}: transformers does not know this model's architecture ({err}). "
                f"If the model ships its own code set {MODEL_KEY}.trust_remote_code=true, or import the "
                f"library that registers it with {MODEL_KEY}.external_lib."
            ) from err
        raise


def is_vision_language(model_or_config) -> bool:
    """True when the model (or its config) takes images: the config has a ``vision_config`` or its
    model_type is one transformers maps to an image-text-to-text model."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    config = getattr(model_or_config, "config", model_or_config)
    if getattr(config, "vision_config", None) is not None:
        return True
    return getattr(config, "model_type", None) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES


def load_tokenizer_and_processor(path, *, trust_remote_code: bool = False, custom_chat_template: str | None = None):
    """``(tokenizer, processor)`` for the model at ``path``; ``processor`` is None for text-only models.

    ``custom_chat_template`` (a Jinja string, or the path of a file holding one) replaces the
    tokenizer's and processor's chat template. A tokenizer left without a chat template is a
    UserError. A tokenizer without a pad token gets its eos token as pad token. A local folder is
    checked first (`check_model_folder`): config.json, weights, tokenizer files and, for a
    vision-language model, processor files; every missing part is named in one UserError.
    """
    from transformers import AutoProcessor, AutoTokenizer

    local = resolve_model_path(path)
    _check_path_exists(local, path)
    config = load_config(path, trust_remote_code=trust_remote_code)  # a folder without config.json stops here
    if os.path.isdir(local):
        check_model_folder(local, path, config, trust_remote_code=trust_remote_code)
    try:
        tokenizer = AutoTokenizer.from_pretrained(local, trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001 - OSError, ValueError ("Couldn't instantiate the backend tokenizer"), ...
        raise UserError(
            f"{MODEL_KEY}.path {path!r}: no tokenizer could be loaded from the folder ({type(err).__name__}: {err}). "
            f"It holds: {_listing(local)}. {_TOKENIZER_FIX}"
        ) from err
    if len(tokenizer) < _MIN_VOCAB:
        holds = f" (the folder holds: {_listing(local)})" if os.path.isdir(local) else ""
        raise UserError(
            f"{MODEL_KEY}.path {path!r}: the tokenizer loaded from it has {len(tokenizer)} token(s), so its "
            f"vocabulary files are missing or empty{holds}. {_TOKENIZER_FIX}"
        )

    if custom_chat_template:
        template = str(custom_chat_template)
        if "{" not in template and os.path.isfile(os.path.expanduser(template)):
            template = Path(os.path.expanduser(template)).read_text()
        tokenizer.chat_template = template
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            f"the tokenizer of {MODEL_KEY}.path {path!r} has no chat template, so prompts cannot be "
            f"rendered. Set {MODEL_KEY}.custom_chat_template to a Jinja chat template (or use the "
            "instruct/chat variant of the model, whose tokenizer ships one)."
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        logger.info("tokenizer of %s has no pad token: using eos token %r", path, tokenizer.eos_token)

    processor = None
    if is_vision_language(config):
        try:
            processor = AutoProcessor.from_pretrained(local, trust_remote_code=trust_remote_code)
        except OSError as err:
            raise UserError(
                f"{MODEL_KEY}.path {path!r} is a vision-language model ({config.model_type}) but its "
                f"processor could not be loaded ({err}). Copy the processor files "
                "(processor_config.json or preprocessor_config.json) of the base model into the folder."
            ) from err
        if getattr(processor, "image_processor", None) is None:
            processor = None  # AutoProcessor fell back to the bare tokenizer
        else:
            processor.tokenizer = tokenizer  # one tokenizer object: pad token, template as set above
            if custom_chat_template or not getattr(processor, "chat_template", None):
                processor.chat_template = tokenizer.chat_template
    return tokenizer, processor


# Files that hold a tokenizer's vocabulary (one of them is needed); `*.tiktoken` too.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.model",
)
_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
# A tokenizer with fewer tokens than this was built without its vocabulary files.
_MIN_VOCAB = 16
_TOKENIZER_FIX = (
    "Copy the tokenizer files of the model it comes from (tokenizer.json and tokenizer_config.json, or "
    "vocab.json + merges.txt; a fine-tuned checkpoint often lacks them) into the folder, or download "
    "the complete model (`huggingface-cli download ORG/NAME --local-dir DIR`)."
)


def _hub_name(folder: str) -> str:
    """The model's hub id when config.json records one (``_name_or_path``), else ``ORG/NAME``."""
    try:
        name = json.loads(Path(folder, "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        name = None
    return name if isinstance(name, str) and looks_like_hub_id(name) else "ORG/NAME"


def _has_tokenizer_files(folder: str, trust_remote_code: bool) -> bool:
    names = os.listdir(folder)
    if any(n in _TOKENIZER_FILES or n.endswith(".tiktoken") for n in names):
        return True
    # a remote-code tokenizer may keep its vocabulary elsewhere
    if trust_remote_code and "tokenizer_config.json" in names:
        try:
            return "auto_map" in json.loads(Path(folder, "tokenizer_config.json").read_text())
        except (OSError, ValueError):
            return False
    return False


def _has_weights(folder: str) -> bool:
    names = os.listdir(folder)
    return any(n in _SINGLE_WEIGHT_FILES or n in _INDEX_FILES for n in names) or any(
        n.endswith(".safetensors") for n in names
    )


def check_model_folder(folder: str, shown_path, config, *, trust_remote_code: bool = False) -> None:
    """UserError naming every part a local model folder lacks (config.json is checked before):
    weights, tokenizer files, and for a vision-language model the processor files; the message
    says how to get them. With weights listed in an index but shards missing, the error of
    `check_weights_present`."""
    missing = []
    if not _has_weights(folder):
        missing.append("weights (model.safetensors, or model-*.safetensors shards with model.safetensors.index.json)")
    if not _has_tokenizer_files(folder, trust_remote_code):
        missing.append("tokenizer files (tokenizer.json and tokenizer_config.json, or vocab.json + merges.txt)")
    if is_vision_language(config) and not any(os.path.isfile(os.path.join(folder, f)) for f in _PROCESSOR_FILES):
        missing.append(
            f"processor files (preprocessor_config.json or processor_config.json: the image settings of "
            f"this vision-language model, {config.model_type})"
        )
    if not missing:
        check_weights_present(folder, shown_path)
        return
    raise UserError(
        f"{MODEL_KEY}.path {shown_path!r} is not a complete model folder: it has config.json but no "
        + "; no ".join(missing)
        + f". The folder holds: {_listing(folder)}. Download the complete model into it "
        f"(`huggingface-cli download {_hub_name(folder)} --local-dir {folder}` adds the missing files), or copy the "
        "missing files from the model it comes from (a fine-tuned checkpoint often lacks tokenizer and processor "
        "files: copy them from its base model)."
    )


def _model_folders_below(folder: str, depth: int = 3, limit: int = 3) -> list[str]:
    """Up to ``limit`` folders under ``folder`` (at most ``depth`` levels down) that hold a config.json."""
    found: list[str] = []
    base = Path(folder)
    for current, dirs, files in os.walk(folder):
        rel_depth = len(Path(current).relative_to(base).parts)
        if rel_depth >= depth:
            dirs[:] = []
        dirs.sort()
        if rel_depth and "config.json" in files:
            found.append(current)
            if len(found) >= limit:
                break
    return found


def _listing(folder: str, limit: int = 12) -> str:
    names = sorted(os.listdir(folder))
    if not names:
        return "nothing (empty folder)"
    return ", ".join(names[:limit]) + (f", ... ({len(names)} files)" if len(names) > limit else "")


def check_weights_present(folder: str, shown_path=None) -> None:
    """UserError unless ``folder`` holds loadable weights: a single weights file, or an index file
    whose listed shards all exist. The message names the folder and the missing files."""
    shown = shown_path if shown_path is not None else folder
    if any(os.path.isfile(os.path.join(folder, f)) for f in _SINGLE_WEIGHT_FILES):
        return
    for index_name in _INDEX_FILES:
        index_path = os.path.join(folder, index_name)
        if os.path.isfile(index_path):
            try:
                shards = sorted(set(json.loads(Path(index_path).read_text())["weight_map"].values()))
            except (ValueError, KeyError) as err:
                raise UserError(f"{MODEL_KEY}.path {shown!r}: {index_name} is not a valid weight index ({err})")
            missing = [s for s in shards if not os.path.isfile(os.path.join(folder, s))]
            if not missing:
                return
            raise UserError(
                f"{MODEL_KEY}.path {shown!r}: {index_name} lists {len(shards)} weight shard(s) but "
                f"{len(missing)} are missing: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}. "
                "Copy the missing shards into the folder (an interrupted download or copy leaves this)."
            )
    if any(f.endswith(".safetensors") for f in os.listdir(folder)):
        return  # unindexed safetensors under another name: let transformers decide
    raise UserError(
        f"{MODEL_KEY}.path {shown!r} has a config but no weights: expected model.safetensors (or "
        "model-XXXXX-of-YYYYY.safetensors shards with model.safetensors.index.json, or pytorch_model.bin); "
        f"the folder holds: {_listing(folder)}. Copy the weights into it, or point the path at the "
        "complete model folder (a checkpoint's huggingface/ folder holds them)."
    )


def apply_override_config(config, override_config: dict | None) -> None:
    """Set each ``override_config`` key on ``config``. A dict value aimed at a sub-config (for
    example ``text_config``) is applied to it key by key. For a composite (vision-language) config,
    a key its ``text_config`` also has is set there too, because the text model reads it there."""
    if not override_config:
        return
    for key, value in dict(override_config).items():
        target = getattr(config, key, None)
        if isinstance(value, dict) and hasattr(target, "to_dict"):
            apply_override_config(target, value)
            continue
        try:
            setattr(config, key, value)
            text_config = getattr(config, "text_config", None)
            if text_config is not None and text_config is not config and hasattr(text_config, key):
                setattr(text_config, key, value)
        except Exception as err:  # noqa: BLE001 - strict configs raise their own validation errors
            raise UserError(
                f"{MODEL_KEY}.override_config.{key}={value!r} is rejected by the model config ({err}); "
                "fix or remove that key."
            ) from err


def master_dtype(fsdp_config) -> torch.dtype:
    """The dtype of the actor's master weights (and so of its gradients and AdamW moments): bfloat16 when
    `actor.fsdp_config.model_dtype` says bf16, else float32. The rollout side of separate_async holds its copy
    in the same dtype, so that a transfer is bit for bit."""
    return torch.bfloat16 if fsdp_config.model_dtype in ("bf16", "bfloat16") else torch.float32


def load_policy_model(
    path,
    *,
    dtype: torch.dtype,
    attn_implementation: str = "sdpa",
    override_config: dict | None = None,
    trust_remote_code: bool = False,
    external_lib: str | None = None,
    gradient_checkpointing: bool = False,
) -> torch.nn.Module:
    """Load the policy model at ``path`` in ``dtype``.

    Imports ``external_lib`` first (so it can register architectures), loads the config and
    applies ``override_config`` to it, then loads weights with the image-text-to-text auto class
    for vision-language models and the causal-LM auto class otherwise. With
    ``gradient_checkpointing`` activations are recomputed in backward (non-reentrant).
    """
    if external_lib:
        try:
            importlib.import_module(external_lib)
        except ImportError as err:
            raise UserError(
                f"{MODEL_KEY}.external_lib={external_lib!r} cannot be imported ({err}); install it or remove the key."
            ) from err

    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.utils import logging as hf_logging

    # transformers' tqdm bars ("Loading weights", later "Writing model shards" when this process
    # saves) cut through the console's log lines and tell nothing the log does not
    hf_logging.disable_progress_bar()
    local = resolve_model_path(path)
    config = load_config(path, trust_remote_code=trust_remote_code)
    if os.path.isdir(local):
        check_weights_present(local, path)
    apply_override_config(config, override_config)

    auto_class = AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM
    try:
        model = auto_class.from_pretrained(
            local,
            config=config,
            dtype=dtype,
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
            **MODEL_LOAD_KWARGS,
        )
    except (ImportError, ValueError) as err:
        if "attn" in str(err).lower() or "attention" in str(err).lower():
            raise UserError(
                f"attention implementation {attn_implementation!r} cannot be used for {path!r} here "
                f"({err}). Use 'sdpa' or 'eager' (or install the package the message names)."
            ) from err
        if "Unrecognized configuration class" in str(err):
            raise UserError(
                f"{MODEL_KEY}.path {path!r}: model type {config.model_type!r} is neither a causal LM nor an "
                "image-text-to-text model transformers knows; verl-npu trains only those."
            ) from err
        raise
    if gradient_checkpointing:
        enable_activation_checkpointing(model)
    return model


def enable_activation_checkpointing(model) -> None:
    """Recompute layer activations in backward (non-reentrant checkpointing). transformers >= 5.23
    names this ``activation_checkpointing_enable``; older releases ``gradient_checkpointing_enable``."""
    from verl_npu.models.varlen import checkpoint_context_fn

    # the recomputation of a padding-free forward must run its variable-length attention again
    kwargs = {"use_reentrant": False, "context_fn": checkpoint_context_fn}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
