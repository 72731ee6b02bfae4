"""Issue 13, data side: nothing written into the user's data folders, reward errors that name the
dataset row (non-numeric returns, sys.exit, hangs), clean errors for incomplete model folders, a
data position that survives a batch-size change, and every image checked before training."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from run_helpers import cli_env, data_cfg, png, rl_row

from verl_npu.config import check_paths, load_recipe
from verl_npu.data import RLDataset, StatefulBatchLoader
from verl_npu.data.geometry3k import write_rl_parquet
from verl_npu.errors import UserError
from verl_npu.rewards import RewardFunction, RewardScorer, load_reward_fn

REPO = Path(__file__).resolve().parents[2]


def _snapshot(folder: Path) -> dict[str, str]:
    """name -> sha256 of every file under ``folder``."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def vl_processor(tiny_vl_path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_vl_path)


@pytest.fixture(scope="module")
def text_tokenizer(tiny_lm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_lm_path)


# ============================================================== 1. run never writes into the user's folders
def _user_data(folder: Path) -> dict[str, str]:
    from verl_npu.data.geometry3k import prepare_synthetic

    prepare_synthetic(folder, n_train=8, n_test=4, seed=5, image_size=56)
    (folder / "notes.txt").write_text("mine")
    return _snapshot(folder)


@pytest.mark.slow
def test_typo_in_data_path_fails_cleanly_and_leaves_user_files_alone(tmp_path, tiny_cache):
    """The issue's case: `run` with a tiny:// model and a typo'd train path next to the user's real
    files used to write 512 synthetic rows over train.parquet, drop test.parquet and exit 0."""
    data = tmp_path / "mydata"
    data.mkdir()
    before = _user_data(data)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl_npu.cli",
            "run",
            "tiny_geo3k",
            "af_output_dir=out",
            "data.train_files=mydata/trian.parquet",
            "data.val_files=mydata/test.parquet",
            "trainer.total_training_steps=1",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=cli_env(VERL_NPU_CACHE=str(tiny_cache)),
        timeout=120,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "backend_config.data.train_files" in out.stderr and "mydata/trian.parquet" in out.stderr
    assert "does not exist" in out.stderr and "Traceback" not in out.stderr
    assert _snapshot(data) == before  # same names, same bytes
    # the same words as `validate --check-paths`
    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl_npu.cli",
            "validate",
            "tiny_geo3k",
            "af_output_dir=out",
            "data.train_files=mydata/trian.parquet",
            "data.val_files=mydata/test.parquet",
            "--check-paths",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=cli_env(VERL_NPU_CACHE=str(tiny_cache)),
        timeout=120,
    )
    assert check.returncode == 1
    line = next(x for x in check.stderr.splitlines() if "data.train_files" in x)
    assert line in out.stderr


def test_demo_assets_only_for_the_demos_own_paths(tmp_path, monkeypatch, tiny_cache):
    from verl_npu import demo
    from verl_npu.demo import may_make_demo_data, prepare_assets

    monkeypatch.setattr(demo, "DEMO_TRAIN_ROWS", 16)  # the demo's 512 rows take seconds
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "mydata"
    data.mkdir()
    before = _user_data(data)
    user = ["af_output_dir=out", "data.train_files=mydata/trian.parquet", "data.val_files=mydata/test.parquet"]
    rc = load_recipe("tiny_geo3k", user)
    assert not may_make_demo_data(rc)
    assert prepare_assets(rc) == []
    assert _snapshot(data) == before
    problems = check_paths(rc)
    assert [p.key for p in problems] == ["backend_config.data.train_files"]

    # the demo's own default paths (relative to the current folder): made on first use
    demo = load_recipe("tiny_geo3k", ["af_output_dir=out"])
    assert may_make_demo_data(demo)
    made = prepare_assets(demo)
    assert any("synthetic geometry data" in line for line in made)
    demo_dir = tmp_path / "data" / "tiny_geo3k"
    assert sorted(p.name for p in demo_dir.iterdir()) == ["test.parquet", "train.parquet"]  # no scratch left
    assert pq.ParquetFile(demo_dir / "train.parquet").metadata.num_rows == 16
    # only a missing file is written again: the existing one keeps its bytes
    train_bytes = (demo_dir / "train.parquet").read_bytes()
    (demo_dir / "test.parquet").unlink()
    prepare_assets(demo)
    assert (demo_dir / "train.parquet").read_bytes() == train_bytes and (demo_dir / "test.parquet").is_file()
    assert check_paths(demo) == []


