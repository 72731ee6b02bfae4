"""Geometry3K -> RL parquet files (``train.parquet``, ``test.parquet``), plus the shared prep machinery.

Source format (Hugging Face ``hiyouga/geometry3k``): columns ``images`` (list of images),
``problem`` (str with one ``<image>`` placeholder per image) and ``answer`` (str). Sources:
the hub through ``datasets`` (imported lazily), ``--local-dataset-path`` (parquet files or a
``save_to_disk`` folder), or ``--synthetic N`` (rendered polygons, no network, see
``verl_npu.data.synthetic_geometry``).

Each output row (verl's RL schema, see docs/data_formats.md)::

    data_source   "hiyouga/geometry3k" (or "synthetic_geometry" with --synthetic)
    prompt        [{"role": "user", "content": problem + " " + INSTRUCTION}]
    images        [{"bytes": <PNG/JPEG bytes>, "path": None}, ...]
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": answer}
    extra_info    {"split", "index" (source row), "answer", "question" (problem)}

The helpers here (``SourceSplit``, ``local_splits``, ``hub_splits``, ``source_splits``,
``synthetic_splits``, ``convert_splits``, ``write_rl_parquet``, ``run_cli``, and the CLI itself:
``prep_parser``, ``prep_main``) are reused by ``verl_npu.data.gsm8k``.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from verl_npu.data import geometry3k_multiturn, synthetic_geometry
from verl_npu.errors import UserError

HUB_ID = "hiyouga/geometry3k"
SPLITS = ("train", "test")  # like verl's script, the hub's validation split is not used
SOURCE_COLUMNS = ("images", "problem", "answer")
IMAGE_PLACEHOLDER = "<image>"
INSTRUCTION = (
    "Reason about the problem first, writing your reasoning inside <think> </think> tags, "
    "then give the final answer inside \\boxed{}."
)
# The synthetic task is for tiny models trained from scratch on a CPU: every prompt token costs
# compute on every step, so it asks for the bare answer (its reward accepts a bare number or \boxed{}).
SYNTHETIC_INSTRUCTION = "Answer with the number only."

PROMPT_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
IMAGES_TYPE = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
REWARD_MODEL_TYPE = pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
EXTRA_INFO_TYPE = pa.struct(
    [("split", pa.string()), ("index", pa.int64()), ("answer", pa.string()), ("question", pa.string())]
)


class BadRow(Exception):
    """A source row that cannot be converted; the message says what is wrong with it."""


@dataclass
class SourceSplit:
    """One split of a source dataset: where it comes from and how to iterate its rows.

    ``rows()`` yields ``(where, row)``: ``where`` names the row for error messages (file and
    row number), ``row`` is a dict of the source columns.
    """

    name: str
    where: str
    num_rows: int
    rows: Callable[[], Iterator[tuple[str, dict]]]
    columns: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- sources
def _split_of_file(path: Path) -> str:
    """Split name of a source file: the file name up to the first '-' or '.', else its folder."""
    stem = path.name.split(".")[0].split("-")[0]
    if stem in ("train", "validation", "valid", "val", "test", "dev"):
        return stem
    return path.parent.name


def _read_arrow_stream(path: Path) -> pa.Table:
    """A table from a ``datasets.save_to_disk`` arrow file (arrow IPC stream format)."""
    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_file(source).read_all()


def local_splits(path: str | os.PathLike, required: tuple[str, ...], wanted: tuple[str, ...]) -> dict[str, SourceSplit]:
    """The ``wanted`` splits of a local source folder (parquet files or a ``save_to_disk`` folder).

    A file's split is its name up to the first '-' or '.' (``train-00000-of-00001.parquet`` ->
    ``train``, ``test.parquet`` -> ``test``), otherwise its folder name (``train/data-0.arrow``).

    Raises:
        UserError: the path is missing, holds no parquet/arrow files, lacks a wanted split, or a
            file lacks a required column (the message names the file and the column).
    """
    root = Path(path).expanduser()
    if not root.exists():
        raise UserError(f"--local-dataset-path {root} does not exist; give a folder with the dataset's parquet files")
    if root.is_file():
        raise UserError(
            f"--local-dataset-path {root} is a file; give the folder that holds one parquet (or arrow) file per "
            f"split, named after the split ({', '.join(wanted)})"
        )
    files = sorted(p for p in root.rglob("*") if p.suffix in (".parquet", ".arrow") and p.is_file())
    if not files:
        raise UserError(f"--local-dataset-path {root} holds no .parquet or .arrow files")
    by_split: dict[str, list[Path]] = {}
    for f in files:
        by_split.setdefault(_split_of_file(f), []).append(f)
    missing = [s for s in wanted if s not in by_split]
    if missing:
        raise UserError(
            f"--local-dataset-path {root} has no {', '.join(missing)} split (found: {', '.join(sorted(by_split))}); "
            f"name the files after their split, e.g. {missing[0]}.parquet or {missing[0]}-00000-of-00001.parquet"
        )
    splits = {}
    for name in wanted:
        split_files = by_split[name]
        num_rows = 0
        for f in split_files:
            names = _file_columns(f)
            absent = [c for c in required if c not in names]
            if absent:
                raise UserError(
                    f"{f}: missing column(s) {', '.join(repr(c) for c in absent)} (found: {', '.join(names)}); "
                    f"the source format needs columns {', '.join(required)}"
                )
            num_rows += _file_num_rows(f)
        splits[name] = SourceSplit(name, str(root), num_rows, _file_rows_iter(split_files), list(required))
    return splits


def _file_columns(path: Path) -> list[str]:
    if path.suffix == ".parquet":
        return list(pq.read_schema(path).names)
    return list(_read_arrow_stream(path).schema.names)


def _file_num_rows(path: Path) -> int:
    if path.suffix == ".parquet":
        return pq.ParquetFile(path).metadata.num_rows
    return _read_arrow_stream(path).num_rows


def _file_rows_iter(files: list[Path]) -> Callable[[], Iterator[tuple[str, dict]]]:
    def rows() -> Iterator[tuple[str, dict]]:
        for f in files:
            if f.suffix == ".parquet":
                batches = pq.ParquetFile(f).iter_batches(batch_size=64)
            else:
                batches = _read_arrow_stream(f).to_batches(max_chunksize=64)
            i = 0
            for batch in batches:
                for row in batch.to_pylist():
                    yield f"{f} row {i}", row
                    i += 1

    return rows


def _import_datasets(offline: bool):
    """``import datasets``; with ``offline`` (the hub cannot be reached) it is first imported with
    HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set, which datasets reads at import: it then loads only from
    its cache (a copy loaded before still works) and an empty cache fails at once, not after half a
    minute of retries. The environment is put back afterwards."""
    if not offline or "datasets" in sys.modules:
        import datasets  # noqa: PLC0415 - optional dependency, only for hub downloads

        return datasets
    names = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(dict.fromkeys(names, "1"))
    try:
        import datasets  # noqa: PLC0415

        return datasets
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def hub_splits(hub_id: str, wanted: tuple[str, ...], config_name: str | None = None) -> dict[str, SourceSplit]:
    """The ``wanted`` splits of a Hugging Face hub dataset, through ``datasets`` (imported here only).

    Raises:
        UserError: ``datasets`` is not installed or the hub cannot be reached.
    """
    from verl_npu.hub import unreachable_reason  # noqa: PLC0415 - only for hub downloads

    unreachable = unreachable_reason()
    try:
        datasets = _import_datasets(offline=unreachable is not None)
    except ImportError as e:
        raise UserError(
            f"loading {hub_id} from the Hugging Face hub needs the 'datasets' package ({e}); "
            f"pip install datasets, or use --local-dataset-path DIR or --synthetic N"
        ) from e
    try:
        dsd = datasets.load_dataset(hub_id, config_name) if config_name else datasets.load_dataset(hub_id)
    except Exception as e:  # network errors come in many types; all mean the same to the user
        why = f"the hub cannot be reached ({unreachable}) and the datasets cache has no copy" if unreachable \
            else f"{type(e).__name__}: {e}"
        raise UserError(
            f"could not load {hub_id} from the Hugging Face hub ({why}); "
            f"use --local-dataset-path DIR (a saved copy) or --synthetic N (no network)"
        ) from e
    out = {}
    for name in wanted:
        if name not in dsd:
            raise UserError(f"{hub_id} has no split {name!r} (found: {', '.join(dsd)})")
        ds = dsd[name]

        def rows(ds=ds, name=name) -> Iterator[tuple[str, dict]]:
            for i, row in enumerate(ds):
                yield f"{hub_id} split {name} row {i}", row

        out[name] = SourceSplit(name, f"{hub_id}[{name}]", len(ds), rows, list(ds.column_names))
    return out


def source_splits(local_dataset_path: str | os.PathLike | None, required: tuple[str, ...], wanted: tuple[str, ...],
                  hub_id: str, config_name: str | None = None) -> dict[str, SourceSplit]:
    """The ``wanted`` splits of ``local_dataset_path`` (``local_splits``) when given, else of the hub
    dataset (``hub_splits``); a UserError names a split without one of the ``required`` columns."""
    if local_dataset_path:
        return local_splits(local_dataset_path, required, wanted)
    splits = hub_splits(hub_id, wanted, config_name)
    for split in splits.values():
        absent = [c for c in required if c not in split.columns]
        if absent:
            raise UserError(f"{split.where}: missing column(s) {', '.join(absent)}")
    return splits


def memory_splits(rows_by_split: dict[str, list[dict]], where: str) -> dict[str, SourceSplit]:
    """Splits over in-memory rows (the synthetic generator's output)."""
    out = {}
    for name, rows in rows_by_split.items():

        def it(rows=rows, name=name) -> Iterator[tuple[str, dict]]:
            for i, row in enumerate(rows):
                yield f"{where} split {name} row {i}", row

        out[name] = SourceSplit(name, where, len(rows), it)
    return out


def synthetic_splits(n_train: int, n_test: int, generate: Callable[[int, str], list[dict]],
                     problem: str | None = None) -> dict[str, SourceSplit]:
    """In-memory train and test splits of a synthetic generator (`generate(rows, split)`); a UserError
    for fewer than 1 row in either, else for `problem` (the generator's own settings), before generating."""
    if n_train < 1 or n_test < 1:
        raise UserError(f"--synthetic needs at least 1 train and 1 test row (got train={n_train}, test={n_test})")
    if problem:
        raise UserError(problem)
    return memory_splits({"train": generate(n_train, "train"), "test": generate(n_test, "test")}, "synthetic")


# --------------------------------------------------------------------------- conversion

def encode_image(value: Any) -> bytes:
    """Encoded image bytes for one source image value, verified to decode.

    Accepts a PIL image (saved as PNG), ``{"bytes": ..., "path": ...}`` (the Hugging Face image
    struct: bytes kept as they are), raw bytes, or a file path.

    Raises:
        BadRow: the value is of another type, or its bytes/file do not decode as an image.
    """
    if isinstance(value, Image.Image):
        buf = io.BytesIO()
        value.save(buf, format="PNG")
        return buf.getvalue()
    data = None
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            data = value["bytes"]
        elif value.get("path"):
            value = value["path"]
    if isinstance(value, (bytes, bytearray)):
        data = bytes(value)
    if data is None and isinstance(value, (str, os.PathLike)):
        try:
            data = Path(value).read_bytes()
        except OSError as e:
            raise BadRow(f"image file {value} cannot be read ({e})") from e
    if data is None:
        raise BadRow(f"image value of type {type(value).__name__} is not an image, bytes, path or {{bytes, path}}")
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
    except Exception as e:  # PIL raises several types for corrupt data
        raise BadRow(f"image bytes do not decode ({type(e).__name__}: {e})") from e
    return data


def geometry3k_row(row: dict, split: str, index: int, data_source: str, instruction: str = INSTRUCTION) -> dict:
    """One source row (``images``, ``problem``, ``answer``) as an RL row (schema in the module doc).

    Raises:
        BadRow: problem/answer missing or empty, an image does not decode, or the number of
            ``<image>`` placeholders in the problem differs from the number of images.
    """
    problem, answer, images = row.get("problem"), row.get("answer"), row.get("images")
    if not isinstance(problem, str) or not problem.strip():
        raise BadRow(f"'problem' is empty or not a string ({problem!r})")
    if answer is None or not str(answer).strip():
        raise BadRow(f"'answer' is empty ({answer!r})")
    if images is None:
        images = []
    if not isinstance(images, (list, tuple)):
        images = [images]
    n_placeholders = problem.count(IMAGE_PLACEHOLDER)
    if n_placeholders != len(images):
        raise BadRow(
            f"'problem' has {n_placeholders} {IMAGE_PLACEHOLDER} placeholder(s) but the row has {len(images)} "
            f"image(s); each image needs exactly one {IMAGE_PLACEHOLDER} in the problem text, in order"
        )
    encoded = []
    for k, img in enumerate(images):
        try:
            encoded.append({"bytes": encode_image(img), "path": None})
        except BadRow as e:
            raise BadRow(f"image {k}: {e}") from e
    answer = str(answer).strip()
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": problem + " " + instruction}],
        "images": encoded,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": problem},
    }


