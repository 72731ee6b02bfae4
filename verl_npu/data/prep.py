"""The data-prep machinery every `data_prep/*.py` task shares: source splits (a local folder of parquet
files or a `save_to_disk` folder, the Hugging Face hub through `datasets`, rows made in memory), converting
them row by row into verl's RL parquet schema (`convert_splits`, `write_rl_parquet`, `rl_schema`), and the
command line every task takes (`prep_parser`, `prep_main`, `run_cli`). A task module (`geometry3k`,
`gsm8k`, ...) supplies its row converter and its sources.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from verl_npu.errors import UserError

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
        why = (
            f"the hub cannot be reached ({unreachable}) and the datasets cache has no copy"
            if unreachable
            else f"{type(e).__name__}: {e}"
        )
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


def source_splits(
    local_dataset_path: str | os.PathLike | None,
    required: tuple[str, ...],
    wanted: tuple[str, ...],
    hub_id: str,
    config_name: str | None = None,
) -> dict[str, SourceSplit]:
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


def synthetic_splits(
    n_train: int, n_test: int, generate: Callable[[int, str], list[dict]], problem: str | None = None
) -> dict[str, SourceSplit]:
    """In-memory train and test splits of a synthetic generator (`generate(rows, split)`); a UserError
    for fewer than 1 row in either, else for `problem` (the generator's own settings), before generating."""
    if n_train < 1 or n_test < 1:
        raise UserError(f"--synthetic needs at least 1 train and 1 test row (got train={n_train}, test={n_test})")
    if problem:
        raise UserError(problem)
    return memory_splits({"train": generate(n_train, "train"), "test": generate(n_test, "test")}, "synthetic")


# --------------------------------------------------------------------------- conversion


def rl_schema(with_images: bool) -> pa.Schema:
    """Arrow schema of an RL parquet file (the ``images`` column only when ``with_images``)."""
    fields = [("data_source", pa.string()), ("prompt", PROMPT_TYPE)]
    if with_images:
        fields.append(("images", IMAGES_TYPE))
    fields += [("ability", pa.string()), ("reward_model", REWARD_MODEL_TYPE), ("extra_info", EXTRA_INFO_TYPE)]
    return pa.schema(fields)


def write_rl_parquet(
    rows: list[dict], path: str | os.PathLike, with_images: bool, schema: pa.Schema | None = None
) -> None:
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
    def from_dict(cls, d: dict) -> PrepResult:
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
            raise UserError(
                f"{', '.join(map(str, existing))} already exist(s); data prep does not replace files "
                "silently. Pass --overwrite to replace them, or choose another --local-save-dir"
            )
        result = body()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    print(PrepResult.from_dict(result).summary())


def add_source_options(
    p: argparse.ArgumentParser, *, default_dir: str, dataset_help: str, synthetic_help: str, dir_help: str | None = None
) -> None:
    """Adds the options that say where a data_prep CLI reads and writes: --local-save-dir (`dir_help`, by default
    the folder `default_dir`), --local-dataset-path, --synthetic N, --synthetic-test N and --seed."""
    p.add_argument(
        "--local-save-dir",
        "--local_save_dir",
        "--local_dir",
        dest="local_save_dir",
        default=default_dir,
        help=dir_help or f"output folder (default: {default_dir})",
    )
    p.add_argument(
        "--local-dataset-path", "--local_dataset_path", dest="local_dataset_path", default=None, help=dataset_help
    )
    p.add_argument("--synthetic", type=int, default=None, metavar="N", help=synthetic_help)
    p.add_argument(
        "--synthetic-test",
        "--synthetic_test",
        dest="synthetic_test",
        type=int,
        default=None,
        metavar="N",
        help="synthetic test rows (default: N // 4, at least 1)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic generator (default 0)")


def add_dry_run_option(p: argparse.ArgumentParser) -> None:
    """Adds --dry-run: the options are checked and the plan printed, nothing read or written."""
    p.add_argument(
        "--dry-run",
        "--dry_run",
        dest="dry_run",
        action="store_true",
        help="check the options and say what would be read and written, without reading or writing",
    )


def prep_parser(
    prog: str,
    task: str,
    *,
    default_dir: str,
    dataset_help: str,
    synthetic_help: str,
    synthetic_options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.ArgumentParser:
    """The options every data_prep CLI takes (`task`: what it writes, e.g. "GSM8K (or a synthetic
    arithmetic task)"); `synthetic_options` adds a task's own synthetic-generator options after --seed."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=f"Write {task} as RL parquet files: train.parquet, test.parquet. "
        "verl's underscore spellings of the options are accepted too (--local_save_dir, "
        "--local_dir, --local_dataset_path).",
    )
    add_source_options(p, default_dir=default_dir, dataset_help=dataset_help, synthetic_help=synthetic_help)
    if synthetic_options is not None:
        synthetic_options(p)
    p.add_argument(
        "--skip-bad-rows",
        "--skip_bad_rows",
        dest="skip_bad_rows",
        action="store_true",
        help="skip (and count) rows that cannot be converted instead of stopping at the first",
    )
    add_dry_run_option(p)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace train.parquet / test.parquet if they exist (without it an existing file stops the run)",
    )
    return p


def dry_run_plan(source: str, save_dir: str) -> str:
    """The line ``--dry-run`` prints: where the rows would come from (``source``, a verb phrase) and
    the files that would be written."""
    out = Path(save_dir).expanduser()
    return f"dry run: would {source} and write {out / 'train.parquet'}, {out / 'test.parquet'} (nothing done)"


def prep_main(
    args: argparse.Namespace,
    *,
    synthetic_rows: str,
    synthetic: Callable[[int], dict],
    hub: str,
    prepare_rows: Callable[[], dict],
) -> None:
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
        source = (
            f"convert the local copy {args.local_dataset_path}"
            if args.local_dataset_path
            else f"download {hub} from the Hugging Face hub (needs the network and the 'datasets' package)"
        )
        print(dry_run_plan(source, args.local_save_dir))
    else:
        run_cli(prepare_rows, args.local_save_dir, args.overwrite)
