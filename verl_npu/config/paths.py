"""Checks of what the config names on disk (`verl-npu validate --check-paths`, and `verl-npu run`
before anything starts): data files, model folders (hub ids resolved first), the custom reward
file, the LoRA adapter folder, and the tool / interaction classes the multi-turn files name
(`class_check`, in a separate process). A model path is checked only where the run reads it (the critic's
when a critic is trained, the reward model's when it is enabled). What this machine lacks
(`machine_problems`: an engine package, an unreachable hub or retrieval server) `run` refuses and
`validate` only warns about.
"""

from __future__ import annotations

import functools
import os
import re
import socket
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from verl_npu.config import (  # noqa: F401 - register their rules
    rules_async,
    rules_dapo,
    rules_distill,
    rules_multiturn,
    rules_profiler,
    rules_reward_norm,
    rules_roles,
    rules_rollout_corr,
    rules_vllm,
)
from verl_npu.config.class_check import agent_loop_class_problems, class_problems
from verl_npu.config.row_files import row_file_problem
from verl_npu.config.tree import BC, get
from verl_npu.errors import Problem
from verl_npu.registry import ROLES, RoleSpec


def _role_needed(spec: RoleSpec, cfg: Any) -> bool:
    return spec.needed(cfg["backend_config"])


#: keys that name a model folder: a local folder, a tiny:// model or a hub id (data.tokenizer is refused unless null)
MODEL_PATH_KEYS = (
    BC + "actor_rollout_ref.model.path",
    BC + "critic.model.path",
    BC + "reward_model.model.path",
    rules_distill.TEACHER_PATH,
)
#: model path keys the run reads only in some configs: path key -> "is it read?" (on the whole config)
_MODEL_PATH_USED_IF: dict[str, Callable[[Any], bool]] = {
    BC + spec.model_key: functools.partial(_role_needed, spec)
    for spec in ROLES.specs.values()
    if spec.model_key and "always" not in spec.needed_when
}
#: model path keys whose folder must hold a particular kind of model (checked by the role's rules)
_MODEL_KIND_CHECKED = (BC + "reward_model.model.path",)


def _model_path_keys(cfg) -> list[str]:
    return [k for k in MODEL_PATH_KEYS if k not in _MODEL_PATH_USED_IF or _MODEL_PATH_USED_IF[k](cfg)]


def resolve_hub_ids(rc, skip: AbstractSet[str] = frozenset()) -> list[Problem]:
    """Replace every hub id (`owner/name[@revision]`) among the `MODEL_PATH_KEYS` values that is not
    a local folder by its snapshot folder in the Hugging Face cache (downloaded there when the hub
    is reachable and HF_HUB_OFFLINE is not set), in `rc.cfg` itself, so that workers and the rollout
    engine load that folder; each replacement is recorded in `rc.derived` (`rc.set_derived`) with the id. Returns a
    Problem for each id that could not be resolved. Keys in `skip` (already refused, e.g. by
    `machine_problems`) are not looked up again."""
    from verl_npu.hub import HubIdMissing, hub_folder, looks_like_hub_id

    problems: list[Problem] = []
    for key in _model_path_keys(rc.cfg):
        if key in skip:
            continue
        value = get(rc.cfg, key)
        if not looks_like_hub_id(value) or Path(os.path.expanduser(value)).is_dir():
            continue
        try:
            folder, how = hub_folder(value, key.removeprefix(BC))
        except HubIdMissing as err:
            problems.append(Problem(key, err.what, err.advice))
            continue
        where = "found in the Hugging Face cache" if how == "cache" else "downloaded into the Hugging Face cache"
        rc.set_derived(key, str(folder), f"hub id {value} {where}")
    return problems


#: the data_prep command that writes each shipped demo's data folder (the synthetic rows `run` makes
#: itself for a demo recipe's own paths), and the one that converts rows of other formats
DEMO_DATA_COMMANDS = {
    "data/tiny_geo3k": "python data_prep/geometry3k.py --synthetic 512 --local-save-dir data/tiny_geo3k",
    "data/tiny_gsm8k": "python data_prep/gsm8k.py --synthetic 512 --local-save-dir data/tiny_gsm8k",
    "data/tiny_geo3k_tool": "python data_prep/geometry3k.py --synthetic 512 --multiturn both "
    "--local-save-dir data/tiny_geo3k_tool",
    "data/tiny_tool_gsm8k": "python data_prep/gsm8k_multiturn_w_tool.py --synthetic 512 "
    "--local-save-dir data/tiny_tool_gsm8k",
    "data/tiny_code_tool": "python data_prep/gsm8k_multiturn_w_tool.py --synthetic 512 "
    "--local-save-dir data/tiny_code_tool",
    "data/tiny_grid_env": "python data_prep/grid_env.py --synthetic 512 --local-save-dir data/tiny_grid_env",
    "data/tiny_search_r1": "python data_prep/search_r1.py --synthetic 64 --local-save-dir data/tiny_search_r1",
}


