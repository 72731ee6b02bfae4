"""The RL dataset: RL parquet rows -> left-padded prompt token ids (+ images) for the trainer.

For row ``i`` (after optional filtering), ``RLDataset[i]`` does:

1. Read the chat messages in ``data.prompt_key``. A message content string is split at each
   ``<image>`` placeholder; the k-th placeholder becomes the content part ``{"type": "image"}``
   standing for the k-th image of ``data.image_key`` (text between placeholders becomes
   ``{"type": "text"}`` parts). Placeholder count != image count is a UserError.
2. Resize each image with qwen-vl-utils' ``smart_resize`` (both sides multiples of
   ``patch_size * merge_size``, pixel count within ``data.min_pixels``..``data.max_pixels``;
   unset limits fall back to the image processor's own) and convert it to RGB.
3. Render the messages with the model's own chat template (``add_generation_prompt=True``) and
   run the processor on the text and the resized images (no second resize), which expands each
   image placeholder to one image token per merged patch. The prompt length counts those tokens.
4. Longer than ``data.max_prompt_length``: ``truncation=error`` raises a UserError naming the row
   and its length; ``left`` keeps the last tokens, ``right`` the first, ``middle`` the first
   ``max // 2`` and the last ``max - max // 2``. A cut that would remove any image token is a
   UserError (the images would no longer match their tokens). With
   ``data.filter_overlong_prompts`` such rows are dropped when the dataset is built instead.
5. Left-pad to ``max_prompt_length`` with ``tokenizer.pad_token_id`` (attention mask 0 there).
"""

from __future__ import annotations

import io
import logging
import multiprocessing as mp
import os
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from verl_npu.config.row_files import file_format, read_rows
from verl_npu.config.typed import section
from verl_npu.data.images import ImageResizer
from verl_npu.errors import UserError

logger = logging.getLogger(__name__)

IMAGE_PLACEHOLDER = "<image>"
TRUNCATION_MODES = ("error", "left", "right", "middle")
# Processor outputs aligned with the token sequence: they are not per-image inputs, and padding
# or truncation would misalign them (the model code rebuilds mm_token_type_ids from input_ids).
SEQUENCE_ALIGNED_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")
#: the image check (`RLDataset.check_images`) draws a progress bar above this many rows
CHECK_PROGRESS_MIN_ROWS = 1000
#: bad rows listed one by one in the image check's error (the count covers them all)
MAX_LISTED_PROBLEMS = 10


def data_settings(data_cfg: Any):
    """The typed `data` section the dataset reads (verl names and meanings): `data_cfg` as it is when
    typed, else a dict / OmegaConf node whose missing keys take the schema's defaults.

    Raises:
        UserError: ``truncation`` is not a known mode or a length/pixel limit is not positive.
    """
    s = section("data", data_cfg)
    if s.truncation not in TRUNCATION_MODES:
        raise UserError(f"data.truncation={s.truncation!r} is not one of {', '.join(TRUNCATION_MODES)}")
    if s.max_prompt_length < 1:
        raise UserError(f"data.max_prompt_length must be >= 1 (got {s.max_prompt_length})")
    for key in ("min_pixels", "max_pixels"):
        v = s[key]
        if v is not None and v < 1:
            raise UserError(f"data.{key} must be a positive pixel count or null (got {v})")
    if s.min_pixels is not None and s.max_pixels is not None and s.min_pixels > s.max_pixels:
        raise UserError(f"data.min_pixels ({s.min_pixels}) is larger than data.max_pixels ({s.max_pixels})")
    return s


def as_file_list(files: Any) -> list[str]:
    if isinstance(files, (str, os.PathLike)):
        return [str(files)]
    try:
        return [str(f) for f in files]
    except TypeError:
        raise UserError(f"data files must be a path or a list of paths (got {files!r})") from None


def _decode_image(value: Any, where: str, k: int):
    """A PIL image from a parquet image value ({bytes, path}, bytes, a path, or a PIL image)."""
    from PIL import Image  # noqa: PLC0415

    if isinstance(value, Image.Image):
        return value
    if isinstance(value, dict):
        value = value.get("bytes") if value.get("bytes") is not None else value.get("path")
    try:
        if isinstance(value, (bytes, bytearray)):
            img = Image.open(io.BytesIO(value))
        elif isinstance(value, (str, os.PathLike)):
            img = Image.open(value)
        else:
            raise TypeError(f"unsupported image value of type {type(value).__name__}")
        img.load()
        return img
    except Exception as e:  # PIL raises several types for corrupt data
        raise UserError(f"{where}: image {k} cannot be decoded ({type(e).__name__}: {e}); re-run data prep") from e


