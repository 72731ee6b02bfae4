"""Search-R1 question answering with the search tool, in verl's Search-R1 parquet format
(`data_prep/search_r1.py`; verl's examples/data_preprocess/preprocess_search_r1_dataset.py writes the same).

Each row:

    data_source   "searchR1_<source>"   (nq, hotpotqa, ...; the synthetic set: searchR1_synthetic), whose
                                        reward is verl_npu.rewards.search_r1 (exact match of <answer>...</answer>)
    prompt        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER_PREFIX + question}]
    ability       "fact-reasoning"
    reward_model  {"style": "rule", "ground_truth": {"target": [answers]}}
    extra_info    {index, need_tools_kwargs: true, question, split,
                   tools_kwargs: {"search": {"create_kwargs": {ground_truth, question, data_source}}}}
    agent_name    "tool_agent"          (verl-npu's data adds it: verl's Search-R1 data has no agent_name
                                        column, so with it a run needs rollout.agent.default_agent_loop=tool_agent)

Sources:
- `--local-dataset-path DIR`: a local copy of Search-R1's training data (PeterJinGo/nq_hotpotqa_train:
  train.parquet / test.parquet with question, golden_answers, data_source and optionally reward_model);
- `--synthetic N` (offline): N made-up questions about made-up places, companies and people ("What is the
  capital of Velomar?"), each answered by one document of a corpus written beside them
  (`corpus.jsonl`, Search-R1's corpus format: {"id", "contents": "\\"<title>\\"\\n<text>"}), which
  `verl-npu retrieval-server --corpus DIR/corpus.jsonl` serves to the search tool.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from verl_npu.data.prep import add_dry_run_option, add_source_options
from verl_npu.data.split_files import write_split_files

TOOL_NAME = "search"
AGENT_NAME = "tool_agent"
SYNTHETIC_SOURCE = "searchR1_synthetic"
ABILITY = "fact-reasoning"
#: the prompt of verl's Search-R1 data (examples/data_preprocess/preprocess_search_r1_dataset.py)
SYSTEM = "You are a helpful and harmless assistant."
USER_PREFIX = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<tool_call> query </tool_call> and it will return the top searched results between <tool_response> and "
    "</tool_response>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: "
)

SYLLABLES = (
    "ka",
    "lo",
    "mi",
    "ra",
    "ven",
    "tor",
    "sel",
    "dun",
    "bri",
    "zo",
    "qua",
    "mel",
    "nor",
    "thi",
    "vas",
    "pel",
    "gro",
    "li",
    "fen",
    "dar",
    "su",
    "ke",
    "rho",
    "man",
)
#: (question about X, the document's text, kind of answer) of the synthetic facts
FACTS = (
    ("What is the capital of {x}?", "{x} is a small country by the sea. Its capital city is {a}.", "place"),
    ("Who founded {x}?", "{x} is a company that makes clocks. It was founded by {a}.", "person"),
    ("In which year was {x} born?", "{x} is a painter known for river landscapes. {x} was born in {a}.", "year"),
)


def _name(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()


def synthetic_facts(n: int, seed: int) -> list[dict]:
    """`n` made-up facts {question, answer, title, contents}, every subject and answer distinct."""
    rng = random.Random(f"search_r1:{seed}")
    used: set[str] = set()

    def fresh(make) -> str:
        while True:
            value = make()
            if value not in used:
                used.add(value)
                return value

    facts = []
    for i in range(n):
        question, text, kind = FACTS[i % len(FACTS)]
        subject = fresh(lambda: _name(rng, 3) if kind != "year" else f"{_name(rng, 2)} {_name(rng, 2)}")
        if kind == "year":
            answer = str(rng.randint(1500, 1999))
        elif kind == "person":
            answer = fresh(lambda: f"{_name(rng, 2)} {_name(rng, 3)}")
        else:
            answer = fresh(lambda: _name(rng, 2))
        facts.append(
            {
                "question": question.format(x=subject),
                "answer": answer,
                "title": subject,
                "contents": f'"{subject}"\n' + text.format(x=subject, a=answer),
            }
        )
    return facts


def search_row(question: str, answers: list[str], data_source: str, split: str, index: int) -> dict:
    """One row of verl's Search-R1 format (module docstring)."""
    truth = {"target": [str(a) for a in answers]}
    return {
        "data_source": data_source,
        "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER_PREFIX + question}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {
            "index": index,
            "need_tools_kwargs": True,
            "question": question,
            "split": split,
            "tools_kwargs": {
                TOOL_NAME: {"create_kwargs": {"ground_truth": truth, "question": question, "data_source": data_source}}
            },
        },
        "agent_name": AGENT_NAME,
    }


def schema() -> pa.Schema:
    msg = pa.struct([("role", pa.string()), ("content", pa.string())])
    truth = pa.struct([("target", pa.list_(pa.string()))])
    create = pa.struct([("ground_truth", truth), ("question", pa.string()), ("data_source", pa.string())])
    extra = pa.struct(
        [
            ("index", pa.int64()),
            ("need_tools_kwargs", pa.bool_()),
            ("question", pa.string()),
            ("split", pa.string()),
            ("tools_kwargs", pa.struct([(TOOL_NAME, pa.struct([("create_kwargs", create)]))])),
        ]
    )
    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(msg)),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", truth)])),
            ("extra_info", extra),
            ("agent_name", pa.string()),
        ]
    )


