"""Assets of demo recipes, made on first use: tiny local models and synthetic data.

Rule: `run` never writes into a folder the user named. Synthetic data (the same thing
`python data_prep/geometry3k.py --synthetic N --local-save-dir DIR` writes for tiny://qwen25vl;
`DEMO_DATA` says which task each tiny model gets) is made only when
- the model is a `tiny://` model (a demo recipe), and
- the missing file is a shipped demo recipe's own default path for that model (for `tiny_geo3k`:
  `data/tiny_geo3k/train.parquet` or `data/tiny_geo3k/test.parquet`, relative to the current
  folder; overriding only the other file keeps the demo's own), or `verl-npu run --demo-data` asks
  for it explicitly;
and even then only the missing files are written: an existing file is never replaced or renamed.
Any other missing data file is left to the path check, which stops the run with the same error as
`verl-npu validate --check-paths` (naming the key and the file).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verl_npu.config import RecipeConfig

log = logging.getLogger("verl_npu")

DEMO_TRAIN_ROWS = 512
DEMO_TEST_ROWS = 64

#: tiny model -> (module, function, extra keyword arguments, what it writes): the synthetic data of
#: its demos. The function is called as ``fn(save_dir, n_train, n_test, seed=..., **kwargs)``, writes
#: ``train.parquet`` / ``test.parquet`` and returns a dict with ``"paths": {"train", "test"}``
#: (as ``verl_npu.data.geometry3k.prepare_synthetic`` does). A model without an entry, or whose
#: function does not exist, gets no data made up.
DEMO_DATA = {
    "qwen25vl": ("verl_npu.data.geometry3k", "prepare_synthetic", {"image_size": 56}, "synthetic geometry data"),
    "qwen2": ("verl_npu.data.gsm8k", "prepare_synthetic", {}, "synthetic arithmetic data"),
}
#: the same for recipes with multi-turn rollout (actor_rollout_ref.rollout.multi_turn.enable): verl's
#: multi-turn format (a system prompt, extra_info.tools_kwargs for the GSM8K / geo3k tool)
DEMO_DATA_MULTI_TURN = {
    "qwen2": ("verl_npu.data.gsm8k_multiturn", "prepare_synthetic", {}, "synthetic multi-turn arithmetic data"),
    "qwen25vl": (
        "verl_npu.data.geometry3k",
        "prepare_synthetic",
        {"image_size": 56, "multiturn": "both"},
        "synthetic multi-turn geometry data (the zoom-in and geo3k tools)",
    ),
}

#: the same for multi-turn recipes with interactions (multi_turn.interaction_config_path): the grid-environment
#: episodes of the CPU environment demo (tiny_grid_env: 3x3 FrozenLake corner maps)
DEMO_DATA_INTERACTION = {
    "qwen2": ("verl_npu.data.grid_env", "prepare_synthetic", {}, "synthetic grid-environment episodes")
}

#: multi-turn recipes with the search tool (tiny_search_r1) get none made: their questions must match the
#: corpus the retrieval server already serves, so both come first from data_prep/search_r1.py (the path
#: check names a missing file and that script)
DEMO_DATA_SEARCH: dict = {}


def _uses_search_tool(tool_config_path) -> bool:
    from verl_npu.tool_registry import read_tool_config

    entries, _ = read_tool_config(tool_config_path) if tool_config_path else ([], [])
    return any(e.queries_retrieval_server for e in entries)


def _tool_demo_data(tool_config_path) -> str:
    """ "module:function" of the demo data of the first built-in tool in the tool config that has its own
    (`demo_data` on its registry spec: the tool demo's lookup task), else ''."""
    from verl_npu.tool_registry import read_tool_config

    entries, _ = read_tool_config(tool_config_path) if tool_config_path else ([], [])
    return next((e.demo_data for e in entries if e.demo_data), "")


def _data_writer(
    model_path: str, multi_turn: bool = False, interaction: bool = False, search: bool = False, tool_data: str = ""
):
    """(function, kwargs, label) that writes the demo data of tiny model ``model_path``, or None; `tool_data`
    ("module:function", a tool's own demo data) comes first for a multi-turn recipe."""
    import importlib

    from verl_npu.models.tiny import parse_tiny_uri

    if multi_turn and tool_data:
        module, _, name = tool_data.partition(":")
        return getattr(importlib.import_module(module), name), {}, f"synthetic tool-task data ({tool_data})"
    table = (
        DEMO_DATA_SEARCH
        if search
        else DEMO_DATA_INTERACTION
        if interaction
        else DEMO_DATA_MULTI_TURN
        if multi_turn
        else DEMO_DATA
    )
    try:
        entry = table.get(parse_tiny_uri(str(model_path))[0])
    except Exception:  # noqa: BLE001 - a bad tiny path is reported when the model loads
        return None
    if entry is None:
        return None
    module, name, kwargs, label = entry
    fn = getattr(importlib.import_module(module), name, None)
    return (fn, kwargs, label) if callable(fn) else None


def _resolved(path) -> str:
    return os.path.abspath(os.path.expanduser(str(path)))


def demo_data_paths() -> list[tuple[str, str, str]]:
    """(model, train file, val file) of every shipped demo recipe (a `tiny://` model, one train and
    one val file), the files resolved against the current folder as a run would resolve them."""
    import yaml

    from verl_npu.config.recipes import list_recipes
    from verl_npu.data import as_file_list
    from verl_npu.models.tiny import is_tiny_uri

    pairs = []
    for info in list_recipes():
        try:
            backend = (yaml.safe_load(info.path.read_text()) or {}).get("backend_config") or {}
            model = ((backend.get("actor_rollout_ref") or {}).get("model") or {}).get("path")
            data = backend.get("data") or {}
            train, val = as_file_list(data.get("train_files") or []), as_file_list(data.get("val_files") or [])
        except Exception:  # noqa: BLE001 - a recipe that does not parse is no demo
            continue
        if is_tiny_uri(model) and len(train) == 1 and len(val) == 1:
            pairs.append((str(model), _resolved(train[0]), _resolved(val[0])))
    return pairs


def may_make_demo_data(rc: RecipeConfig, demo_data: bool = False) -> bool:
    """True when `run` may write synthetic data to the recipe's train/val files: a `tiny://`
    model, one train and one val file, and either `demo_data` (the `--demo-data` flag) or the
    model and files are a shipped demo recipe's own."""
    from verl_npu.data import as_file_list
    from verl_npu.models.tiny import is_tiny_uri

    data = rc.typed.data
    model = str(rc.typed.actor_rollout_ref.model.path)
    if not is_tiny_uri(model):
        return False
    train, val = as_file_list(data.train_files or []), as_file_list(data.val_files or [])
    if len(train) != 1 or len(val) != 1:
        return False
    return demo_data or (model, _resolved(train[0]), _resolved(val[0])) in demo_data_paths()


def prepare_assets(rc: RecipeConfig, demo_data: bool = False) -> list[str]:
    """Make what a demo recipe needs (see the module docstring); returns a line per thing made.
    Nothing is made for a recipe whose model is not a `tiny://` model."""
    from verl_npu.data import as_file_list
    from verl_npu.models.tiny import is_tiny_uri, materialize

    data = rc.typed.data
    model_path = str(rc.typed.actor_rollout_ref.model.path)
    if not is_tiny_uri(model_path):
        return []
    made = []
    train, val = as_file_list(data.train_files or []), as_file_list(data.val_files or [])
    wanted = [(f, split) for files, split in ((train, "train"), (val, "test")) for f in files]
    missing = [(Path(os.path.expanduser(f)), split) for f, split in wanted if not Path(os.path.expanduser(f)).exists()]
    if missing:
        mt = rc.typed.actor_rollout_ref.rollout.multi_turn
        enabled = bool(mt.enable)
        writer = _data_writer(
            model_path,
            multi_turn=enabled,
            interaction=enabled and bool(mt.get("interaction_config_path")),
            search=enabled and _uses_search_tool(mt.get("tool_config_path")),
            tool_data=_tool_demo_data(mt.get("tool_config_path")) if enabled else "",
        )
        if not may_make_demo_data(rc, demo_data):  # only the files that are a demo's own are made
            own = {
                (train_or_val, path)
                for m, *paths in demo_data_paths()
                if m == model_path
                for train_or_val, path in zip(("train", "test"), paths)
            }
            missing = [(p, split) for p, split in missing if (split, _resolved(p)) in own]
        if writer is None or not missing:
            return []  # the path check names the missing file(s); nothing is written
        made.append(_write_missing(missing, int(data.seed if data.seed is not None else 0), writer))
    _warn_if_old_demo_data([f for f, _ in wanted], model_path, rc)
    made.append(f"tiny model {model_path} at {materialize(model_path)}")
    for line in made:
        log.info("demo assets: %s", line)
    return made


def _warn_if_old_demo_data(files: list[str], model_path: str, rc) -> None:
    """A shipped picture demo's own data files made by an older verl-npu (their pictures differ, and
    `run` never replaces a file) get a warning that says how to have them made again."""
    from verl_npu.models.tiny import parse_tiny_uri

    if parse_tiny_uri(model_path)[0] != "qwen25vl" or not may_make_demo_data(rc):
        return
    from verl_npu.data.geometry3k import synthetic_mark
    from verl_npu.data.synthetic_geometry import GENERATOR

    for f in files:
        path = Path(os.path.expanduser(f))
        try:
            mark = synthetic_mark(path)
        except Exception:  # noqa: BLE001 - not a parquet file: the dataset reports it
            continue
        if mark != GENERATOR:
            log.warning(
                "%s was made by an older verl-npu (%s; now: %s): its pictures differ from what the demo "
                "expects, and run never replaces a data file. Delete %s to have it made again.",
                path,
                mark or "no generator recorded",
                GENERATOR,
                path.parent,
            )


def _write_missing(missing: list[tuple[Path, str]], seed: int, writer) -> str:
    """Synthetic data for each missing (file, split), generated aside and moved into place; files
    that appeared in the meantime are left alone."""
    fn, kwargs, label = writer
    first = missing[0][0]
    first.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".verl_npu_demo_", dir=first.parent))
    try:
        result = fn(scratch, DEMO_TRAIN_ROWS, DEMO_TEST_ROWS, seed=seed, **kwargs)
        for path, split in missing:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                shutil.move(str(result["paths"][split]), str(path))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    names = ", ".join(str(p.absolute()) for p, _ in missing)
    return f"{label}: {names} ({DEMO_TRAIN_ROWS} train / {DEMO_TEST_ROWS} test rows)"