def rl_schema(with_images: bool) -> pa.Schema:
    """Arrow schema of an RL parquet file (the ``images`` column only when ``with_images``)."""
    fields = [("data_source", pa.string()), ("prompt", PROMPT_TYPE)]
    if with_images:
        fields.append(("images", IMAGES_TYPE))
    fields += [("ability", pa.string()), ("reward_model", REWARD_MODEL_TYPE), ("extra_info", EXTRA_INFO_TYPE)]
    return pa.schema(fields)


def write_rl_parquet(rows: list[dict], path: str | os.PathLike, with_images: bool,
                     schema: pa.Schema | None = None) -> None:
    """Write RL rows to ``path`` with ``schema`` (default: the fixed schema of ``rl_schema``; parent folders
    created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema or rl_schema(with_images)), path)


@dataclass
class PrepResult:
    """What a prep run wrote: per split the output path, rows written, images and rows skipped."""

    paths: dict[str, str]
    rows: dict[str, int]
    images: dict[str, int]
    skipped: dict[str, int]

    def as_dict(self) -> dict:
        """``{split: path, ..., "paths": {split: path}, "rows": {...}, "images": {...}, "skipped": {...}}``."""
        return {**self.paths, "paths": self.paths, "rows": self.rows, "images": self.images, "skipped": self.skipped}

    @classmethod
    def from_dict(cls, d: dict) -> "PrepResult":
        return cls(d["paths"], d["rows"], d["images"], d["skipped"])

    def summary(self) -> str:
        lines = []
        for split, path in self.paths.items():
            skipped = f", {self.skipped[split]} bad row(s) skipped" if self.skipped[split] else ""
            lines.append(f"  {split}: {self.rows[split]} rows, {self.images[split]} images{skipped} -> {path}")
        return "wrote:\n" + "\n".join(lines)


def convert_splits(
    splits: dict[str, SourceSplit],
    convert: Callable[[dict, str, int], dict],
    save_dir: str | os.PathLike,
    with_images: bool,
    skip_bad_rows: bool = False,
    progress: bool = True,
    schema: pa.Schema | None = None,
) -> PrepResult:
    """Convert every split with ``convert(row, split, index)`` and write ``<save_dir>/<split>.parquet``
    (with ``schema``, else ``rl_schema(with_images)``).

    Raises:
        UserError: a row is bad (naming the split, file and row) and ``skip_bad_rows`` is False,
            or every row of a split is bad.
    """
    from tqdm import tqdm  # noqa: PLC0415 - only the CLI path draws a progress bar

    save_dir = Path(save_dir).expanduser()
    result = PrepResult({}, {}, {}, {})
    for name, split in splits.items():
        out_rows, skipped = [], 0
        bar = tqdm(split.rows(), total=split.num_rows, desc=f"{name}", unit="row", disable=not progress)
        for index, (where, row) in enumerate(bar):
            try:
                out_rows.append(convert(row, name, index))
            except BadRow as e:
                if not skip_bad_rows:
                    raise UserError(
                        f"bad row: split {name}, {where}: {e}. Fix the source row, or pass --skip-bad-rows to "
                        f"skip bad rows (they are counted in the summary)"
                    ) from None
                skipped += 1
        if not out_rows:
            raise UserError(f"split {name} of {split.where} has no usable rows ({skipped} bad, {split.num_rows} total)")
        path = save_dir / f"{name}.parquet"
        write_rl_parquet(out_rows, path, with_images, schema)
        result.paths[name] = str(path)
        result.rows[name] = len(out_rows)
        result.images[name] = sum(len(r.get("images") or []) for r in out_rows)
        result.skipped[name] = skipped
    return result


# --------------------------------------------------------------------------- entry points
def row_format(multiturn: str | None) -> tuple[Callable[..., dict], pa.Schema | None]:
    """(row converter, Arrow schema or None for ``rl_schema``): ``geometry3k_row``, or with ``multiturn`` (a mode
    of ``geometry3k_multiturn.MODES``) verl's multi-turn tool rows (``--multiturn``)."""
    if not multiturn:
        return geometry3k_row, None

    def to_row(row: dict, split: str, index: int, data_source: str, instruction: str = INSTRUCTION) -> dict:
        return geometry3k_multiturn.to_multiturn(geometry3k_row(row, split, index, data_source, instruction), multiturn)
    return to_row, geometry3k_multiturn.multiturn_schema(rl_schema(with_images=True), EXTRA_INFO_TYPE)


