"""Data files in verl's row format, in the formats people have: parquet, JSON Lines, JSON, CSV.

A row is what verl's data_prep scripts write: `prompt` (the chat messages), `data_source`,
`reward_model` (`ground_truth`), optionally `extra_info`, `images`, `agent_name`... The format
is told by the file's suffix: `.jsonl` (one JSON object a line), `.json` (a list of objects), `.csv`
(a header row; a cell holding a JSON list or object, such as the prompt's messages, is decoded), and
anything else is read as parquet. `row_file_problem` is the cheap check that `validate
--check-paths` runs; `read_rows` reads a text format (the dataset makes a table of them). Stdlib
only: the config layer imports nothing heavy.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

#: suffix -> format; any other suffix is parquet
TEXT_FORMATS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv"}
PARQUET_MAGIC = b"PAR1"


def file_format(path: str | Path) -> str:
    return TEXT_FORMATS.get(Path(path).suffix.lower(), "parquet")


def _cell(value: str):
    """A CSV cell: a JSON list / object decoded (the prompt's messages, reward_model), else the text."""
    text = value.strip()
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except ValueError:
            return value
    return value


def read_rows(path: str | Path, limit: int | None = None) -> list[dict]:
    """The rows of a JSONL, JSON or CSV file (at most `limit`). Raises ValueError naming the line
    (JSONL) or saying what the file holds instead of a list of objects."""
    fmt = file_format(path)
    rows: list[dict] = []
    with open(path, encoding="utf-8", newline="") as fh:
        if fmt == "csv":
            for row in csv.DictReader(fh):
                rows.append({k: _cell(v or "") for k, v in row.items() if k is not None})
                if limit is not None and len(rows) >= limit:
                    break
        elif fmt == "jsonl":
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"line {number} is not JSON ({exc})") from None
                if not isinstance(row, dict):
                    raise ValueError(f"line {number} is not a JSON object")
                rows.append(row)
                if limit is not None and len(rows) >= limit:
                    break
        else:
            data = json.load(fh)
            if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
                raise ValueError("it does not hold a JSON list of row objects")
            rows = data[:limit] if limit is not None else data
    return rows


def row_file_problem(path: str | Path, needed: tuple[str, ...]) -> str | None:
    """Why `path` cannot be read as rows with the columns `needed`, or None (read cheaply: the
    parquet footer's magic bytes, or the first row of a text format)."""
    path = Path(path)
    fmt = file_format(path)
    if fmt == "parquet":
        try:
            with open(path, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(0, size - 4))
                tail = fh.read(4)
        except OSError as exc:
            return f"cannot be read ({exc.strerror})"
        if tail != PARQUET_MAGIC:
            return (
                "is not a parquet file (name it .jsonl, .json or .csv if it is one of those: verl-npu reads them too)"
            )
        return None
    try:
        first = read_rows(path, limit=1)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return f"is not a readable {fmt.upper()} file of rows: {exc}"
    if not first:
        return f"has no rows ({fmt.upper()})"
    missing = [c for c in needed if c not in first[0]]
    if missing:
        return (
            f"has no column {', '.join(repr(c) for c in missing)} (columns: {', '.join(map(str, first[0]))}): "
            f"each row needs verl's row format (prompt messages, data_source, reward_model.ground_truth)"
        )
    return None
