"""Trinity-RFT tasksets and ROLL data files (JSON / JSONL / parquet) -> verl RL parquet. Run with --help.

`verl-npu import` names this command for every dataset a Trinity or ROLL config points at.

Sources:
  trinity   a taskset: a file, or a folder holding `<split>.jsonl` / `<split>.json` / `<split>.parquet`
            (under `<subset>/` with --subset); the question column is `format.prompt_key` (--prompt-key,
            Trinity's default `prompt`), the answer column `format.response_key` (--response-key, default
            `response`); the taskset's `format.system_prompt` becomes a system message.
  roll      a ROLL RLVR data file: the question in `data_args.prompt` (--prompt-key, default `prompt`) as
            text, or `data_args.messages` (--messages-key) as a chat-message list (or its JSON text);
            the answer in `ground_truth`, the domain in `tag` (ROLL routes rewards by it).

Each output row (verl's RL schema, docs/data_formats.md):

    data_source   the row's tag (roll) or --data-source (default: the input file's stem)
    prompt        the chat messages: [system (if any)], user question (or the row's messages)
    ability       --ability (default "general")
    reward_model  {"style": "rule", "ground_truth": the answer (with --final-answer-after M: the text after
                  the last M, thousands commas removed, GSM8K's convention)}
    extra_info    {"split", "index" (source row), "answer" (the full answer text), "question"}

A row without the question or the answer column is an error naming the file and row.

With --sft (a Trinity SFT experience buffer or a ROLL SFT data file: conversations, not questions) each row is
written as verl's SFT row instead: `messages` (the --messages-key column, default `messages`: a list of
{role, content, ...} objects or its JSON text, written as a list) and `tools` (the row's, as JSON text; null
when it has none)
(docs/sft.md, 'Data').
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from verl_npu.data.geometry3k import write_rl_parquet
from verl_npu.errors import UserError, run_command

SUFFIXES = (".jsonl", ".json", ".parquet")


def find_files(path: str | Path, split: str | None = None, subset: str | None = None) -> list[Path]:
    """The data files of a Trinity taskset / ROLL file name (a file, or a folder's `<split>.*` files)."""
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    if p.is_dir():
        base = p / subset if subset else p
        found = [base / f"{split or 'train'}{s}" for s in SUFFIXES if (base / f"{split or 'train'}{s}").is_file()]
        if not found:
            found = sorted(f for f in base.glob(f"{split or 'train'}*") if f.suffix in SUFFIXES)
        if found:
            return found
        raise UserError(
            f"{base}: no {split or 'train'}.jsonl / .json / .parquet in it (give --input the data "
            "file itself, or the folder holding <split>.jsonl)"
        )
    raise UserError(
        f"{p}: no such file or folder (a Hugging Face hub id must be downloaded first, e.g. with "
        "`huggingface-cli download --repo-type dataset ID --local-dir DIR`)"
    )


def read_rows(path: Path) -> Iterator[dict]:
    """The rows of one JSON (a list of objects), JSONL or parquet file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from pq.read_table(path).to_pylist()
        return
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}: not valid JSON ({exc})") from None
        yield from rows
        return
    for i, line in enumerate(text.splitlines()):
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}: line {i + 1} is not a JSON object ({exc.msg})") from None


def final_answer(text: str, mark: str | None) -> str:
    if not mark:
        return text
    if mark not in text:
        raise ValueError(f"the answer has no {mark!r}")
    return text.rsplit(mark, 1)[1].strip().replace(",", "")


def _messages(value: Any, where: str) -> list[dict]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise UserError(f"{where}: the messages column is text that is not a JSON message list") from None
    if not isinstance(value, list) or not all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        raise UserError(f"{where}: the messages column must be a list of {{role, content}} objects")
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in value]


def convert_row(
    row: dict,
    *,
    index: int,
    split: str,
    where: str,
    prompt_key: str | None,
    messages_key: str | None,
    answer_key: str,
    data_source: str,
    tag_key: str | None,
    system_prompt: str | None,
    ability: str,
    answer_mark: str | None,
) -> dict:
    """One source row as a verl RL row (schema in the module doc)."""
    here = f"{where} row {index}"
    if messages_key:
        if messages_key not in row:
            raise UserError(f"{here}: no {messages_key!r} column (its columns: {', '.join(row)})")
        messages = _messages(row[messages_key], here)
        question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    else:
        if prompt_key not in row:
            raise UserError(f"{here}: no {prompt_key!r} column (its columns: {', '.join(row)}); pass --prompt-key")
        question = str(row[prompt_key])
        messages = [{"role": "user", "content": question}]
    if system_prompt:
        messages = [{"role": "system", "content": system_prompt}, *messages]
    if answer_key not in row:
        raise UserError(f"{here}: no {answer_key!r} column (its columns: {', '.join(row)}); pass the answer column")
    answer = str(row[answer_key])
    try:
        truth = final_answer(answer, answer_mark)
    except ValueError as exc:
        raise UserError(f"{here}: {exc}") from None
    source = str(row.get(tag_key) or data_source) if tag_key else data_source
    return {
        "data_source": source,
        "prompt": messages,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def convert(files: list[Path], output: str | Path, **kw: Any) -> int:
    """Convert `files` into one parquet file at `output`; returns the row count."""
    rows, index = [], 0
    for f in files:
        for row in read_rows(f):
            if not isinstance(row, dict):
                raise UserError(f"{f} row {index}: not a JSON object")
            rows.append(convert_row(row, index=index, where=str(f), **kw))
            index += 1
    if not rows:
        raise UserError(f"{', '.join(map(str, files))}: no rows")
    write_rl_parquet(rows, output, with_images=False)
    return len(rows)


def convert_sft(files: list[Path], output: str | Path, messages_key: str, tools_key: str = "tools") -> int:
    """Conversations of `files` as verl SFT rows (`messages` a list, `tools` JSON text) in one parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, index = [], 0
    for f in files:
        for row in read_rows(f):
            here = f"{f} row {index}"
            if not isinstance(row, dict) or messages_key not in row:
                raise UserError(f"{here}: no {messages_key!r} column (pass --messages-key)")
            value = json.loads(row[messages_key]) if isinstance(row[messages_key], str) else row[messages_key]
            if not isinstance(value, list) or not all(isinstance(m, dict) and "role" in m for m in value):
                raise UserError(f"{here}: the {messages_key!r} column must be a list of {{role, content}} objects")
            tools = row.get(tools_key)
            rows.append(
                {
                    "messages": value,
                    "tools": None if tools is None else (tools if isinstance(tools, str) else json.dumps(tools)),
                }
            )
            index += 1
    if not rows:
        raise UserError(f"{', '.join(map(str, files))}: no rows")
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), output)
    return len(rows)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="data_prep/foreign_json.py", description=__doc__.split("\n\n")[0])
    p.add_argument("system", choices=("trinity", "roll"), help="whose format the input is in")
    p.add_argument("--input", required=True, help="data file, or (trinity) the taskset folder")
    p.add_argument("--output", required=True, help="parquet file to write")
    p.add_argument("--split", default="train", help="(trinity) the taskset's split (default train)")
    p.add_argument("--subset", help="(trinity) the taskset's subset_name folder")
    p.add_argument("--prompt-key", help="question column (trinity default: prompt; roll default: prompt)")
    p.add_argument(
        "--messages-key",
        help="(roll) chat-message column instead of a question column; (--sft) the "
        "conversation column (default messages)",
    )
    p.add_argument("--sft", action="store_true", help="write SFT rows (messages, tools) from conversations")
    p.add_argument("--response-key", help="(trinity) answer column (default: response)")
    p.add_argument("--ground-truth-key", default="ground_truth", help="(roll) answer column (default ground_truth)")
    p.add_argument("--tag-key", default="tag", help="(roll) domain column, written as data_source (default tag)")
    p.add_argument("--system-prompt", help="a system message before every question (trinity format.system_prompt)")
    p.add_argument(
        "--data-source",
        help="data_source of every row (default: the input's stem); it picks the "
        "built-in reward (docs/data_formats.md)",
    )
    p.add_argument("--ability", default="general")
    p.add_argument(
        "--final-answer-after",
        metavar="MARK",
        help="ground truth = the text after the last MARK (e.g. '####' for GSM8K answers)",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)

    def body() -> int:
        files = find_files(args.input, args.split, args.subset)
        if args.sft:
            print(f"wrote {convert_sft(files, args.output, args.messages_key or 'messages')} rows to {args.output}")
            return 0
        roll = args.system == "roll"
        n = convert(
            files,
            args.output,
            split=args.split,
            prompt_key=args.prompt_key or "prompt",
            messages_key=args.messages_key if roll else None,
            answer_key=args.ground_truth_key if roll else (args.response_key or "response"),
            data_source=args.data_source or Path(args.input).stem,
            tag_key=args.tag_key if roll else None,
            system_prompt=args.system_prompt,
            ability=args.ability,
            answer_mark=args.final_answer_after,
        )
        print(f"wrote {n} rows to {args.output}")
        return 0

    raise SystemExit(run_command(body))


if __name__ == "__main__":
    main()