def prepare_synthetic(
    save_dir: str | os.PathLike, n_train: int, n_test: int, seed: int = 0, image_size: int = 56, progress: bool = False,
    multiturn: str | None = None,
) -> dict:
    """Write the synthetic polygon task to ``<save_dir>/{train,test}.parquet`` (data_source ``synthetic_geometry``);
    ``multiturn``: verl's multi-turn tool rows of that mode (``row_format``).

    Returns ``{"train": path, "test": path, "paths": {split: path}, "rows": {split: n},
    "images": {split: n}, "skipped": {split: 0}}``.
    """
    too_small = f"--image-size must be at least 16 pixels to draw a polygon (got {image_size})"
    splits = synthetic_splits(n_train, n_test,
                              lambda n, split: synthetic_geometry.generate_rows(n, seed, image_size, split),
                              problem=too_small if image_size < 16 else None)
    to_row, schema = row_format(multiturn)
    result = convert_splits(
        splits,
        lambda row, split, i: to_row(row, split, i, synthetic_geometry.DATA_SOURCE, SYNTHETIC_INSTRUCTION),
        save_dir,
        with_images=True,
        progress=progress,
        schema=schema,
    )
    for path in result.as_dict()["paths"].values():
        table = pq.read_table(path)
        pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}), **SYNTHETIC_MARK}), path)
    return result.as_dict()