def truncate_ids(ids: torch.Tensor, max_len: int, mode: str) -> torch.Tensor:
    """``ids`` cut to ``max_len`` tokens: ``left`` keeps the end, ``right`` the start, ``middle`` both ends."""
    if ids.numel() <= max_len:
        return ids
    if mode == "left":
        return ids[-max_len:]
    if mode == "right":
        return ids[:max_len]
    if mode == "middle":
        head = max_len // 2
        return torch.cat([ids[:head], ids[ids.numel() - (max_len - head) :]])
    raise ValueError(f"unknown truncation mode {mode!r}")


class RLDataset:
    """RL parquet file(s) -> per-row model inputs (see the module docstring for each step).

    ``ds[i]`` returns ``input_ids`` / ``attention_mask`` (LongTensor [max_prompt_length], left
    padded), ``raw_prompt_ids`` (the unpadded ids, image tokens expanded), ``data_source``,
    ``ground_truth`` (``reward_model.ground_truth`` as stored: a string, number, list, dict..., as verl
    passes it to ``compute_score``), ``extra_info``, ``index`` (the row's position in the concatenated files,
    before filtering), ``multi_modal_inputs`` (processor outputs such as ``pixel_values`` and
    ``image_grid_thw``; ``{}`` for text rows), ``multi_modal_data`` (``{"image": [PIL]}``, the
    resized images; only rows with images) and ``raw_prompt`` (the messages, if
    ``data.return_raw_chat``).

    Raises:
        UserError: a file is missing or not parquet; a column (prompt, data_source, reward_model,
            or the image column for prompts with ``<image>``) is missing; ``data.video_key``
            names a column with videos; a file has images but ``processor`` is None; every row
            was filtered out.
    """

    def __init__(
        self,
        files: Any,
        tokenizer: Any,
        processor: Any,
        data_cfg: Any,
        tools: list[dict] | None = None,
        raw_chat: bool = False,
    ):
        # every row gets its raw_prompt whatever data.return_raw_chat says: custom agent loops read it (verl's
        # dataset always gives it)
        self.raw_chat = raw_chat
        self.tokenizer = tokenizer
        # multi-turn rollout: the tools' OpenAI schemas, rendered into every prompt by the chat template
        self.tools = list(tools) if tools else None
        self.processor = processor
        self.settings = data_settings(data_cfg)
        self.files = as_file_list(files)
        if not self.files:
            raise UserError("no data files given (data.train_files / data.val_files is empty)")
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise UserError(
                "the tokenizer has neither a pad token nor an eos token; set one in its tokenizer_config.json"
            )
        self._init_vision()
        self._tables: list[pa.Table] = []
        self._refs: list[tuple[int, int]] = []  # (file number, row in file) of each visible row
        for f in self.files:
            table = self._read_file(f)
            self._refs += [(len(self._tables), r) for r in range(table.num_rows)]
            self._tables.append(table)
        self._offsets = [0]
        for t in self._tables:
            self._offsets.append(self._offsets[-1] + t.num_rows)
        self.num_source_rows = len(self._refs)
        self.num_filtered = 0
        self.check_images()
        if self.settings.filter_overlong_prompts:
            self._filter_overlong()
        elif self.settings.truncation == "error":
            self.check_prompt_lengths()
        self.check_ground_truths()

    # ------------------------------------------------------------------ setup
    def _init_vision(self) -> None:
        self.image_token_id = self.patch_factor = self.merge_size = None
        self.protected_ids: set[int] = set()
        if self.processor is None:
            return
        ip = getattr(self.processor, "image_processor", None)
        tok = getattr(self.processor, "tokenizer", self.tokenizer)
        image_token = getattr(self.processor, "image_token", None)
        if ip is None or image_token is None:
            raise UserError(
                f"the processor {type(self.processor).__name__} has no image processor / image token; "
                "pass a vision-language processor (e.g. Qwen2.5-VL) or None for a text-only model"
            )
        self.image_token_id = tok.convert_tokens_to_ids(image_token)
        self.merge_size = int(getattr(ip, "merge_size", 2))
        self.patch_factor = int(getattr(ip, "patch_size", 14)) * self.merge_size
        for t in ("<|vision_start|>", "<|vision_end|>", image_token):
            tid = tok.convert_tokens_to_ids(t)
            if isinstance(tid, int) and tid != tok.unk_token_id:
                self.protected_ids.add(tid)
        self.resizer = ImageResizer.of(ip, self.settings.min_pixels, self.settings.max_pixels)
        self.min_pixels, self.max_pixels = self.resizer.min_pixels, self.resizer.max_pixels

    def _read_file(self, f: str) -> pa.Table:
        s = self.settings
        if not Path(f).is_file():
            raise UserError(f"data file {f} does not exist (data.train_files / data.val_files); run data prep first")
        fmt = file_format(f)
        try:
            table = pq.read_table(f) if fmt == "parquet" else pa.Table.from_pylist(read_rows(f))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, ValueError) as e:
            raise UserError(
                f"data file {f} is not a readable {fmt.upper() if fmt != 'parquet' else 'parquet'} "
                f"file of rows ({e}); verl-npu reads parquet, .jsonl, .json and .csv in verl's row "
                "format"
            ) from None
        cols = table.column_names
        for key, col in (("data.prompt_key", s.prompt_key), ("data.reward_fn_key", s.reward_fn_key)):
            if col not in cols:
                raise UserError(
                    f"data file {f} has no column {col!r} {key} (columns: {', '.join(cols)}); "
                    f"set {key} to the right column or re-run data prep"
                )
        if "reward_model" not in cols:
            raise UserError(
                f"data file {f} has no column 'reward_model' (columns: {', '.join(cols)}); each row needs "
                "reward_model.ground_truth for the reward: re-run data prep"
            )
        if s.video_key and s.video_key in cols and _has_entries(table.column(s.video_key)):
            raise UserError(
                f"data file {f} has videos in column {s.video_key!r}: videos are not supported by verl-npu yet; "
                "use image or text data (and set data.video_key=null)"
            )
        has_images = s.image_key in cols and _has_entries(table.column(s.image_key))
        if has_images and self.processor is None:
            raise UserError(
                f"data file {f} has images in column {s.image_key!r} but the model has no image processor "
                "(a text-only model); use a vision-language model, or a text dataset"
            )
        if s.image_key not in cols and self.processor is not None:
            prompts = table.column(s.prompt_key).to_pylist()
            if any(IMAGE_PLACEHOLDER in str(p) for p in prompts):
                raise UserError(
                    f"data file {f} has prompts with {IMAGE_PLACEHOLDER} but no image column {s.image_key!r} "
                    f"(columns: {', '.join(cols)}); set data.image_key to the column holding the images"
                )
        return table

    def check_images(self) -> None:
        """Check every row's images before training: each decodes (the whole image, not only its
        header), can be resized within the pixel limits (``smart_resize``), matches one ``<image>``
        placeholder, and (unless ``data.filter_overlong_prompts``) its image tokens alone fit
        ``data.max_prompt_length``. A tqdm bar (stderr) shows the progress above
        `CHECK_PROGRESS_MIN_ROWS` rows.

        Raises:
            UserError: listing the bad rows (file, row in the file, column, image number, what is
                wrong; at most `MAX_LISTED_PROBLEMS` of them) and their count.
        """
        if self.processor is None:
            return
        s = self.settings
        tables = [(fi, t) for fi, t in enumerate(self._tables) if s.image_key in t.column_names]
        total = sum(t.num_rows for _, t in tables)
        if not total:
            return
        from tqdm import tqdm  # noqa: PLC0415

        problems: list[str] = []
        bad_rows = 0
        with tqdm(
            total=total,
            desc="checking images",
            unit="row",
            file=sys.stderr,
            leave=False,
            disable=total <= CHECK_PROGRESS_MIN_ROWS,
        ) as bar:
            for fi, table in tables:
                r = 0
                for chunk in table.select([s.image_key, s.prompt_key]).to_batches(max_chunksize=256):
                    for images, prompt in zip(chunk.column(0).to_pylist(), chunk.column(1).to_pylist()):
                        found = self._row_image_problems(images or [], prompt, self.files[fi], r)
                        if found:
                            bad_rows += 1
                            problems += found[: max(0, MAX_LISTED_PROBLEMS - len(problems))]
                        r += 1
                    bar.update(chunk.num_rows)
        if bad_rows:
            more = f"\n  ({bad_rows} bad rows in all)" if bad_rows > 1 else ""
            raise UserError(
                f"{bad_rows} of {total} rows with images cannot be used (checked before training):\n  - "
                + "\n  - ".join(problems)
                + more
                + "\nFix or drop these rows (data_prep/geometry3k.py --skip-bad-rows drops undecodable ones), "
                "or point data.train_files / data.val_files at good files"
            )

    def _row_image_problems(self, images: list, prompt: Any, file: str, r: int) -> list[str]:
        """What is wrong with the images of row ``r`` of ``file`` (empty: nothing)."""
        s = self.settings
        where = f"data file {file} row {r} column {s.image_key!r}"
        out = []
        try:
            self._messages({s.prompt_key: prompt}, f"data file {file} row {r}", len(images))
        except UserError as e:
            out.append(str(e))
        tokens = 0
        for k, value in enumerate(images):
            try:
                image = _decode_image(value, where, k)
            except UserError as e:
                out.append(str(e))
                continue
            try:
                h, w = self.resizer.size(image.height, image.width)
            except (ValueError, ZeroDivisionError, AssertionError) as e:
                out.append(
                    f"{where}: image {k} is {image.width}x{image.height} px and cannot be resized within "
                    f"min_pixels={self.min_pixels}..max_pixels={self.max_pixels} ({e}); crop or pad it"
                )
                continue
            tokens += self.image_tokens(h, w)
        if tokens > s.max_prompt_length and not s.filter_overlong_prompts:
            out.append(
                f"{where}: the images alone take {tokens} prompt tokens, more than data.max_prompt_length="
                f"{s.max_prompt_length}; raise data.max_prompt_length, lower data.max_pixels (now "
                f"{self.max_pixels}), or set data.filter_overlong_prompts=true to drop such rows"
            )
        return out

    def _prompt_lengths(self) -> list[int]:
        """`prompt_length` of every visible row (over `filter_overlong_prompts_workers` processes)."""
        n = len(self._refs)
        workers = max(1, int(self.settings.filter_overlong_prompts_workers or 1))
        if workers > 1 and n > 1 and "fork" in mp.get_all_start_methods():
            global _FILTER_DATASET
            _FILTER_DATASET = self  # children inherit it through fork; nothing large is pickled
            try:
                with mp.get_context("fork").Pool(min(workers, n)) as pool:
                    return pool.map(_prompt_length_in_worker, range(n), chunksize=max(1, n // (4 * workers)))
            finally:
                _FILTER_DATASET = None
        return [self.prompt_length(i) for i in range(n)]

    def _raise_bad_rows(self, what: str, problems: list[str], fix: str) -> None:
        if problems:
            more = f"\n  ({len(problems)} such rows in all)" if len(problems) > MAX_LISTED_PROBLEMS else ""
            raise UserError(
                f"{len(problems)} of {len(self._refs)} rows {what} (checked before training):\n  - "
                + "\n  - ".join(problems[:MAX_LISTED_PROBLEMS])
                + more
                + f"\nFix: {fix}"
            )

    def check_prompt_lengths(self) -> None:
        """With ``truncation=error`` (and no filtering), every prompt must fit ``max_prompt_length``:
        all rows are measured when the dataset is built, not when training reaches them."""
        limit = self.settings.max_prompt_length
        self._raise_bad_rows(
            f"have prompts longer than data.max_prompt_length={limit}",
            [f"{self._row(i)[1]}: {n} tokens" for i, n in enumerate(self._prompt_lengths()) if n > limit],
            "raise data.max_prompt_length, set data.filter_overlong_prompts=true to drop such rows, or set "
            "data.truncation to left, right or middle",
        )

    def check_ground_truths(self) -> None:
        """Every visible row needs ``reward_model.ground_truth`` (not null) for its reward."""
        columns = [t.column("reward_model").to_pylist() for t in self._tables]
        problems = []
        for fi, r in self._refs:
            rm = columns[fi][r]
            if not isinstance(rm, dict) or rm.get("ground_truth") is None:
                problems.append(f"data file {self.files[fi]} row {r}: 'reward_model' is {rm!r}")
        self._raise_bad_rows(
            "have no reward_model.ground_truth",
            problems,
            "give every row a ground truth (re-run data prep), or drop those rows",
        )

    def _filter_overlong(self) -> None:
        n = len(self._refs)
        lengths = self._prompt_lengths()
        keep = [ref for ref, length in zip(self._refs, lengths) if length <= self.settings.max_prompt_length]
        self.num_filtered = n - len(keep)
        if not keep:
            raise UserError(
                f"every one of the {n} prompts in {', '.join(self.files)} is longer than data.max_prompt_length="
                f"{self.settings.max_prompt_length} (shortest: {min(lengths)} tokens); raise data.max_prompt_length "
                "or lower data.max_pixels"
            )
        if self.num_filtered:
            logger.info(
                "filtered %d of %d prompts longer than %d tokens", self.num_filtered, n, self.settings.max_prompt_length
            )
        self._refs = keep

    # ------------------------------------------------------------------ rows
    def __len__(self) -> int:
        return len(self._refs)

    def _row(self, i: int) -> tuple[dict, str, int]:
        """(row dict, 'file row r' label, global source index) of visible row ``i``."""
        fi, r = self._refs[i]
        row = self._tables[fi].slice(r, 1).to_pylist()[0]
        return row, f"data file {self.files[fi]} row {r}", self._offsets[fi] + r

    def _messages(self, row: dict, where: str, n_images: int) -> list[dict]:
        """The row's chat messages; with a processor each ``<image>`` becomes an image content part.

        Raises:
            UserError: the prompt column is not a list of messages, or (with a processor) the
                number of ``<image>`` placeholders differs from ``n_images``.
        """
        prompt = row.get(self.settings.prompt_key)
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if not isinstance(prompt, list) or not all(isinstance(m, dict) and "role" in m for m in prompt):
            raise UserError(
                f"{where}: column {self.settings.prompt_key!r} must hold chat messages "
                f"[{{'role': ..., 'content': ...}}] (got {str(prompt)[:80]!r})"
            )
        if self.processor is None:
            return [{"role": m["role"], "content": m.get("content") or ""} for m in prompt]
        n_placeholders = sum(str(m.get("content") or "").count(IMAGE_PLACEHOLDER) for m in prompt)
        if n_placeholders != n_images:
            raise UserError(
                f"{where}: the prompt has {n_placeholders} {IMAGE_PLACEHOLDER} placeholder(s) but the row has "
                f"{n_images} image(s); each image needs exactly one {IMAGE_PLACEHOLDER} in the prompt, in "
                "order (fix the row, or re-run data prep)"
            )
        messages = []
        for m in prompt:
            content = m.get("content") or ""
            if IMAGE_PLACEHOLDER not in content:
                messages.append({"role": m["role"], "content": content})
                continue
            parts: list[dict] = []
            for k, piece in enumerate(content.split(IMAGE_PLACEHOLDER)):
                if k > 0:
                    parts.append({"type": "image"})
                if piece:
                    parts.append({"type": "text", "text": piece})
            messages.append({"role": m["role"], "content": parts})
        return messages

    def _raw_images(self, row: dict) -> list:
        if self.processor is None:
            return []
        images = row.get(self.settings.image_key)
        return list(images) if images else []

    def _template(self, messages: list[dict]) -> str:
        owner = self.processor if self.processor is not None else self.tokenizer
        extra = {"tools": self.tools} if self.tools else {}
        return owner.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)

    def image_tokens(self, height: int, width: int) -> int:
        """Image tokens of one image after resizing to ``height`` x ``width``: (h/f) * (w/f), f = patch * merge."""
        return (height // self.patch_factor) * (width // self.patch_factor)

    def prompt_length(self, i: int) -> int:
        """Token count of row ``i``'s prompt with image tokens expanded, without running the image processor.

        Equals the untruncated length of ``raw_prompt_ids``: the text is tokenized with one
        placeholder token per image, and each image adds ``image_tokens(h, w) - 1`` for its
        resized size (read from the image header; pixels are not decoded).
        """
        row, where, _ = self._row(i)
        raw_images = self._raw_images(row)
        messages = self._messages(row, where, len(raw_images))
        text_ids = self.tokenizer(self._template(messages), add_special_tokens=False)["input_ids"]
        extra = 0
        for k, value in enumerate(raw_images):
            w, h = _image_header_size(value, where, k)
            extra += self.image_tokens(*self.resizer.size(h, w)) - 1
        return len(text_ids) + extra

    def __getitem__(self, i: int) -> dict:
        if not -len(self) <= i < len(self):
            raise IndexError(f"row {i} out of range for a dataset of {len(self)} rows")
        i = i % len(self)
        s = self.settings
        row, where, source_index = self._row(i)
        raw_images = self._raw_images(row)
        messages = self._messages(row, where, len(raw_images))
        text = self._template(messages)
        mm_inputs: dict[str, torch.Tensor] = {}
        images = [self.resizer(_decode_image(v, where, k)) for k, v in enumerate(raw_images)]
        if images:
            # Images are already resized to multiples of the patch factor: a second resize inside
            # the processor could change their token count and break the match with multi_modal_data.
            out = self.processor(text=[text], images=images, return_tensors="pt", do_resize=False)
            ids = out["input_ids"][0]
            mm_inputs = {k: v for k, v in out.items() if k not in SEQUENCE_ALIGNED_KEYS}
            expected = sum(self.image_tokens(im.height, im.width) for im in images)
            found = int((ids == self.image_token_id).sum())
            if found != expected:  # a processor/template that does not expand placeholders as we count them
                raise UserError(
                    f"{where}: the processor produced {found} image tokens for {len(images)} image(s) but the images "
                    f"need {expected}; check that the chat template emits one image placeholder per image part"
                )
        else:
            ids = torch.as_tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
        ids = self._fit_length(ids, where)
        item = self._pad(ids)
        item.update(
            raw_prompt_ids=ids.tolist(),
            multi_modal_inputs=mm_inputs,
            data_source=row.get(s.reward_fn_key),
            ground_truth=_ground_truth(row, where),
            extra_info=row.get("extra_info") or {},
            index=source_index,
            data_row=where,
        )
        if images:
            item["multi_modal_data"] = {"image": images}
        if s.return_raw_chat or self.raw_chat:
            item["raw_prompt"] = messages
        if "agent_name" in row:  # verl's per-row agent loop (multi-turn rollout)
            item["agent_name"] = row["agent_name"]
        return item

    def image_files(self) -> list[str]:
        """The files whose rows carry images (a column ``data.image_key`` with a non-empty list; only with a
        vision-language processor)."""
        if self.processor is None:
            return []
        key = self.settings.image_key
        return [
            str(self.files[fi])
            for fi, t in enumerate(self._tables)
            if key in t.column_names and any(t.column(key).to_pylist())
        ]

    def check_agent_names(self, known: tuple[str, ...], multi_turn: bool, custom: tuple[str, ...] = ()) -> None:
        """Refuse rows whose ``agent_name`` is not one of ``known`` or ``custom`` (the names of
        agent.agent_loop_config_path's file), or names the tool agent while multi-turn rollout is off; the
        error names the file, the row, the value and the known names.

        Raises:
            UserError: the first such row.
        """
        for fi, table in enumerate(self._tables):
            if "agent_name" not in table.column_names:
                continue
            for r, name in enumerate(table.column("agent_name").to_pylist()):
                if name is None:
                    continue
                where = f"data file {self.files[fi]} row {r}"
                if name in custom:
                    continue
                if name not in known:
                    raise UserError(
                        f"{where}: agent_name {name!r} is not an agent loop of this run (built in: "
                        f"{', '.join(known)}; from actor_rollout_ref.rollout.agent.agent_loop_config_path: "
                        f"{', '.join(custom) or 'none'}); fix the column, add the loop to that file "
                        "(docs/agents.md, 'Custom agent loops'), or drop the column to use "
                        "actor_rollout_ref.rollout.agent.default_agent_loop"
                    )
                if name != "single_turn_agent" and not multi_turn:
                    raise UserError(
                        f"{where}: agent_name {name!r} needs multi-turn rollout; set "
                        "actor_rollout_ref.rollout.multi_turn.enable=true (and multi_turn.tool_config_path)"
                    )

    def check_interaction_names(self, names: list[str], default_agent: str) -> None:
        """With interactions configured, refuse a multi-turn row (its ``agent_name``, else ``default_agent``,
        is not single_turn_agent) whose ``extra_info.interaction_kwargs.name`` is missing or names none of
        ``names``; the error names the file, the row and the fix.

        Raises:
            UserError: the first such row.
        """
        from verl_npu.config.interaction_file import row_interaction_problem

        for fi, table in enumerate(self._tables):
            agents = (
                table.column("agent_name").to_pylist()
                if "agent_name" in table.column_names
                else [None] * table.num_rows
            )
            extras = (
                table.column("extra_info").to_pylist()
                if "extra_info" in table.column_names
                else [None] * table.num_rows
            )
            for r, (agent, extra) in enumerate(zip(agents, extras)):
                if (agent or default_agent) == "single_turn_agent":
                    continue
                problem = row_interaction_problem((extra or {}).get("interaction_kwargs"), names)
                if problem:
                    raise UserError(f"data file {self.files[fi]} row {r}: {problem}")

    def _fit_length(self, ids: torch.Tensor, where: str) -> torch.Tensor:
        """``ids`` if they fit ``max_prompt_length``, else truncated as ``data.truncation`` says (or an error)."""
        s = self.settings
        n = ids.numel()
        if n <= s.max_prompt_length:
            return ids
        n_image = int((ids == self.image_token_id).sum()) if self.image_token_id is not None else 0
        image_note = f" ({n_image} of them image tokens)" if n_image else ""
        pixels_fix = (
            f", or lower data.max_pixels (now {self.max_pixels}) so images take fewer tokens" if n_image else ""
        )
        if s.truncation == "error":
            raise UserError(
                f"{where}: the prompt is {n} tokens{image_note}, longer than data.max_prompt_length="
                f"{s.max_prompt_length}. Fix: raise data.max_prompt_length to at least {n}, set "
                f"data.filter_overlong_prompts=true to drop such rows, or set data.truncation to left, right or "
                f"middle{pixels_fix}"
            )
        cut = truncate_ids(ids, s.max_prompt_length, s.truncation)
        for tid in self.protected_ids:
            if int((cut == tid).sum()) != int((ids == tid).sum()):
                raise UserError(
                    f"{where}: the prompt is {n} tokens{image_note}; data.truncation={s.truncation} to "
                    f"data.max_prompt_length={s.max_prompt_length} would cut image tokens, and the images would no "
                    f"longer match their tokens. Fix: raise data.max_prompt_length to at least {n}{pixels_fix}, or "
                    "set data.filter_overlong_prompts=true to drop such rows"
                )
        return cut

    def _pad(self, ids: torch.Tensor) -> dict:
        """Left-pad ``ids`` to ``max_prompt_length``: {'input_ids', 'attention_mask'} LongTensors."""
        L = self.settings.max_prompt_length
        input_ids = torch.full((L,), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(L, dtype=torch.long)
        if ids.numel():
            input_ids[L - ids.numel() :] = ids.long()
            attention_mask[L - ids.numel() :] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask}


def _has_entries(column: pa.ChunkedArray) -> bool:
    """True if any row of a (list) column holds something: a non-empty list, or a non-null value."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return bool(pc.sum(pc.list_value_length(column)).as_py() or 0)
    return column.null_count < len(column)


def _ground_truth(row: dict, where: str) -> Any:
    """The row's ``reward_model.ground_truth`` as the parquet stores it (not turned into text: a reward ported
    from verl may expect the dict or list it wrote)."""
    rm = row.get("reward_model")
    if not isinstance(rm, dict) or rm.get("ground_truth") is None:
        raise UserError(f"{where}: 'reward_model' has no 'ground_truth' (got {rm!r}); re-run data prep")
    return rm["ground_truth"]


def _image_header_size(value: Any, where: str, k: int) -> tuple[int, int]:
    """(width, height) of a parquet image value, read from the encoded header only."""
    from PIL import Image  # noqa: PLC0415

    if isinstance(value, Image.Image):
        return value.size
    if isinstance(value, dict):
        value = value.get("bytes") if value.get("bytes") is not None else value.get("path")
    try:
        src = io.BytesIO(value) if isinstance(value, (bytes, bytearray)) else value
        with Image.open(src) as img:
            return img.size
    except Exception as e:  # PIL raises several types for corrupt data
        raise UserError(f"{where}: image {k} cannot be decoded ({type(e).__name__}: {e}); re-run data prep") from e


_FILTER_DATASET: RLDataset | None = None


def _prompt_length_in_worker(i: int) -> int:
    assert _FILTER_DATASET is not None  # set by the parent before forking
    return _FILTER_DATASET.prompt_length(i)