#: the synthetic data of SFT recipes with a tiny:// model: tool-call transcripts (verl_npu.data.sft_synthetic)
DEMO_DATA_SFT = ("verl_npu.data.sft_synthetic", "prepare_synthetic", {}, "synthetic tool-call transcripts")
#: shipped SFT recipes whose data is another task's: recipe name -> the same 4-tuple
DEMO_DATA_SFT_OF_RECIPE = {
    "tiny_lookup_sft": ("verl_npu.data.tool_lookup", "prepare_sft", {}, "synthetic lookup-tool transcripts")
}


def prepare_sft_assets(rc, demo_data: bool = False) -> list[str]:
    """The same rule as `prepare_assets`, for an SFT recipe (`verl_npu.config.sft.SFTRecipe`): missing data files
    are written only for a `tiny://` model whose files are a shipped SFT recipe's own (or with `demo_data`),
    one train and at most one val file; an existing file is never replaced."""
    import importlib

    import yaml

    from verl_npu.config.recipes import list_recipes
    from verl_npu.config.sft import is_sft_tree
    from verl_npu.data import as_file_list
    from verl_npu.models.tiny import is_tiny_uri, materialize

    data, model = rc.typed.data, str(rc.typed.model.path)
    if not is_tiny_uri(model):
        return []
    train, val = as_file_list(data.train_files or []), as_file_list(data.val_files or [])
    wanted = [(f, "train") for f in train] + [(f, "test") for f in val]
    missing = [(Path(os.path.expanduser(f)), split) for f, split in wanted if not Path(os.path.expanduser(f)).exists()]
    made = []
    if missing and len(train) == 1 and len(val) <= 1:
        own, entry = demo_data, DEMO_DATA_SFT
        for info in list_recipes():
            raw = yaml.safe_load(info.path.read_text()) or {}
            if is_sft_tree(raw):
                files = raw["backend_config"].get("data") or {}
                if {_resolved(f) for f in as_file_list(files.get("train_files") or [])} == {_resolved(train[0])}:
                    own, entry = True, DEMO_DATA_SFT_OF_RECIPE.get(info.name, DEMO_DATA_SFT)
        if own:
            module, fn, kwargs, label = entry
            writer = (getattr(importlib.import_module(module), fn), kwargs, label)
            made.append(_write_missing(missing, int(rc.typed.trainer.seed), writer))
    made.append(f"tiny model {model} at {materialize(model)}")
    for line in made:
        log.info("demo assets: %s", line)
    return made