def test_demo_data_of_an_older_version_is_named_with_the_fix(tmp_path, monkeypatch, tiny_cache, caplog):
    """`run` never replaces a data file, so demo data made by an older verl-npu (other pictures) stays:
    the run says so, naming the file and the folder to delete. Current data gets no warning."""
    from verl_npu import demo
    from verl_npu.demo import prepare_assets

    monkeypatch.setattr(demo, "DEMO_TRAIN_ROWS", 16)
    monkeypatch.chdir(tmp_path)
    rc = load_recipe("tiny_geo3k", ["af_output_dir=out"])
    with caplog.at_level("WARNING", logger="verl_npu"):
        prepare_assets(rc)
    assert "older verl-npu" not in caplog.text
    train = tmp_path / "data" / "tiny_geo3k" / "train.parquet"
    pq.write_table(pq.read_table(train).replace_schema_metadata(None), train)  # as an older version wrote it
    caplog.clear()
    with caplog.at_level("WARNING", logger="verl_npu"):
        prepare_assets(rc)
    assert "data/tiny_geo3k/train.parquet was made by an older verl-npu" in caplog.text
    assert "Delete data/tiny_geo3k to have it made again" in caplog.text
    assert "test.parquet was made" not in caplog.text


def test_demo_data_flag_writes_only_missing_files(tmp_path, monkeypatch, tiny_cache):
    from verl_npu import demo
    from verl_npu.cli import build_parser
    from verl_npu.demo import prepare_assets

    monkeypatch.setattr(demo, "DEMO_TRAIN_ROWS", 16)
    assert build_parser().parse_args(["run", "x", "--demo-data"]).demo_data is True
    assert build_parser().parse_args(["run", "x"]).demo_data is False
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "mydata"
    data.mkdir()
    before = _user_data(data)
    rc = load_recipe(
        "tiny_geo3k",
        ["af_output_dir=out", "data.train_files=mydata/new_train.parquet", "data.val_files=mydata/test.parquet"],
    )
    prepare_assets(rc, demo_data=True)
    after = _snapshot(data)
    assert {k: after[k] for k in before} == before  # every file of the user's unchanged
    assert set(after) - set(before) == {"new_train.parquet"}
    # a real (non-tiny) model never gets data made up, flag or not
    real = load_recipe(
        "tiny_geo3k",
        [
            "af_output_dir=out",
            "data.train_files=mydata/x.parquet",
            "data.val_files=mydata/test.parquet",
            f"actor_rollout_ref.model.path={data}",
        ],
    )
    assert prepare_assets(real, demo_data=True) == []
    assert not (data / "x.parquet").exists()


# ============================================================== 2. rewards
def _reward_file(tmp_path: Path, body: str, name: str = "reward.py") -> Path:
    f = tmp_path / name
    f.write_text(body)
    return f


ROWS = ["data file /d/train.parquet row 5"]


@pytest.mark.parametrize(
    "returned, shown",
    [
        ('"1"', "'1' (str)"),
        ("None", "None (NoneType)"),
        ("[1.0]", "[1.0] (list)"),
        ("{'score': '0.5'}", "a dict whose 'score' is '0.5' (str)"),
        ("1j", "1j (complex)"),
    ],
)
def test_non_numeric_reward_names_function_row_and_value(tmp_path, returned, shown):
    f = _reward_file(
        tmp_path,
        f"def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return {returned}\n",
    )
    scorer = RewardScorer(load_reward_fn({"path": str(f)}))
    with pytest.raises(UserError) as err:
        scorer.score(["resp"], ["src"], ["1"], [{}], rows=ROWS)
    msg = str(err.value)
    assert f"compute_score in {f}" in msg and "data file /d/train.parquet row 5" in msg
    assert f"returned {shown}, not a number" in msg


