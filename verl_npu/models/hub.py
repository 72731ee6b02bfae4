"""Hugging Face hub ids as `actor_rollout_ref.model.path` (`Qwen/Qwen2.5-VL-7B-Instruct`).

An id is looked up in the local Hugging Face cache first (huggingface_hub's own layout and
lookup, offline: `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`). Only when
it is not there, and `HF_HUB_OFFLINE` is not set, is the hub asked (a download). When neither
works the error names the id, the cache folder looked in, and how to pre-download the model or
point the path at a local folder. A local folder of the same name always wins over an id.
"""

from __future__ import annotations

import os
from pathlib import Path

from verl_npu.errors import UserError

MODEL_KEY = "actor_rollout_ref.model.path"
_TRUE = {"1", "true", "yes", "on"}


def looks_like_hub_id(path: str) -> bool:
    """``org/name`` (one slash, no leading ``/`` ``.`` or ``~``): what the hub could serve."""
    path = str(path)
    return (not os.path.isabs(path) and not path.startswith((".", "~")) and path.count("/") == 1
            and all(part for part in path.split("/")) and "://" not in path)


def cache_dir() -> str:
    """The hub cache folder, read from the environment now (not when huggingface_hub was imported)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    return os.path.join(os.path.expanduser(os.environ.get("XDG_CACHE_HOME", "~/.cache")), "huggingface", "hub")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def cached_snapshot(repo_id: str) -> str | None:
    """The folder of `repo_id`'s cached snapshot (huggingface_hub's offline lookup), or None."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, cache_dir=cache_dir(), local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached (LocalEntryNotFoundError), or an unreadable entry
        return None


def _not_available(repo_id: str, why: str) -> UserError:
    return UserError(
        f"{MODEL_KEY} {repo_id!r} is a Hugging Face hub id, but the model is not in the local Hugging Face "
        f"cache ({cache_dir()}; set by HF_HUB_CACHE or HF_HOME) and {why}. Either download it into that cache "
        f"where the hub is reachable (`huggingface-cli download {repo_id}`, with the same HF_HOME), or download it "
        f"into a folder (`huggingface-cli download {repo_id} --local-dir DIR`) and set {MODEL_KEY}=DIR. (Meant as "
        f"a local folder? {os.path.abspath(repo_id)} does not exist.)")


def resolve_hub_id(repo_id: str) -> str:
    """The local folder of hub model `repo_id`: its cached snapshot; else, with the hub reachable
    and HF_HUB_OFFLINE unset, a fresh download into the cache; else a UserError that says so."""
    found = cached_snapshot(repo_id)
    if found is not None:
        return found
    if offline():
        raise _not_available(repo_id, "HF_HUB_OFFLINE is set, so it cannot be downloaded")
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, cache_dir=cache_dir())
    except Exception as err:  # noqa: BLE001 - no network, unknown id, gated model, ...
        text = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise _not_available(repo_id, f"downloading it failed ({type(err).__name__}: {text})") from None


def check_hub_id(repo_id: str) -> str | None:
    """For `validate --check-paths` (nothing is downloaded): None when `repo_id` is cached, or not
    cached but the hub knows it (then `run` downloads it); else the reason it cannot be had."""
    if cached_snapshot(repo_id) is not None:
        return None
    if offline():
        return str(_not_available(repo_id, "HF_HUB_OFFLINE is set, so it cannot be downloaded"))
    try:
        from huggingface_hub import HfApi

        HfApi().model_info(repo_id, timeout=10)
        return None
    except Exception as err:  # noqa: BLE001
        text = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        return str(_not_available(repo_id, f"the hub cannot be asked for it ({type(err).__name__}: {text})"))


def local_path_or_hub(path: str) -> str:
    """`path` when it is an existing local folder or not an id; else the id's local snapshot."""
    if os.path.isdir(path) or not looks_like_hub_id(path) or Path(path).exists():
        return path
    return resolve_hub_id(path)
