"""Geometry3K -> RL parquet files (``train.parquet``, ``test.parquet``), through ``verl_npu.data.prep``.

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

The shared prep machinery (sources, conversion, the RL schema, the CLI) is ``verl_npu.data.prep``.
"""

from __future__ import annotations

import argparse
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from verl_npu.data import geometry3k_multiturn, synthetic_geometry
from verl_npu.data.prep import (  # noqa: F401 - the shared machinery, also reached through this module
    EXTRA_INFO_TYPE,
    IMAGES_TYPE,
    PROMPT_TYPE,
    REWARD_MODEL_TYPE,
    BadRow,
    PrepResult,
    SourceSplit,
    convert_splits,
    dry_run_plan,
    existing_outputs,
    hub_splits,
    local_splits,
    memory_splits,
    prep_main,
    prep_parser,
    rl_schema,
    run_cli,
    source_splits,
    synthetic_splits,
    write_rl_parquet,
)

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
    save_dir: str | os.PathLike,
    n_train: int,
    n_test: int,
    seed: int = 0,
    image_size: int = 56,
    progress: bool = False,
    multiturn: str | None = None,
) -> dict:
    """Write the synthetic polygon task to ``<save_dir>/{train,test}.parquet`` (data_source ``synthetic_geometry``);
    ``multiturn``: verl's multi-turn tool rows of that mode (``row_format``).

    Returns ``{"train": path, "test": path, "paths": {split: path}, "rows": {split: n},
    "images": {split: n}, "skipped": {split: 0}}``.
    """
    too_small = f"--image-size must be at least 16 pixels to draw a polygon (got {image_size})"
    splits = synthetic_splits(
        n_train,
        n_test,
        lambda n, split: synthetic_geometry.generate_rows(n, seed, image_size, split),
        problem=too_small if image_size < 16 else None,
    )
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


def build_parser() -> argparse.ArgumentParser:
    def image_size(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--image-size",
            "--image_size",
            dest="image_size",
            type=int,
            default=56,
            help="synthetic image side in pixels (default 56)",
        )
        p.add_argument(
            "--multiturn",
            nargs="?",
            const="geo3k",
            default=None,
            choices=tuple(geometry3k_multiturn.MODES),
            help="write verl's multi-turn tool format (agent_name tool_agent, a system prompt naming the "
            "tools, extra_info.tools_kwargs): the tools the system prompt names are verl's geo3k "
            "answer check (geo3k, the default), the image zoom-in tool (zoom) or both; default "
            "output folder ~/data/geo3k_multiturn_w_tool",
        )

    return prep_parser(
        "data_prep/geometry3k.py",
        "Geometry3K (or a synthetic polygon task)",
        default_dir="~/data/geo3k",
        dataset_help="a local copy of hiyouga/geometry3k: a folder of parquet files or a save_to_disk folder",
        synthetic_help="write N synthetic train rows (rendered polygons, no network) instead of Geometry3K",
        synthetic_options=image_size,
    )


def main(argv: list[str] | None = None) -> None:
    """CLI entry point of ``data_prep/geometry3k.py``."""
    args = build_parser().parse_args(argv)
    if args.multiturn and args.local_save_dir == "~/data/geo3k":  # verl's multi-turn tool rows
        args.local_save_dir = geometry3k_multiturn.DEFAULT_DIR
    prep_main(
        args,
        synthetic_rows=f"synthetic polygon rows (seed {args.seed}, {args.image_size} px)",
        synthetic=lambda n_test: prepare_synthetic(
            args.local_save_dir,
            args.synthetic,
            n_test,
            args.seed,
            args.image_size,
            progress=True,
            multiturn=args.multiturn,
        ),
        hub=HUB_ID,
        prepare_rows=lambda: prepare(
            args.local_save_dir, args.local_dataset_path, args.skip_bad_rows, multiturn=args.multiturn
        ),
    )