def test_bool_and_numpy_torch_scalars_are_numbers():
    import numpy as np

    values = [True, False, np.float32(0.5), np.int64(2), torch.tensor(0.25), np.bool_(True), 3]
    scores, _ = RewardScorer(lambda s, r, g, e=None: values[int(r)]).score(
        [str(i) for i in range(len(values))], ["s"] * len(values), ["g"] * len(values)
    )
    assert scores == [1.0, 0.0, 0.5, 2.0, 0.25, 1.0, 3.0]
    with pytest.raises(UserError, match=r"returned tensor\(\[1\., 2\.\]\)"):
        RewardScorer(lambda *a: torch.tensor([1.0, 2.0])).score(["x"], ["s"], ["g"])


@pytest.mark.parametrize("body", ["import sys\n    sys.exit(3)", "raise SystemExit(3)"])
def test_sys_exit_in_a_reward_is_reported_with_the_row(tmp_path, body):
    f = _reward_file(
        tmp_path, f"def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    {body}\n"
    )
    with pytest.raises(UserError) as err:  # not SystemExit: the run would end with no message
        RewardScorer(load_reward_fn({"path": str(f)})).score(["x"], ["s"], ["g"], [{}], rows=ROWS)
    msg = str(err.value)
    assert "called sys.exit(3)" in msg and "row 5" in msg and f"compute_score in {f}" in msg


HANGS = {
    "sleep": "import time\n    time.sleep(60)",
    "busy loop": "while True:\n        pass",
    "catastrophic regex": "import re\n    re.match(r'(a+)+$', 'a' * 40 + 'b')",
    "swallows the first alarm": "import time\n    try:\n        time.sleep(60)\n    except BaseException:\n"
    "        time.sleep(60)",
}


@pytest.mark.parametrize("kind", list(HANGS))
def test_a_hanging_reward_times_out_with_the_row(tmp_path, kind):
    f = _reward_file(
        tmp_path, f"def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    {HANGS[kind]}\n"
    )
    fn = load_reward_fn({"path": str(f), "timeout_s": 0.3})
    assert fn.timeout_s == 0.3
    handler_before = signal.getsignal(signal.SIGALRM)
    start = time.monotonic()
    with pytest.raises(UserError) as err:
        RewardScorer(fn).score(["x"], ["s"], ["g"], [{}], rows=ROWS)
    assert time.monotonic() - start < 5
    msg = str(err.value)
    assert "did not return within custom_reward_function.timeout_s=0.3 s" in msg and "row 5" in msg
    assert signal.getsignal(signal.SIGALRM) == handler_before  # the alarm is put back as it was
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0 or handler_before is not signal.SIG_DFL


def test_timeout_outside_the_main_thread_and_outer_timer_kept():
    def slow(*a):
        time.sleep(30)

    box = {}

    def in_thread():
        try:
            RewardScorer(RewardFunction(slow, "slow", 0.3)).score(["x"], ["s"], ["g"], rows=[7])
        except UserError as e:
            box["err"] = str(e)

    t = threading.Thread(target=in_thread)
    t.start()
    t.join(10)
    assert "dataset row 7" in box["err"] and "timeout_s=0.3" in box["err"]
    # a timer set by someone else (pytest-timeout, say) survives a scored batch
    previous = signal.setitimer(signal.ITIMER_REAL, 50.0)
    try:
        RewardScorer(RewardFunction(lambda *a: 1.0, "one", 5.0)).score(["x"], ["s"], ["g"])
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 45 < left <= 50
    finally:
        signal.setitimer(signal.ITIMER_REAL, *previous)
    # null disables the limit
    assert load_reward_fn({"path": None, "timeout_s": None}).timeout_s is None
    with pytest.raises(UserError, match="timeout_s must be a positive number"):
        load_reward_fn({"timeout_s": 0})