#: parquet metadata written into synthetic polygon files: which pictures they hold. Files without it
#: (or with another value) were made by an older verl-npu whose pictures differ (`demo.py` warns).
SYNTHETIC_MARK = {b"verl_npu.synthetic_data": synthetic_geometry.GENERATOR.encode()}


def synthetic_mark(path: str | os.PathLike) -> str | None:
    """The generator recorded in a synthetic parquet file (None: none recorded)."""
    value = (pq.read_schema(path).metadata or {}).get(next(iter(SYNTHETIC_MARK)))
    return value.decode() if value is not None else None


def prepare(
    save_dir: str | os.PathLike,
    local_dataset_path: str | None = None,
    skip_bad_rows: bool = False,
    progress: bool = True,
    multiturn: str | None = None,
) -> dict:
    """Convert real Geometry3K (local copy, else the hub) to ``<save_dir>/{train,test}.parquet``
    (``multiturn``: as for ``prepare_synthetic``).

    Returns the same dict as ``prepare_synthetic``.
    """
    to_row, schema = row_format(multiturn)
    result = convert_splits(
        source_splits(local_dataset_path, SOURCE_COLUMNS, SPLITS, HUB_ID),
        lambda row, split, i: to_row(row, split, i, HUB_ID),
        save_dir,
        with_images=True,
        skip_bad_rows=skip_bad_rows,
        progress=progress,
        schema=schema,
    )
    return result.as_dict()