def _make_data_fix(rc, key: str) -> str:
    """How to get the data file of `key`: the exact data_prep command for a shipped demo's folder,
    else the general advice."""
    value = get(rc.cfg, key)
    for item in value if isinstance(value, list) else [value]:
        folder = Path(os.path.abspath(os.path.expanduser(str(item)))).parent
        for demo, command in DEMO_DATA_COMMANDS.items():
            if folder == Path(os.path.abspath(demo)):
                return f"make it with `{command}` (from {Path.cwd()}), or fix the path"
    return (
        "point the key at a file in verl's row format (parquet, .jsonl, .json or .csv), made by one of the "
        "data_prep/*.py scripts (each has --help and --synthetic N), or fix the path"
    )


def check_paths(rc, skip: AbstractSet[str] = frozenset()) -> list[Problem]:
    """Problems for data files, the model folder, the custom reward file and the LoRA adapter folder
    (model.lora_adapter_path: adapter_config.json in it) that do not exist. Hub ids among the model
    paths are first resolved to local folders (`resolve_hub_ids`, which changes `rc.cfg`); `tiny://`
    model paths are built locally and are skipped; `~` is expanded as verl does. Keys in `skip` (problems
    already reported for them) are not checked again."""
    b = BC
    problems = resolve_hub_ids(rc, skip)
    bad = {p.key for p in problems} | set(skip)
    checks: list[tuple[str, Any, str]] = [
        (b + "data.train_files", get(rc.cfg, b + "data.train_files"), "file"),
        (b + "data.val_files", get(rc.cfg, b + "data.val_files"), "file"),
        *((key, get(rc.cfg, key), "model") for key in _model_path_keys(rc.cfg) if key not in bad),
        (b + "custom_reward_function.path", get(rc.cfg, b + "custom_reward_function.path"), "file"),
        (
            b + "actor_rollout_ref.model.lora_adapter_path",
            get(rc.cfg, b + "actor_rollout_ref.model.lora_adapter_path"),
            "adapter",
        ),
    ]
    for key, value, kind in checks:
        if key in skip:
            continue
        for item in value if isinstance(value, list) else [value]:
            if item is None:
                continue
            if kind == "model" and str(item).startswith("tiny://"):  # built locally: only its kind is checked
                if key in _MODEL_KIND_CHECKED:
                    problems += rules_roles.tiny_model_problems(key, str(item))
                continue
            if re.match(r"^[a-z]+://", str(item)):
                problems.append(
                    Problem(
                        key,
                        f"{item!r}: remote paths are not supported yet",
                        "copy the files to a local folder and point the key at them",
                    )
                )
                continue
            path = Path(os.path.expanduser(str(item)))
            if kind == "model" and not path.is_dir():
                problems.append(
                    Problem(
                        key,
                        f"model folder {item!r} does not exist",
                        "set it to a local model folder or a Hugging Face hub id (owner/name)",
                    )
                )
            elif kind == "model" and key in _MODEL_KIND_CHECKED:
                problems += rules_roles.model_folder_problems(key, path)
            elif kind == "adapter" and not (path / "adapter_config.json").is_file():
                problems.append(
                    Problem(
                        key,
                        f"{item!r} is not a peft adapter folder (no adapter_config.json)",
                        "name a folder written by peft's save_pretrained, e.g. a checkpoint's "
                        "actor/huggingface/lora_adapter",
                    )
                )
            elif kind == "file" and not path.is_file():
                problems.append(
                    Problem(
                        key,
                        f"file {item!r} ({path.resolve()}) does not exist (relative paths "
                        f"start at the current folder, {Path.cwd()})",
                        _make_data_fix(rc, key),
                    )
                )
            elif kind == "file" and key.startswith(b + "data."):
                needed = (
                    get(rc.cfg, b + "data.prompt_key") or "prompt",
                    get(rc.cfg, b + "data.reward_fn_key") or "data_source",
                    "reward_model",
                )
                why = row_file_problem(path, tuple(needed))
                if why:
                    problems.append(Problem(key, f"data file {item!r} {why}", _make_data_fix(rc, key)))
    files = (
        rules_multiturn.tool_config_problems(rc.cfg)
        + rules_multiturn.function_tool_problems(rc.cfg)
        + rules_multiturn.interaction_config_problems(rc.cfg)
        + rules_multiturn.agent_loop_config_problems(rc.cfg)
    )
    # the classes those files name, imported in a process of their own (files with problems left out)
    return (
        problems
        + files
        + class_problems(rc.cfg, skip={p.key for p in files})
        + agent_loop_class_problems(rc.cfg, skip={p.key for p in files})
    )