def prepare_synthetic(
    save_dir, n_train: int, n_test: int, seed: int = 0, progress: bool = False, overwrite: bool = True
) -> dict:
    """Write `<save_dir>/{train,test}.parquet` and `<save_dir>/corpus.jsonl` (every fact's document, train and
    test); returns {"paths": {"train", "test", "corpus"}, "rows": {split: n}} (the demo-data writer's contract)."""
    save_dir = Path(os.path.expanduser(str(save_dir)))
    facts = synthetic_facts(n_train + n_test, seed)
    splits = {"train": facts[:n_train], "test": facts[n_train:]}
    written = write_split_files(
        save_dir,
        (
            (
                split,
                [search_row(f["question"], [f["answer"]], SYNTHETIC_SOURCE, split, i) for i, f in enumerate(chosen)],
            )
            for split, chosen in splits.items()
        ),
        schema(),
        overwrite=overwrite,
        progress=progress,
    )
    corpus = save_dir / "corpus.jsonl"
    if corpus.exists() and not overwrite:
        raise FileExistsError(f"{corpus} exists; pass --overwrite to replace it")
    with corpus.open("w", encoding="utf-8") as f:
        for i, fact in enumerate(facts):
            f.write(json.dumps({"id": str(i), "contents": fact["contents"]}, ensure_ascii=False) + "\n")
    written["paths"]["corpus"] = str(corpus)
    if progress:
        print(f"corpus: {len(facts)} documents -> {corpus}")
    return written


def _answers(row: dict, where: str) -> list[str]:
    truth = (row.get("reward_model") or {}).get("ground_truth") if isinstance(row.get("reward_model"), dict) else None
    if isinstance(truth, dict) and truth.get("target") is not None:
        return [str(t) for t in truth["target"]]
    golden = row.get("golden_answers")
    if golden is None:
        raise ValueError(f"{where}: no reward_model.ground_truth.target and no golden_answers column")
    return [str(t) for t in (golden if isinstance(golden, (list, tuple)) else [golden])]


def prepare_local(save_dir, dataset_dir, overwrite: bool = False, progress: bool = False) -> dict:
    """Convert a local copy of Search-R1's data (module docstring) split by split (train, test: those present)."""
    src = Path(os.path.expanduser(str(dataset_dir)))
    save_dir = Path(os.path.expanduser(str(save_dir)))
    found = [s for s in ("train", "test") if (src / f"{s}.parquet").is_file()]
    if not found:
        raise FileNotFoundError(
            f"--local-dataset-path {src}: no train.parquet or test.parquet there (Search-R1's "
            "data, e.g. a copy of the PeterJinGo/nq_hotpotqa_train dataset's files)"
        )

    def converted():  # one split at a time: train.parquet is written before test.parquet is read
        for split in found:
            table = pq.read_table(src / f"{split}.parquet")
            if "question" not in table.column_names:
                raise ValueError(f"{src / f'{split}.parquet'} has no 'question' column (columns: {table.column_names})")
            rows = []
            for i, row in enumerate(table.to_pylist()):
                where = f"{src / f'{split}.parquet'} row {i}"
                source = str(row.get("data_source") or "unknown")
                rows.append(
                    search_row(
                        str(row["question"]),
                        _answers(row, where),
                        source if source.startswith("searchR1_") else f"searchR1_{source}",
                        split,
                        i,
                    )
                )
            yield split, rows

    return write_split_files(save_dir, converted(), schema(), overwrite=overwrite, progress=progress)


def main(argv: list[str] | None = None) -> None:
    """CLI entry point of ``data_prep/search_r1.py``."""
    p = argparse.ArgumentParser(
        prog="data_prep/search_r1.py",
        description=(
            "Write Search-R1 question answering for the search tool as multi-turn RL parquet files (train.parquet, "
            "test.parquet; verl's Search-R1 format), from a local copy of Search-R1's data or, with --synthetic N, a "
            "made-up set with its corpus (corpus.jsonl, for `verl-npu retrieval-server --corpus`). No network."
        ),
    )
    add_source_options(
        p,
        default_dir="~/data/searchR1_processed_direct",
        dir_help="output folder (default: verl's, ~/data/searchR1_processed_direct)",
        dataset_help="a folder with Search-R1's train.parquet / test.parquet (question, golden_answers, data_source)",
        synthetic_help="write N synthetic train rows and their corpus instead",
    )
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
    add_dry_run_option(p)
    args = p.parse_args(argv)
    if (args.synthetic is None) == (args.local_dataset_path is None):
        p.error("give one of --synthetic N (offline, made-up data and corpus) or --local-dataset-path DIR")
    if args.dry_run:
        source = (
            f"{args.synthetic} synthetic train rows (seed {args.seed}) and their corpus.jsonl"
            if args.synthetic is not None
            else f"Search-R1's train/test.parquet from {args.local_dataset_path}"
        )
        print(f"dry run: would write {source} as train.parquet / test.parquet to {args.local_save_dir}")
        return
    try:
        if args.synthetic is not None:
            if args.synthetic < 1:
                p.error("--synthetic must be at least 1")
            n_test = args.synthetic_test if args.synthetic_test is not None else max(1, args.synthetic // 4)
            out = prepare_synthetic(
                args.local_save_dir, args.synthetic, n_test, args.seed, progress=True, overwrite=args.overwrite
            )
            print(f"serve the corpus: verl-npu retrieval-server --corpus {out['paths']['corpus']}")
        else:
            prepare_local(args.local_save_dir, args.local_dataset_path, args.overwrite, progress=True)
    except (FileExistsError, FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