def test_trainer_scoring_names_the_file_row_not_the_batch_position(tmp_path, text_tokenizer):
    """The dataset carries each row's file and row through rollout (repeat) to the reward call;
    extra_info.index (the source dataset's index) is a different number."""
    from verl_npu.batch import Batch
    from verl_npu.trainer.ppo import PPOTrainer

    path = tmp_path / "train.parquet"
    rows = [rl_row(f"q{i}", None, "boom" if i == 5 else str(i), "openai/gsm8k", index=100 + i) for i in range(8)]
    write_rl_parquet(rows, path, with_images=False)
    ds = RLDataset(str(path), text_tokenizer, None, data_cfg())
    assert ds[5]["data_row"] == f"data file {path} row 5" and ds[5]["extra_info"]["index"] == 105
    loader = StatefulBatchLoader(ds, 8, shuffle=True, seed=0)
    prompts = next(iter(loader))  # the loader yields a Batch
    position = prompts["index"].index(5)
    assert position != 5  # the batch position is not the row
    batch = prompts.repeat_interleave(2)  # what a rollout with n=2 does
    batch.set("responses", torch.ones(len(batch), 2, dtype=torch.long))
    batch.set("response_mask", torch.ones(len(batch), 2, dtype=torch.long))

    def reward(data_source, solution_str, ground_truth, extra_info=None):
        if ground_truth == "boom":
            raise ValueError("cannot parse")
        return 0.0

    trainer = SimpleNamespace(
        tokenizer=text_tokenizer,
        reward_scorer=RewardScorer(RewardFunction(reward, "reward")),
        workers=SimpleNamespace(roles=["actor"], serves=lambda method: False),
    )  # no reward model role
    trainer.decode_responses = lambda b: PPOTrainer.decode_responses(trainer, b)
    with pytest.raises(UserError) as err:
        PPOTrainer.score(trainer, batch)
    msg = str(err.value)
    assert f"reward of data file {path} row 5 (data_source 'openai/gsm8k', response {2 * position} of the batch)" in msg
    assert "ValueError: cannot parse" in msg
    assert isinstance(batch, Batch)


@pytest.mark.slow
def test_hanging_reward_in_a_real_run_stops_with_the_row(tmp_path, tiny_cache):
    """A real `verl-npu run` (the reward runs in the controller's main thread): a reward that hangs on
    one row stops the run with an error naming that row, exit status 1, no traceback."""
    data = tmp_path / "gsm"
    data.mkdir()
    rows = [rl_row(f"What is {i} plus 1?", None, str(i + 1), "openai/gsm8k", index=i) for i in range(4)]
    rows[2]["reward_model"]["ground_truth"] = "hang"
    for name in ("train", "test"):
        write_rl_parquet(rows, data / f"{name}.parquet", with_images=False)
    reward = _reward_file(
        tmp_path,
        "import time\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if ground_truth == 'hang':\n"
        "        time.sleep(600)\n"
        "    return 0.0\n",
    )
    overrides = {
        "af_output_dir": tmp_path / "out",
        "data.train_files": data / "train.parquet",
        "data.val_files": data / "test.parquet",
        "data.train_batch_size": 4,
        "data.max_prompt_length": 48,
        "data.max_response_length": 2,
        "actor_rollout_ref.model.path": "tiny://qwen2",
        "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.rollout.n": 2,
        "trainer.total_training_steps": 1,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
        "trainer.logger": "[console]",
        "custom_reward_function.path": reward,
        "custom_reward_function.timeout_s": 2,
    }
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "verl_npu.cli", "run", "tiny_geo3k", *[f"{k}={v}" for k, v in overrides.items()]],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=cli_env(VERL_NPU_CACHE=str(tiny_cache)),
        timeout=120,
    )
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-3000:]
    assert time.monotonic() - start < 60
    assert f"reward of data file {data / 'train.parquet'} row 2" in out.stderr
    assert "timeout_s=2 s" in out.stderr and "Traceback" not in out.stderr