def existing_outputs(save_dir: str | os.PathLike) -> list[Path]:
    """The files a prep run would replace: ``<save_dir>/{train,test}.parquet`` that exist already."""
    out = Path(save_dir).expanduser()
    return [path for path in (out / "train.parquet", out / "test.parquet") if path.exists()]


def run_cli(body: Callable[[], dict], save_dir: str | os.PathLike, overwrite: bool = False) -> None:
    """Run a prep entry point: print its summary, or a UserError without a traceback and exit 1.

    Files a user already has are never replaced silently: without ``overwrite`` (``--overwrite``) a run
    whose outputs exist stops before reading anything (as ``verl-npu cp`` refuses to overwrite)."""
    try:
        existing = existing_outputs(save_dir)
        if existing and not overwrite:
            raise UserError(f"{', '.join(map(str, existing))} already exist(s); data prep does not replace files "
                            "silently. Pass --overwrite to replace them, or choose another --local-save-dir")
        result = body()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    print(PrepResult.from_dict(result).summary())


def prep_parser(prog: str, task: str, *, default_dir: str, dataset_help: str, synthetic_help: str,
                synthetic_options: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.ArgumentParser:
    """The options every data_prep CLI takes (`task`: what it writes, e.g. "GSM8K (or a synthetic
    arithmetic task)"); `synthetic_options` adds a task's own synthetic-generator options after --seed."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=f"Write {task} as RL parquet files: train.parquet, test.parquet. "
                    "verl's underscore spellings of the options are accepted too (--local_save_dir, "
                    "--local_dir, --local_dataset_path).",
    )
    p.add_argument("--local-save-dir", "--local_save_dir", "--local_dir", dest="local_save_dir",
                   default=default_dir, help=f"output folder (default: {default_dir})")
    p.add_argument("--local-dataset-path", "--local_dataset_path", dest="local_dataset_path", default=None,
                   help=dataset_help)
    p.add_argument("--synthetic", type=int, default=None, metavar="N", help=synthetic_help)
    p.add_argument("--synthetic-test", "--synthetic_test", dest="synthetic_test", type=int, default=None,
                   metavar="N", help="synthetic test rows (default: N // 4, at least 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic generator (default 0)")
    if synthetic_options is not None:
        synthetic_options(p)
    p.add_argument("--skip-bad-rows", "--skip_bad_rows", dest="skip_bad_rows", action="store_true",
                   help="skip (and count) rows that cannot be converted instead of stopping at the first")
    p.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                   help="check the options and say what would be read and written, without reading or writing")
    p.add_argument("--overwrite", action="store_true",
                   help="replace train.parquet / test.parquet if they exist (without it an existing file stops the run)")
    return p


def build_parser() -> argparse.ArgumentParser:
    def image_size(p: argparse.ArgumentParser) -> None:
        p.add_argument("--image-size", "--image_size", dest="image_size", type=int, default=56,
                       help="synthetic image side in pixels (default 56)")
        p.add_argument("--multiturn", nargs="?", const="geo3k", default=None, choices=tuple(geometry3k_multiturn.MODES),
                       help="write verl's multi-turn tool format (agent_name tool_agent, a system prompt naming the "
                            "tools, extra_info.tools_kwargs): the tools the system prompt names are verl's geo3k "
                            "answer check (geo3k, the default), the image zoom-in tool (zoom) or both; default "
                            "output folder ~/data/geo3k_multiturn_w_tool")

    return prep_parser(
        "data_prep/geometry3k.py", "Geometry3K (or a synthetic polygon task)", default_dir="~/data/geo3k",
        dataset_help="a local copy of hiyouga/geometry3k: a folder of parquet files or a save_to_disk folder",
        synthetic_help="write N synthetic train rows (rendered polygons, no network) instead of Geometry3K",
        synthetic_options=image_size)


def dry_run_plan(source: str, save_dir: str) -> str:
    """The line ``--dry-run`` prints: where the rows would come from (``source``, a verb phrase) and
    the files that would be written."""
    out = Path(save_dir).expanduser()
    return f"dry run: would {source} and write {out / 'train.parquet'}, {out / 'test.parquet'} (nothing done)"


def prep_main(args: argparse.Namespace, *, synthetic_rows: str, synthetic: Callable[[int], dict], hub: str,
              prepare_rows: Callable[[], dict]) -> None:
    """What every data_prep CLI does with its parsed `args`: `synthetic(n_test)` with --synthetic
    (`synthetic_rows` says what it makes), else `prepare_rows()` from --local-dataset-path or the hub
    (`hub`: the dataset's id), or with --dry-run only the plan."""
    if args.synthetic is not None:
        if args.local_dataset_path:
            print("error: --synthetic and --local-dataset-path exclude each other; pass one", file=sys.stderr)
            raise SystemExit(1)
        n_test = args.synthetic_test if args.synthetic_test is not None else max(1, args.synthetic // 4)
        if args.dry_run:
            plan = f"generate {args.synthetic} train / {n_test} test {synthetic_rows}"
            print(dry_run_plan(plan, args.local_save_dir))
            return
        run_cli(lambda: synthetic(n_test), args.local_save_dir, args.overwrite)
    elif args.dry_run:
        source = (f"convert the local copy {args.local_dataset_path}" if args.local_dataset_path
                  else f"download {hub} from the Hugging Face hub (needs the network and the 'datasets' package)")
        print(dry_run_plan(source, args.local_save_dir))
    else:
        run_cli(prepare_rows, args.local_save_dir, args.overwrite)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point of ``data_prep/geometry3k.py``."""
    args = build_parser().parse_args(argv)
    if args.multiturn and args.local_save_dir == "~/data/geo3k":  # verl's multi-turn tool rows
        args.local_save_dir = geometry3k_multiturn.DEFAULT_DIR
    prep_main(args, synthetic_rows=f"synthetic polygon rows (seed {args.seed}, {args.image_size} px)",
              synthetic=lambda n_test: prepare_synthetic(args.local_save_dir, args.synthetic, n_test, args.seed,
                                                         args.image_size, progress=True, multiturn=args.multiturn),
              hub=HUB_ID,
              prepare_rows=lambda: prepare(args.local_save_dir, args.local_dataset_path, args.skip_bad_rows,
                                           multiturn=args.multiturn))
