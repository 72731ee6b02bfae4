"""Conversations for SFT: parquet rows -> token ids and the loss mask of the assistant's tokens.

A row's `data.messages_key` column is a list of messages {role, content[, tool_calls]} with roles system, user,
assistant and tool; its `data.tools_key` column (optional: a list of OpenAI function schemas, or their JSON text)
goes to the chat template as `tools`. Every row is rendered by the model's own chat template:

    ids     = tokens of the whole conversation (apply_chat_template, no generation prompt)
    mask[t] = 1 exactly when token t is one the assistant wrote: for an assistant message i, the tokens after the
              conversation up to i with the generation prompt (`<|im_start|>assistant\\n` for ChatML) up to the end
              of the conversation through i (its content, tool calls and end-of-turn tokens); system, user and tool
              turns, and the assistant header, are 0.

The spans are found by rendering the prefixes of the conversation; a template whose prefixes are not prefixes of
the whole conversation is refused for that row unless `data.ignore_input_ids_mismatch`. Everything is checked when
the set is built (before any worker starts): a missing messages column, a message that is not {role, content}, a
role outside the four, a conversation without an assistant turn, one longer than `data.max_length` under
`truncation=error`, and rows with images or videos (not built) are `UserError`s naming the file and the row.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from verl_npu.batch import Batch
from verl_npu.errors import UserError

log = logging.getLogger("verl_npu")

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Conversation:
    """One tokenized row: `input_ids` and `loss_mask` (1 on the assistant's tokens), and where it came from."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    source: str


def _as_files(files) -> list[str]:
    return [str(f) for f in files] if isinstance(files, (list, tuple)) else [str(files)]


def _plain(value):
    """A parquet cell as plain Python (numpy arrays to lists, recursively)."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None or k in ("content",)}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _present(value) -> bool:
    if value is None:
        return False
    try:
        return len(value) > 0
    except TypeError:
        return True


class ChatTokenizer:
    """Renders conversations with `tokenizer`'s chat template and finds the assistant's spans (module docstring).
    `config` is the `data` section (apply_chat_template_kwargs, enable_thinking_*, max_length, truncation,
    ignore_input_ids_mismatch)."""

    def __init__(self, tokenizer, config):
        self.tokenizer = tokenizer
        self.config = config
        self.kwargs = dict(config.apply_chat_template_kwargs)

    def _ids(self, messages, tools, add_generation_prompt: bool, extra: dict) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, messages: list[dict], tools, where: str, thinking=None) -> Conversation:
        """The ids and loss mask of one conversation; `where` ("file row N") names it in errors."""
        extra = dict(self.kwargs)
        if thinking is not None:
            extra["enable_thinking"] = bool(thinking)
        try:
            ids = self._ids(messages, tools, False, extra)
        except Exception as exc:  # noqa: BLE001 - a template error is about this row's data
            raise UserError(
                f"{where}: the chat template cannot render this conversation ({type(exc).__name__}: "
                f"{str(exc)[:200]}); fix the row, or set model.custom_chat_template"
            ) from None
        mask = [0] * len(ids)
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            start = self._ids(messages[:i], tools, True, extra)
            end = self._ids(messages[: i + 1], tools, False, extra)
            if ids[: len(start)] != start or ids[: len(end)] != end:
                if not self.config.ignore_input_ids_mismatch:
                    raise UserError(
                        f"{where}: the chat template renders message {i} differently inside the whole conversation "
                        "than after the turns before it, so its tokens cannot be told apart (templates that drop "
                        "earlier reasoning do this); fix the template (model.custom_chat_template) or set "
                        "data.ignore_input_ids_mismatch=true to mask by the closest match"
                    )
                log.warning(
                    "%s: message %d renders differently in the whole conversation; masked by its prefix "
                    "lengths (data.ignore_input_ids_mismatch)",
                    where,
                    i,
                )
            for t in range(min(len(start), len(ids)), min(len(end), len(ids))):
                mask[t] = 1
        limit, mode = int(self.config.max_length), self.config.truncation
        if len(ids) > limit:
            if mode == "error":
                raise UserError(
                    f"{where}: {len(ids)} tokens, longer than data.max_length={limit}; raise "
                    "data.max_length, shorten the conversation, or set data.truncation=left or right"
                )
            keep = slice(len(ids) - limit, None) if mode == "left" else slice(0, limit)
            ids, mask = ids[keep], mask[keep]
        return Conversation(tuple(ids), tuple(mask), where)


class SFTDataset:
    """Every row of `files` (parquet) as a `Conversation` (tokenized and checked up front: module docstring), at
    most `max_samples` of them (-1: all). `config` is the `data` section."""

    def __init__(self, files, tokenizer, config, max_samples: int = -1):
        import pyarrow.parquet as pq

        chat = ChatTokenizer(tokenizer, config)
        self.rows: list[Conversation] = []
        for file in _as_files(files):
            path = Path(os.path.expanduser(file))
            if not path.is_file():
                raise UserError(f"data file not found: {file} (data.train_files / data.val_files)")
            try:
                table = pq.read_table(path)
            except Exception as exc:  # noqa: BLE001 - not parquet
                raise UserError(f"{file}: not a readable parquet file ({exc})") from None
            columns = table.column_names
            if config.messages_key not in columns:
                raise UserError(
                    f"{file}: no column '{config.messages_key}' (data.messages_key); its columns: "
                    f"{', '.join(columns)}. Set data.messages_key to the column holding the "
                    "conversations, or convert the data (docs/sft.md)"
                )
            for media, key in (("images", config.image_key), ("videos", config.video_key)):
                if key in columns and any(_present(v) for v in table.column(key).to_pylist()):
                    raise UserError(
                        f"{file}: rows hold {media} (column '{key}'): vision-language SFT is not built "
                        "yet in verl-npu; train on text conversations"
                    )
            records = table.to_pylist()
            for index, record in enumerate(records):
                if 0 <= max_samples <= len(self.rows):
                    break
                where = f"{file} row {index}"
                messages = self._messages(record.get(config.messages_key), where)
                tools = record.get(config.tools_key)
                if isinstance(tools, str):
                    try:
                        tools = json.loads(tools)
                    except ValueError:
                        raise UserError(f"{where}: column '{config.tools_key}' is not JSON") from None
                thinking = record.get(config.enable_thinking_key)
                thinking = config.enable_thinking_default if thinking is None else thinking
                self.rows.append(chat.encode(messages, _plain(tools) or None, where, thinking))
        if not self.rows:
            raise UserError(f"{', '.join(_as_files(files))}: no conversation to train on")

    @staticmethod
    def _messages(value, where: str) -> list[dict]:
        value = _plain(value)
        if not isinstance(value, list) or not value:
            raise UserError(f"{where}: the messages cell is {type(value).__name__}, not a list of messages")
        for i, message in enumerate(value):
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise UserError(f"{where}: message {i} is not a {{role, content}} mapping: {str(message)[:120]}")
            if message["role"] not in ROLES:
                raise UserError(
                    f"{where}: message {i} has role '{message['role']}', which the chat template does "
                    f"not know (roles: {', '.join(ROLES)})"
                )
            if message["content"] is None:
                message["content"] = ""
        if not any(m["role"] == "assistant" for m in value):
            raise UserError(
                f"{where}: the conversation has no assistant turn, so nothing to learn; drop the row "
                "or add the assistant's answer"
            )
        return value

    def __len__(self) -> int:
        return len(self.rows)


def collate(rows: list[Conversation], pad_id: int) -> Batch:
    """Right-padded tensors of `rows` in the layout of the training engine: `input_ids`, `attention_mask` [N, L],
    and `responses` = input_ids[:, 1:] with `response_mask` = loss_mask[:, 1:] [N, L-1]: the tokens predicted at
    positions 1..L-1 and whether each is the assistant's (so every token but the first is a "response")."""
    length = max(len(r.input_ids) for r in rows)
    ids = torch.full((len(rows), length), int(pad_id), dtype=torch.long)
    attention = torch.zeros((len(rows), length), dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row.input_ids)
        ids[i, :n] = torch.tensor(row.input_ids)
        attention[i, :n] = 1
        mask[i, :n] = torch.tensor(row.loss_mask)
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": attention,
            "responses": ids[:, 1:].clone(),
            "response_mask": mask[:, 1:].clone(),
        }
    )


