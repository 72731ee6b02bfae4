"""Preprocessing to RL parquet: geometry3k (local HF-format fixture and --synthetic) and gsm8k."""

from __future__ import annotations

import io
import os
import re
import runpy
import socket
import subprocess
import sys
import types
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from verl_npu.data import geometry3k, gsm8k, synthetic_geometry
from verl_npu.errors import UserError

REPO = Path(__file__).resolve().parents[2]
RL_COLUMNS = ["data_source", "prompt", "images", "ability", "reward_model", "extra_info"]
HF_IMAGES = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))


def png(size=(40, 30), colour=(10, 200, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def write_hf_split(path: Path, rows: list[dict]) -> None:
    """Rows in the Hugging Face geometry3k parquet layout (images as {bytes, path} structs, extra columns)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "images": pa.array([[{"bytes": b, "path": None} for b in r["images"]] for r in rows], type=HF_IMAGES),
            "problem": [r["problem"] for r in rows],
            "answer": [r["answer"] for r in rows],
            "id": [str(i) for i in range(len(rows))],
        }
    )
    pq.write_table(table, path)


def hf_fixture(root: Path, bad_train_row: dict | None = None) -> Path:
    train = [
        {"images": [png((40, 30))], "problem": "<image>Find x. Line AB is 3.", "answer": "3"},
        {"images": [png((64, 64), (200, 0, 0))], "problem": "<image>Find the area.", "answer": "\\frac{1}{2}"},
        {"images": [png(), png((20, 50))], "problem": "<image>Compare with <image>. Find y.", "answer": "12"},
    ]
    if bad_train_row is not None:
        train.insert(1, bad_train_row)
    write_hf_split(root / "data" / "train-00000-of-00001.parquet", train)
    write_hf_split(
        root / "data" / "test-00000-of-00001.parquet",
        [{"images": [png((30, 30))], "problem": "<image>What is z?", "answer": "7"}],
    )
    write_hf_split(
        root / "data" / "validation-00000-of-00001.parquet",
        [{"images": [png()], "problem": "<image>unused", "answer": "1"}],
    )
    return root


def check_rl_file(path: str, data_source: str, split: str) -> list[dict]:
    """Assert the verl RL schema on one output file and return its rows."""
    table = pq.read_table(path)
    assert table.column_names == RL_COLUMNS
    rows = table.to_pylist()
    for i, row in enumerate(rows):
        assert row["data_source"] == data_source
        assert row["ability"] == "math"
        [message] = row["prompt"]
        assert message["role"] == "user"
        problem = row["extra_info"]["question"]
        if data_source == "synthetic_geometry":  # short prompt for tiny CPU models
            assert message["content"] == problem + " " + geometry3k.SYNTHETIC_INSTRUCTION
        else:
            assert message["content"] == problem + " " + geometry3k.INSTRUCTION
            assert "<think>" in message["content"] and "\\boxed{}" in message["content"]
        assert problem.count("<image>") == len(row["images"]) >= 1
        for img in row["images"]:
            Image.open(io.BytesIO(img["bytes"])).load()  # stored as encoded bytes that decode
        assert row["reward_model"] == {"style": "rule", "ground_truth": row["extra_info"]["answer"]}
        assert row["extra_info"]["split"] == split
        assert row["extra_info"]["index"] == i
    return rows


def test_local_hf_fixture_converts_to_rl_schema(tmp_path, capsys):
    src = hf_fixture(tmp_path / "src")
    geometry3k.main(["--local-dataset-path", str(src), "--local-save-dir", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "train: 3 rows, 4 images" in out and "test: 1 rows, 1 images" in out
    assert str(tmp_path / "out" / "train.parquet") in out
    train = check_rl_file(str(tmp_path / "out" / "train.parquet"), "hiyouga/geometry3k", "train")
    check_rl_file(str(tmp_path / "out" / "test.parquet"), "hiyouga/geometry3k", "test")
    assert not (tmp_path / "out" / "validation.parquet").exists()
    assert [r["reward_model"]["ground_truth"] for r in train] == ["3", "\\frac{1}{2}", "12"]
    # The source bytes are kept as they are: same pixels, same size.
    assert Image.open(io.BytesIO(train[1]["images"][0]["bytes"])).size == (64, 64)
    assert Image.open(io.BytesIO(train[2]["images"][1]["bytes"])).size == (20, 50)


def test_save_to_disk_arrow_folder_is_read(tmp_path):
    root = tmp_path / "saved"
    for split, n in (("train", 2), ("test", 1)):
        table = pa.table(
            {
                "images": pa.array([[{"bytes": png(), "path": None}]] * n, type=HF_IMAGES),
                "problem": ["<image>q"] * n,
                "answer": ["5"] * n,
            }
        )
        (root / split).mkdir(parents=True)
        with pa.OSFile(str(root / split / "data-00000-of-00001.arrow"), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
    result = geometry3k.prepare(tmp_path / "out", str(root), progress=False)
    assert result["rows"] == {"train": 2, "test": 1}
    check_rl_file(result["paths"]["train"], "hiyouga/geometry3k", "train")


@pytest.mark.parametrize(
    "bad_row, expected",
    [
        (
            {"images": [png()], "problem": "<image> and <image>?", "answer": "1"},
            "2 <image> placeholder(s) but the row has 1",
        ),
        ({"images": [b"not an image"], "problem": "<image>q", "answer": "1"}, "image 0: image bytes do not decode"),
        ({"images": [png()], "problem": "<image>q", "answer": ""}, "'answer' is empty"),
    ],
)
def test_bad_row_is_named_or_skipped_and_counted(tmp_path, capsys, bad_row, expected):
    src = hf_fixture(tmp_path / "src", bad_train_row=bad_row)
    with pytest.raises(SystemExit) as exc:
        geometry3k.main(["--local-dataset-path", str(src), "--local-save-dir", str(tmp_path / "out")])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert expected in err
    assert "split train" in err and "train-00000-of-00001.parquet row 1" in err and "--skip-bad-rows" in err
    assert "Traceback" not in err

    geometry3k.main(["--local-dataset-path", str(src), "--local-save-dir", str(tmp_path / "out"), "--skip-bad-rows"])
    assert "train: 3 rows, 4 images, 1 bad row(s) skipped" in capsys.readouterr().out
    assert pq.read_metadata(tmp_path / "out" / "train.parquet").num_rows == 3


def test_missing_column_and_missing_split_name_the_file(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    pq.write_table(pa.table({"problem": ["<image>q"], "answer": ["1"]}), root / "train.parquet")
    pq.write_table(pa.table({"problem": ["<image>q"], "answer": ["1"]}), root / "test.parquet")
    with pytest.raises(UserError, match=r"train.parquet: missing column\(s\) 'images'"):
        geometry3k.prepare(tmp_path / "out", str(root), progress=False)
    (root / "test.parquet").unlink()
    with pytest.raises(UserError, match="has no test split"):
        geometry3k.prepare(tmp_path / "out", str(root), progress=False)
    with pytest.raises(UserError, match="does not exist"):
        geometry3k.prepare(tmp_path / "out", str(tmp_path / "nope"), progress=False)


def test_hub_unreachable_or_datasets_missing_points_to_offline_options(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(UserError, match="use --local-dataset-path DIR or --synthetic N"):
        geometry3k.hub_splits("hiyouga/geometry3k", ("train", "test"))

    def offline(*args, **kwargs):
        raise ConnectionError("hub unreachable")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with socket.socket() as server:  # a hub that answers: datasets' own error is passed on
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        with pytest.raises(
            UserError, match=r"ConnectionError: hub unreachable.*--local-dataset-path DIR.*--synthetic N"
        ):
            geometry3k.prepare("/tmp/unused", None, progress=False)
    # a hub that does not answer: named as such (datasets read only its empty cache)
    with pytest.raises(
        UserError,
        match=r"the hub cannot be reached \(no connection to 127.0.0.1:\d+ .*\) and the "
        r"datasets cache has no copy.*--local-dataset-path DIR.*--synthetic N",
    ):
        geometry3k.prepare("/tmp/unused", None, progress=False)


def test_synthetic_output_passes_schema_is_balanced_and_deterministic(tmp_path):
    result = geometry3k.prepare_synthetic(tmp_path / "a", n_train=24, n_test=8, seed=3, image_size=48)
    assert result["rows"] == {"train": 24, "test": 8} and result["images"] == {"train": 24, "test": 8}
    assert result["train"] == result["paths"]["train"] == str(tmp_path / "a" / "train.parquet")
    train = check_rl_file(result["paths"]["train"], "synthetic_geometry", "train")
    test = check_rl_file(result["paths"]["test"], "synthetic_geometry", "test")
    assert Counter(r["reward_model"]["ground_truth"] for r in train) == {"3": 6, "4": 6, "5": 6, "6": 6}
    assert Counter(r["reward_model"]["ground_truth"] for r in test) == {"3": 2, "4": 2, "5": 2, "6": 2}
    for r in train:
        assert Image.open(io.BytesIO(r["images"][0]["bytes"])).size == (48, 48)
    # Same seed -> same bytes; another seed -> other pictures; train and test pictures differ.
    again = geometry3k.prepare_synthetic(tmp_path / "b", 24, 8, seed=3, image_size=48)
    assert Path(again["paths"]["train"]).read_bytes() == Path(result["paths"]["train"]).read_bytes()
    other = pq.read_table(geometry3k.prepare_synthetic(tmp_path / "c", 24, 8, seed=4, image_size=48)["paths"]["train"])
    assert other.column("images").to_pylist() != [r["images"] for r in train]
    train_images = {r["images"][0]["bytes"] for r in train}
    assert not train_images & {r["images"][0]["bytes"] for r in test}


def test_synthetic_pictures_show_the_answer():
    """Each picture holds its kind's colour (the answer's cue) and a grey background."""
    rows = synthetic_geometry.generate_rows(12, seed=0, image_size=56)
    colour_of = {str(k.sides): k.colour for k in synthetic_geometry.POLYGON_KINDS}
    for row in rows:
        pixels = np.asarray(row["images"][0]).reshape(-1, 3)
        colours = Counter(map(tuple, pixels))
        assert colours[synthetic_geometry.BACKGROUND] > 0.2 * len(pixels)
        assert colours[colour_of[row["answer"]]] > 0.07 * len(pixels)  # a filled polygon, not a speck
        others = {k.colour for k in synthetic_geometry.POLYGON_KINDS} - {colour_of[row["answer"]]}
        assert not any(colours[c] for c in others)
    # More sides at equal radius -> more of the circle covered: the shape really differs per kind.
    vertices = synthetic_geometry.polygon_vertices(6, (0.0, 0.0), 1.0, 0.0)
    assert len(vertices) == 6 and vertices[0] == pytest.approx((1.0, 0.0))


def test_synthetic_cli_defaults_test_rows_and_rejects_bad_sizes(tmp_path, capsys):
    geometry3k.main(["--synthetic", "9", "--local-save-dir", str(tmp_path), "--seed", "1"])
    assert "train: 9 rows" in capsys.readouterr().out
    assert pq.read_metadata(tmp_path / "test.parquet").num_rows == 2  # 9 // 4
    with pytest.raises(SystemExit):
        geometry3k.main(["--synthetic", "4", "--image-size", "8", "--local-save-dir", str(tmp_path / "other")])
    assert "--image-size must be at least 16" in capsys.readouterr().err


def test_gsm8k_local_fixture(tmp_path, capsys):
    src = tmp_path / "gsm"
    src.mkdir()
    q = ["Tom has 3 apples and buys 1,231 more. How many?", "What is 2+2?"]
    a = ["3 + 1231 = 1234\n#### 1,234", "2+2=4\n#### 4"]
    pq.write_table(pa.table({"question": q, "answer": a}), src / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"question": q[:1], "answer": a[:1]}), src / "test-00000-of-00001.parquet")
    gsm8k.main(["--local-dataset-path", str(src), "--local-save-dir", str(tmp_path / "out")])
    assert "train: 2 rows, 0 images" in capsys.readouterr().out
    table = pq.read_table(tmp_path / "out" / "train.parquet")
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    rows = table.to_pylist()
    assert rows[0]["data_source"] == "openai/gsm8k"
    assert rows[0]["reward_model"] == {"style": "rule", "ground_truth": "1234"}
    assert rows[0]["prompt"][0]["content"] == q[0] + " " + gsm8k.INSTRUCTION
    assert rows[1]["extra_info"] == {"split": "train", "index": 1, "answer": a[1], "question": q[1]}

    pq.write_table(pa.table({"question": q, "answer": [a[0], "no final answer"]}), src / "train-00000-of-00001.parquet")
    with pytest.raises(UserError, match=r"split train, .*row 1: 'answer' has no '####'"):
        gsm8k.prepare(tmp_path / "out2", str(src), progress=False)


def test_data_prep_script_runs_and_reports_errors_without_traceback(tmp_path):
    ok = subprocess.run(
        [
            sys.executable,
            str(REPO / "data_prep" / "geometry3k.py"),
            "--synthetic",
            "4",
            "--local-save-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "train.parquet").exists() and "test: 1 rows" in ok.stdout
    bad = subprocess.run(
        [sys.executable, str(REPO / "data_prep" / "gsm8k.py"), "--local-dataset-path", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1
    assert "error: --local-dataset-path" in bad.stderr and "Traceback" not in bad.stderr


# ------------------------------------------------------------------ verl's spellings, --dry-run, geo3k.py
@pytest.mark.parametrize("save_flag", ["--local-save-dir", "--local_save_dir", "--local_dir"])
def test_verl_underscore_spellings_are_accepted(tmp_path, capsys, save_flag):
    src = hf_fixture(tmp_path / "src")
    geometry3k.main(["--local_dataset_path", str(src), save_flag, str(tmp_path / "geo")])
    assert "train: 3 rows, 4 images" in capsys.readouterr().out
    assert (tmp_path / "geo" / "train.parquet").is_file()
    gsm = tmp_path / "gsm"
    gsm.mkdir()
    for split in ("train", "test"):
        pq.write_table(pa.table({"question": ["q?"], "answer": ["x\n#### 5"]}), gsm / f"{split}.parquet")
    gsm8k.main(["--local_dataset_path", str(gsm), save_flag, str(tmp_path / "gsm_out")])
    assert pq.read_table(tmp_path / "gsm_out" / "train.parquet").to_pylist()[0]["reward_model"]["ground_truth"] == "5"
    args = gsm8k.build_parser().parse_args([save_flag, "d", "--synthetic_test", "3", "--skip_bad_rows", "--dry_run"])
    assert (args.local_save_dir, args.synthetic_test, args.skip_bad_rows, args.dry_run) == ("d", 3, True, True)


@pytest.mark.parametrize("module", [geometry3k, gsm8k])
def test_dry_run_reads_and_writes_nothing(tmp_path, capsys, monkeypatch, module):
    monkeypatch.setitem(sys.modules, "datasets", None)  # a hub download would fail loudly
    out_dir = tmp_path / "out"
    for argv, says in (
        (["--local-save-dir", str(out_dir)], "from the Hugging Face hub"),
        (
            ["--local_dataset_path", str(tmp_path / "missing"), "--local_dir", str(out_dir)],
            f"convert the local copy {tmp_path / 'missing'}",
        ),
        (["--synthetic", "8", "--local-save-dir", str(out_dir)], "generate 8 train / 2 test synthetic"),
    ):
        module.main([*argv, "--dry-run"])
        out = capsys.readouterr().out
        assert out.startswith("dry run: would ") and says in out, out
        assert f"write {out_dir / 'train.parquet'}, {out_dir / 'test.parquet'}" in out
    assert not out_dir.exists()
    with pytest.raises(SystemExit) as exc:
        module.main(["--dry-run", "--no-such-flag"])
    assert exc.value.code == 2


def test_geo3k_py_is_verls_name_for_geometry3k_py(tmp_path, capsys, monkeypatch):
    """`python data_prep/geo3k.py --local_save_dir DIR` (verl's file and flag names) works as typed."""
    ok = subprocess.run(
        [sys.executable, str(REPO / "data_prep" / "geo3k.py"), "--synthetic", "4", "--local_save_dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    check_rl_file(str(tmp_path / "train.parquet"), "synthetic_geometry", "train")
    helps = []
    monkeypatch.syspath_prepend(str(REPO / "data_prep"))  # what `python data_prep/x.py` puts on sys.path
    for name in ("geo3k.py", "geometry3k.py"):  # in this process: a second interpreter start costs seconds
        monkeypatch.setattr(sys, "argv", [name, "--help"])
        with pytest.raises(SystemExit) as exc:
            runpy.run_path(str(REPO / "data_prep" / name), run_name="__main__")
        assert exc.value.code == 0
        helps.append(capsys.readouterr().out)
    assert helps[0] == helps[1] and "--local_save_dir" in helps[0] and "--local_dir" in helps[0]


def test_data_prep_with_a_python_lacking_the_project_names_the_python_to_use():
    """`python data_prep/x.py` with the system Python (no verl_npu): one line naming the missing package
    and the project's Python, no traceback. `-S` leaves out site-packages, where the project is installed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # -S keeps PYTHONPATH, which may hold the project
    for name in ("geometry3k.py", "gsm8k.py", "geo3k.py", "search_r1.py"):
        res = subprocess.run(
            [sys.executable, "-S", str(REPO / "data_prep" / name), "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert res.returncode == 1, res
        assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1, res.stderr
        assert f"data_prep/{name}: this Python ({sys.executable}) cannot import 'verl_npu'" in res.stderr
        assert f"data_prep/{name} ..." in res.stderr and "source .venv/bin/activate" in res.stderr


def test_unreachable_hub_is_named_in_seconds_not_after_retries(monkeypatch):
    """A dead network is found by one TCP connect (the hub's host from HF_ENDPOINT); HF_HUB_OFFLINE is a
    reason too; a listening host is reachable. A model id then fails at once, naming why."""
    from verl_npu import hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connecting is refused
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        reason = hub.unreachable_reason()
        assert reason is not None and f"no connection to 127.0.0.1:{port}" in reason
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub.unreachable_reason() is None
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.unreachable_reason() == "HF_HUB_OFFLINE is set"
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HUB_CACHE", str(REPO / "tests" / "no-such-cache"))
    with pytest.raises(hub.HubIdMissing, match="the hub cannot be reached: no connection to 127.0.0.1"):
        hub.hub_folder("nobody/no-such-model")


# ------------------------------------------------------------------ gsm8k --synthetic
def test_gsm8k_synthetic_rows_are_gsm8k_source_rows_with_right_answers():
    from verl_npu.data import synthetic_arithmetic

    rows = synthetic_arithmetic.generate_rows(100, seed=5)
    numbers = Counter()
    for row in rows:
        assert set(row) == {"question", "answer"}
        [a] = (int(n) for n in re.findall(r"\d+", row["question"]))  # one number; the change is the word "one"
        assert "one more" in row["question"]
        numbers[a] += 1
        assert row["answer"] == f"{a} + 1 = {a + 1}\n#### {a + 1}"
        assert gsm8k.final_answer(row["answer"]) == str(a + 1)  # GSM8K's own answer parsing
    assert numbers == {a: 20 for a in range(1, 6)}  # balanced: a question-blind policy gets 1 in 5
    assert synthetic_arithmetic.generate_rows(100, seed=5) == rows
    assert synthetic_arithmetic.generate_rows(100, seed=6) != rows
    test_rows = synthetic_arithmetic.generate_rows(100, 5, "test")
    assert [r["question"] for r in test_rows] != [r["question"] for r in rows]
    wider = synthetic_arithmetic.generate_rows(16, 0, max_number=8)
    assert {r["answer"][-1] for r in wider} == {str(k) for k in range(2, 10)}
    with pytest.raises(ValueError, match="max_number"):
        synthetic_arithmetic.generate_rows(4, 0, max_number=9)


def test_gsm8k_synthetic_cli_writes_rl_parquet(tmp_path, capsys):
    gsm8k.main(["--synthetic", "18", "--seed", "2", "--local-save-dir", str(tmp_path / "a")])
    out = capsys.readouterr().out
    assert "train: 18 rows, 0 images" in out and "test: 4 rows, 0 images" in out  # 18 // 4
    table = pq.read_table(tmp_path / "a" / "train.parquet")
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    for i, row in enumerate(table.to_pylist()):
        assert row["data_source"] == "synthetic_arithmetic" and row["ability"] == "math"
        question = row["extra_info"]["question"]
        assert row["prompt"] == [{"role": "user", "content": question + " " + gsm8k.SYNTHETIC_INSTRUCTION}]
        assert "####" in gsm8k.SYNTHETIC_INSTRUCTION
        assert row["reward_model"] == {"style": "rule", "ground_truth": row["extra_info"]["answer"].split("#### ")[1]}
        assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == i
    gsm8k.main(["--synthetic", "18", "--seed", "2", "--synthetic-test", "5", "--local_dir", str(tmp_path / "b")])
    assert (tmp_path / "b" / "train.parquet").read_bytes() == (tmp_path / "a" / "train.parquet").read_bytes()
    assert pq.read_metadata(tmp_path / "b" / "test.parquet").num_rows == 5
    with pytest.raises(SystemExit) as exc:
        gsm8k.main(["--synthetic", "4", "--local-dataset-path", str(tmp_path), "--local-save-dir", str(tmp_path / "c")])
    assert exc.value.code == 1 and "exclude each other" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gsm8k.main(["--synthetic", "0", "--local-save-dir", str(tmp_path / "d")])
    assert "at least 1 train" in capsys.readouterr().err
