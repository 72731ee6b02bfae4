"""data_prep/foreign_json.py (issue 39): Trinity tasksets and ROLL JSON/JSONL files become verl RL parquet,
and the command `verl-npu import` prints for a config's dataset writes the file its recipe names, which then
passes verl-npu's path checks."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from verl_npu.config import load_recipe
from verl_npu.data import foreign_json
from verl_npu.errors import UserError
from verl_npu.importers import import_to

REPO = Path(__file__).resolve().parents[2]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_roll_rows_keep_their_messages_tag_and_ground_truth(tmp_path):
    src = _jsonl(
        tmp_path / "math.jsonl",
        [
            {
                "id": "a",
                "tag": "deepmath_103k",
                "ground_truth": "4",
                "messages": json.dumps(
                    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
                ),
            },
            {"id": "b", "tag": "aime", "ground_truth": "7", "messages": [{"role": "user", "content": "3+4?"}]},
        ],
    )
    out = tmp_path / "math.parquet"
    with pytest.raises(SystemExit) as done:
        foreign_json.main(["roll", "--input", str(src), "--messages-key", "messages", "--output", str(out)])
    assert done.value.code == 0
    rows = pq.read_table(out).to_pylist()
    assert [r["data_source"] for r in rows] == ["deepmath_103k", "aime"]
    assert rows[0]["prompt"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["4", "7"]
    assert rows[1]["extra_info"]["question"] == "3+4?"


def test_a_row_without_the_named_column_is_an_error_naming_file_and_row(tmp_path):
    src = _jsonl(tmp_path / "d.jsonl", [{"prompt": "q", "ground_truth": "1"}, {"prompt": "q2"}])
    with pytest.raises(UserError, match=r"d.jsonl row 1: no 'ground_truth' column"):
        foreign_json.convert(
            [src],
            tmp_path / "o.parquet",
            split="train",
            prompt_key="prompt",
            messages_key=None,
            answer_key="ground_truth",
            data_source="d",
            tag_key="tag",
            system_prompt=None,
            ability="math",
            answer_mark=None,
        )


def test_the_printed_command_writes_what_the_recipe_names_and_the_paths_check(tmp_path, tiny_lm_path):
    tasks = tmp_path / "tasks"
    _jsonl(tasks / "train.jsonl", [{"question": f"{i}+1?", "answer": f"so #### {i + 1}"} for i in range(8)])
    _jsonl(tasks / "test.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    cfg = tmp_path / "trinity.yaml"
    cfg.write_text(f"""
project: p
name: n
checkpoint_root_dir: {tmp_path}/ckpt
algorithm: {{algorithm_type: grpo, repeat_times: 2}}
model: {{model_path: {tiny_lm_path}, max_prompt_tokens: 32, max_response_tokens: 8}}
cluster: {{node_num: 1, gpu_per_node: 1}}
buffer:
  batch_size: 4
  explorer_input:
    taskset: {{name: arith, path: {tasks}, split: train, format: {{prompt_key: question, response_key: answer}}}}
    eval_tasksets:
    - {{name: arith_eval, path: {tasks}, split: test, format: {{prompt_key: question, response_key: answer}}}}
explorer:
  rollout_model: {{engine_type: vllm}}
""")
    result, out = import_to("trinity", cfg, tmp_path / "recipe.yaml")
    commands = [n.split(" with: ", 1)[1] for n in result.notes if "data_prep/foreign_json.py" in n]
    assert len(commands) == 2
    first, second = (shlex.split(c) for c in commands)
    assert first[:2] == second[:2] == ["python", "data_prep/foreign_json.py"]
    # the first as a user runs it (the script), the second in this process (the same main)
    done = subprocess.run(
        [sys.executable, *first[1:], "--final-answer-after", "####"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    with pytest.raises(SystemExit) as finished:
        foreign_json.main([*second[2:], "--final-answer-after", "####"])
    assert finished.value.code == 0
    train = pq.read_table(tasks / "train.parquet").to_pylist()
    assert len(train) == 8 and train[3]["reward_model"]["ground_truth"] == "4"
    assert train[0]["data_source"] == "arith"
    # the recipe names exactly those files; with the hf engine (no vLLM here) its paths check
    rc = load_recipe(out, ["actor_rollout_ref.rollout.name=hf"], check_paths=True)
    assert rc.backend.data.train_files == str(tasks / "train.parquet")


def test_sft_conversations_become_rows_the_sft_dataset_reads(tmp_path, tiny_lm_path):
    """--sft (a Trinity SFT experience buffer, a ROLL SFT file): the conversations, with their tools, as verl's SFT
    rows; verl-npu's SFT dataset tokenizes them (the loss on the assistant's tokens)."""
    from verl_npu.config.sft import Node
    from verl_npu.config.sft_schema import defaults_tree
    from verl_npu.data.sft_dataset import SFTDataset
    from verl_npu.models.loading import load_tokenizer_and_processor

    chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    src = _jsonl(tmp_path / "sft" / "train.jsonl", [{"conv": chat}, {"conv": json.dumps(chat), "tools": []}])
    out = tmp_path / "sft.parquet"
    with pytest.raises(SystemExit) as done:
        foreign_json.main(
            ["trinity", "--sft", "--input", str(src.parent), "--messages-key", "conv", "--output", str(out)]
        )
    assert done.value.code == 0
    rows = pq.read_table(out).to_pylist()
    assert [r["messages"] for r in rows] == [chat, chat] and rows[1]["tools"] == "[]"
    tokenizer, _ = load_tokenizer_and_processor(str(tiny_lm_path))
    data = SFTDataset(
        [str(out)], tokenizer, Node("backend_config.data", {**defaults_tree()["data"], "max_length": 128})
    )
    assert len(data) == 2 and all(sum(row.loss_mask) > 0 for row in data.rows)
    with pytest.raises(UserError, match=r"train.jsonl row 0: no 'messages' column"):
        foreign_json.convert_sft([src], tmp_path / "o.parquet", "messages")