class StepSampler:
    """Which rows each training step reads: epoch e's order is a permutation seeded by (seed, e) (`shuffle`) or
    the file order, cut into `batch_size` rows per step (the last incomplete batch dropped); step s is batch
    s % steps_per_epoch of epoch s // steps_per_epoch. A function of the step alone, so a resumed run reads the
    same rows as an uninterrupted one."""

    def __init__(self, num_rows: int, batch_size: int, shuffle: bool, seed: int):
        self.num_rows, self.batch_size, self.shuffle, self.seed = num_rows, batch_size, shuffle, seed
        self.steps_per_epoch = num_rows // batch_size

    def rows(self, step: int) -> list[int]:
        epoch, index = divmod(step, self.steps_per_epoch)
        if self.shuffle:
            order = torch.randperm(self.num_rows, generator=torch.Generator().manual_seed(self.seed * 100003 + epoch))
        else:
            order = torch.arange(self.num_rows)
        return order[index * self.batch_size : (index + 1) * self.batch_size].tolist()

    def state(self, step: int) -> dict:
        """What `data_<rank>.pt` of a checkpoint records: the position after `step` steps."""
        epoch, index = divmod(step, self.steps_per_epoch)
        return {
            "global_step": step,
            "epoch": epoch,
            "batch_in_epoch": index,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
        }