# ============================================================== 3. incomplete model folders
def _copy(src: Path, dst: Path, keep=None, skip=()) -> Path:
    dst.mkdir(parents=True)
    for f in Path(src).iterdir():
        if (keep is None or f.name in keep) and f.name not in skip:
            shutil.copy(f, dst / f.name)
    return dst


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@pytest.mark.parametrize(
    "case",
    ["not a model", "no tokenizer", "vl no tokenizer", "vl no processor", "only config.json", "vl only config.json"],
)
def test_incomplete_model_folder_names_what_is_missing(tmp_path, tiny_vl_path, tiny_lm_path, case):
    from verl_npu.models.loading import load_tokenizer_and_processor

    folder = tmp_path / "model"
    if case == "not a model":
        folder.mkdir()
        (folder / "readme.txt").write_text("x")
        (folder / "sub").mkdir()
        _copy(tiny_lm_path, folder / "sub" / "checkpoint")
        wanted = ["no config.json", "readme.txt", str(folder / "sub" / "checkpoint"), "huggingface-cli download"]
    elif case == "no tokenizer":
        _copy(tiny_lm_path, folder, skip=TOKENIZER_FILES)
        wanted = ["no tokenizer files", "tokenizer.json", "huggingface-cli download", "copy the missing files"]
    elif case == "vl no tokenizer":  # the "Mismatch in image token count"
        _copy(tiny_vl_path, folder, skip=TOKENIZER_FILES)
        wanted = ["no tokenizer files", "huggingface-cli download"]
    elif case == "vl no processor":
        _copy(tiny_vl_path, folder, skip=("processor_config.json", "preprocessor_config.json"))
        wanted = ["no processor files", "preprocessor_config.json", "qwen2_5_vl", "huggingface-cli download"]
    elif case == "only config.json":  # used to be blamed on a missing chat template
        _copy(tiny_lm_path, folder, keep=("config.json",))
        wanted = ["no weights", "no tokenizer files", "The folder holds: config.json"]
    else:
        _copy(tiny_vl_path, folder, keep=("config.json",))
        wanted = ["no weights", "no tokenizer files", "no processor files"]
    with pytest.raises(UserError) as err:
        load_tokenizer_and_processor(str(folder))
    msg = str(err.value)
    for text in wanted:
        assert text in msg, (text, msg)
    assert "chat template" not in msg


def test_complete_model_folder_still_loads(tmp_path, tiny_vl_path):
    from verl_npu.models.loading import load_tokenizer_and_processor

    folder = _copy(tiny_vl_path, tmp_path / "vl")
    tok, proc = load_tokenizer_and_processor(str(folder))
    assert len(tok) > 100 and proc is not None


# ============================================================== 4. data position in samples
def _rows(n: int) -> list[dict]:
    return [
        {"input_ids": torch.full((3,), i), "attention_mask": torch.ones(3, dtype=torch.long), "index": i}
        for i in range(n)
    ]


def test_resume_with_another_batch_size_continues_at_the_same_sample(caplog):
    ds = _rows(12)
    first = StatefulBatchLoader(ds, 4, shuffle=True, seed=1)
    order = [int(i) for i in first.order(0)]
    seen = next(iter(first))["index"]  # one step of 4 prompts
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint stores (JSON-safe)
    assert state["sample_index"] == 4 and state["epoch"] == 0 and state["batch_size"] == 4

    resumed = StatefulBatchLoader(ds, 3, shuffle=True, seed=1)  # data.train_batch_size 4 -> 3
    with caplog.at_level("WARNING", logger="verl_npu"):
        resumed.load_state_dict(state)
    assert "data.train_batch_size is 3, the checkpoint was saved with 4" in caplog.text
    rest = [b["index"] for b in resumed]
    assert rest == [order[4:7], order[7:10]]  # the same next prompt; nothing repeated or skipped
    assert not set(seen) & {i for b in rest for i in b}
    assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["sample_index"] == 0


def test_old_checkpoint_position_in_batches_still_works():
    ds = _rows(12)
    ref = StatefulBatchLoader(ds, 4, shuffle=True, seed=1)
    batches = [b["index"] for b in ref]
    old = StatefulBatchLoader(ds, 4, shuffle=True, seed=1)
    old.load_state_dict({"epoch": 0, "batch_index": 1})  # the format before positions were in samples
    assert [b["index"] for b in old] == batches[1:]
    with pytest.raises(ValueError):
        old.load_state_dict({"epoch": 0})


