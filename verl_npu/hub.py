"""Hugging Face hub ids as model paths: ``owner/name`` (optionally ``owner/name@revision``).

`hub_folder` turns an id into the local snapshot folder that huggingface_hub keeps in its cache
(``<cache>/models--owner--name/snapshots/<commit>/``, the commit named by ``refs/<revision>``):
first through huggingface_hub's own offline lookup, then, only when ``HF_HUB_OFFLINE`` is not set,
by downloading the model into that cache. When neither gives a folder it raises one `UserError`
naming the id, the cache folder looked in and how to pre-download the model. Nothing here imports
torch or transformers; huggingface_hub is imported only when an id is resolved.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from urllib.parse import urlparse

from verl_npu.errors import UserError

# owner and name as the hub spells them (letters, digits, - _ .), an optional @revision
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<rev>[\w./-]+))?$")
_TRUE = {"1", "true", "yes", "on"}


def looks_like_hub_id(value) -> bool:
    """True when ``value`` is a string shaped like ``owner/name`` or ``owner/name@revision``: one
    slash, not starting with ``/``, ``.`` or ``~``, no ``://``, no ``..`` or ``--`` in a part."""
    if not isinstance(value, str) or "://" in value:
        return False
    match = _HUB_ID.match(value)
    return bool(match) and ".." not in match["repo"] and "--" not in match["repo"]


def cache_dir() -> Path:
    """The hub cache folder, read from the environment now (huggingface_hub reads it once, at
    import): ``$HF_HUB_CACHE``, else ``$HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set to a true value: no download is tried."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def unreachable_reason(timeout: float = 3.0) -> str | None:
    """Why the hub cannot be reached now, or None when a TCP connection to it opens within
    ``timeout`` seconds. The host is ``$HF_ENDPOINT``'s (default huggingface.co). huggingface_hub
    and datasets retry a dead network for half a minute before failing; this answers in seconds."""
    if offline():
        return "HF_HUB_OFFLINE is set"
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = url.hostname or "huggingface.co"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        return f"no connection to {host}:{port} within {timeout:g} s ({type(err).__name__}: {err})"
    return None


class HubIdMissing(UserError):
    """A hub id that is neither in the cache nor downloadable: `what` went wrong, `advice` fixes it."""

    def __init__(self, model_id: str, key: str, reason: str):
        self.what = (
            f"{model_id!r} is not a local folder, and the Hugging Face hub id is not in the cache "
            f"{cache_dir()} ({reason})"
        )
        self.advice = download_advice(model_id)
        super().__init__(f"{key}: {self.what}. {self.advice}")


def cached_folder(model_id) -> Path | None:
    """The snapshot folder of hub id ``model_id`` when the cache holds it, else None (also for a
    value that is not a hub id); never downloads, never raises."""
    if not looks_like_hub_id(model_id):
        return None
    from huggingface_hub import snapshot_download

    match = _HUB_ID.match(model_id)
    try:
        return Path(
            snapshot_download(match["repo"], revision=match["rev"], cache_dir=cache_dir(), local_files_only=True)
        )
    except Exception:  # noqa: BLE001 - not (completely) in the cache
        return None


def hub_folder(model_id: str, key: str = "actor_rollout_ref.model.path") -> tuple[Path, str]:
    """``(snapshot folder, how it was found)`` for hub id ``model_id`` (``owner/name[@revision]``),
    ``how`` being ``"cache"`` or ``"download"``. Raises `HubIdMissing` (naming ``key``, the id, the
    cache folder and the fix) when the cache lacks it and it cannot be downloaded."""
    from huggingface_hub import snapshot_download

    match = _HUB_ID.match(model_id)
    if match is None:
        raise UserError(f"{key}: {model_id!r} is not a Hugging Face hub id (owner/name)")
    cached = cached_folder(model_id)
    if cached is not None:
        return cached, "cache"
    if offline():
        raise HubIdMissing(model_id, key, "HF_HUB_OFFLINE is set, so it was not downloaded")
    unreachable = unreachable_reason()
    if unreachable is not None:
        raise HubIdMissing(model_id, key, f"the hub cannot be reached: {unreachable}")
    try:
        return Path(snapshot_download(match["repo"], revision=match["rev"], cache_dir=cache_dir())), "download"
    except Exception as err:  # noqa: BLE001 - network, auth, unknown repo: all end in the same advice
        first = str(err).splitlines()[0] if str(err) else ""
        raise HubIdMissing(model_id, key, f"downloading it failed: {type(err).__name__}: {first}") from None


def download_advice(model_id: str) -> str:
    """How to make ``model_id`` resolvable: pre-download it into the cache, or use a local folder."""
    repo = model_id.split("@", 1)[0]
    rev = f" --revision {model_id.split('@', 1)[1]}" if "@" in model_id else ""
    return (
        f"Download it first on a machine that reaches the hub, with the same HF_HOME "
        f"(`hf download {repo}{rev}` or `huggingface-cli download {repo}{rev}`), "
        "or set the key to a local model folder."
    )