def machine_problems(rc) -> tuple[list[Problem], list[str]]:
    """What this machine lacks for the run, found without loading anything: ``(problems, notes)``.

    Problems: the rollout engine's package is not installed (vLLM, looked up without importing it);
    a model hub id is neither in the Hugging Face cache nor downloadable (the hub cannot be reached,
    or HF_HUB_OFFLINE is set). Notes: a hub id that is not cached but will be downloaded on the
    first run. `run` refuses the problems before any model loads; `validate` prints them as warnings
    (a config can be valid for another machine)."""
    from verl_npu.hub import HubIdMissing, cached_folder, looks_like_hub_id, unreachable_reason
    from verl_npu.registry import ROLLOUT_ENGINES

    problems: list[Problem] = []
    notes: list[str] = []
    key = BC + "actor_rollout_ref.rollout.name"
    name = get(rc.cfg, key)
    engine = ROLLOUT_ENGINES.find(name)
    missing = engine.missing_package() if engine is not None else None
    if missing is not None:
        problems.append(Problem(key, f"{name!r}: {missing.split('; ', 1)[0]}", missing.split("; ", 1)[1]))
    unreachable: str | None = None
    probed = False
    for path_key in _model_path_keys(rc.cfg):
        value = get(rc.cfg, path_key)
        if not looks_like_hub_id(value) or Path(os.path.expanduser(value)).is_dir() or cached_folder(value):
            continue
        if not probed:  # one connection attempt, however many model keys need the hub
            unreachable, probed = unreachable_reason(), True
        if unreachable:
            err = HubIdMissing(value, path_key.removeprefix(BC), f"the hub cannot be reached: {unreachable}")
            problems.append(Problem(path_key, err.what, err.advice))
        else:
            notes.append(
                f"{path_key.removeprefix(BC)}: hub id {value} is not in the Hugging Face cache; "
                "the run downloads it first"
            )
    return problems + retrieval_server_problems(rc.cfg), notes


#: seconds to wait for a retrieval server to accept a connection
RETRIEVAL_PROBE_S = 3.0


def retrieval_server_problems(cfg) -> list[Problem]:
    """A search tool (multi-turn tool config) whose retrieval_service_url does not accept a connection:
    one problem at multi_turn.tool_config_path naming the file, the entry's key, the URL and the command
    that starts verl-npu's server. Only a TCP connection is tried; nothing is sent."""
    from urllib.parse import urlsplit

    from verl_npu.tool_registry import read_tool_config

    key = BC + "actor_rollout_ref.rollout.multi_turn.tool_config_path"
    path = get(cfg, key)
    if not path or not get(cfg, BC + "actor_rollout_ref.rollout.multi_turn.enable"):
        return []
    entries, _ = read_tool_config(path)  # the file's own problems are check_paths'
    problems = []
    for entry in entries:
        url = entry.config.get("retrieval_service_url") if entry.queries_retrieval_server else None
        if not isinstance(url, str):
            continue
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname or "127.0.0.1", port), timeout=RETRIEVAL_PROBE_S).close()
            continue
        except OSError as err:
            reason = err.strerror or str(err) or type(err).__name__
        problems.append(
            Problem(
                key,
                f"{path}: {entry.where.split(': ', 1)[-1]}.config.retrieval_service_url {url!r}: the retrieval "
                f"server cannot be reached ({reason})",
                f"start it first: verl-npu retrieval-server --corpus <corpus.jsonl> --port {port} (for the synthetic "
                "Search-R1 data: python data_prep/search_r1.py --synthetic 64 --local-save-dir data/tiny_search_r1, "
                "then --corpus data/tiny_search_r1/corpus.jsonl), or point retrieval_service_url at a running server",
            )
        )
    return problems