def test_changed_data_order_is_warned_and_position_past_the_end_moves_on(caplog):
    big = StatefulBatchLoader(_rows(12), 4, shuffle=True, seed=1)
    next(iter(big))
    next(iter(big))  # 8 samples in
    small = StatefulBatchLoader(_rows(9), 4, shuffle=True, seed=1)
    with caplog.at_level("WARNING", logger="verl_npu"):
        small.load_state_dict(big.state_dict())
    assert "num_rows 12 -> 9" in caplog.text
    assert (small.epoch, small.sample_index) == (1, 0)  # no full batch left in epoch 0


# ============================================================== 5. every image checked before training
def _image_rows(n: int, bad: dict[int, dict] | None = None) -> list[dict]:
    rows = [rl_row("<image>How many sides?", [png()], index=i) for i in range(n)]
    for i, image in (bad or {}).items():
        rows[i]["images"] = [image]
    return rows


def _truncated_png() -> dict:
    good = png((56, 56))["bytes"]
    noisy = io.BytesIO()
    Image.frombytes("RGB", (56, 56), os.urandom(56 * 56 * 3)).save(noisy, format="PNG")
    data = noisy.getvalue()
    assert len(data) > len(good)
    return {"bytes": data[: len(data) // 2], "path": None}  # a valid header, then the file ends


@pytest.mark.parametrize(
    "bad_image, what",
    [
        ({"bytes": b"not an image at all", "path": None}, "image 0 cannot be decoded"),
        (None, "image 0 cannot be decoded"),  # filled in below: a truncated PNG (its header still reads)
        (png((1, 300)), "image 0 is 1x300 px and cannot be resized"),
    ],
)
def test_a_bad_image_is_found_when_the_dataset_is_built(tmp_path, vl_processor, bad_image, what):
    bad_image = bad_image or _truncated_png()
    path = tmp_path / "train.parquet"
    write_rl_parquet(_image_rows(8, {5: bad_image}), path, with_images=True)
    with pytest.raises(UserError) as err:  # before training: not when row 5's batch comes up
        RLDataset(str(path), vl_processor.tokenizer, vl_processor, data_cfg())
    msg = str(err.value)
    assert f"data file {path} row 5 column 'images': {what}" in msg, msg
    assert "1 of 8 rows" in msg


def test_every_bad_row_is_listed_at_once(tmp_path, vl_processor):
    path = tmp_path / "train.parquet"
    junk = {"bytes": b"junk", "path": None}
    write_rl_parquet(_image_rows(30, {i: junk for i in range(3, 30, 2)}), path, with_images=True)
    with pytest.raises(UserError) as err:
        RLDataset(str(path), vl_processor.tokenizer, vl_processor, data_cfg())
    msg = str(err.value)
    assert "14 of 30 rows" in msg and "row 3 column" in msg and "(14 bad rows in all)" in msg
    assert len(re.findall(r"^  - ", msg, flags=re.M)) == 10


def test_image_check_shows_progress_only_for_large_data(tmp_path, vl_processor, capfd):
    small = tmp_path / "small.parquet"
    write_rl_parquet(_image_rows(20), small, with_images=True)
    RLDataset(str(small), vl_processor.tokenizer, vl_processor, data_cfg())
    assert "checking images" not in capfd.readouterr().err
    large = tmp_path / "large.parquet"
    image = png()
    table = pa.Table.from_pylist([rl_row("<image>?", [image], index=i) for i in range(1001)])
    pq.write_table(table, large)
    start = time.monotonic()
    ds = RLDataset(str(large), vl_processor.tokenizer, vl_processor, data_cfg())
    elapsed = time.monotonic() - start
    assert len(ds) == 1001
    assert "checking images" in capfd.readouterr().err
    assert elapsed < 20, f"checking 1001 small images took {elapsed:.1f} s"
