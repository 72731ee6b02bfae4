"""RLDataset (tiny BPE tokenizer + a real Qwen2.5-VL processor, built locally) and the resumable loader."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from run_helpers import data_cfg, png, rl_row

from verl_npu.data import RLDataset, StatefulBatchLoader, collate_rows
from verl_npu.data.dataset import truncate_ids
from verl_npu.data.geometry3k import write_rl_parquet
from verl_npu.errors import UserError


@pytest.fixture(scope="module")
def processor():
    from transformers import AutoProcessor

    from verl_npu.models.tiny import materialize

    return AutoProcessor.from_pretrained(materialize("tiny://qwen25vl"))


@pytest.fixture(scope="module")
def text_tokenizer():
    from transformers import AutoTokenizer

    from verl_npu.models.tiny import materialize

    return AutoTokenizer.from_pretrained(materialize("tiny://qwen2"))


@pytest.fixture
def image_file(tmp_path):
    path = tmp_path / "img.parquet"
    write_rl_parquet(
        [
            rl_row("<image>How many sides?", [png((56, 56))], "4"),
            rl_row("Look: <image> then <image>. Which is bigger?", [png((112, 56)), png((56, 84), (0, 0, 255))], "1"),
        ],
        path,
        with_images=True,
    )
    return str(path)


def image_token_id(processor) -> int:
    return processor.tokenizer.convert_tokens_to_ids(processor.image_token)


def test_image_row_inputs(processor, image_file):
    ds = RLDataset(image_file, processor.tokenizer, processor, data_cfg(return_raw_chat=True))
    item = ds[0]
    L = 128
    assert item["input_ids"].shape == (L,) and item["input_ids"].dtype == torch.long
    n = len(item["raw_prompt_ids"])
    assert int(item["attention_mask"].sum()) == n and item["attention_mask"][-n:].all()
    assert (item["input_ids"][: L - n] == processor.tokenizer.pad_token_id).all()  # left padding
    assert item["input_ids"][L - n :].tolist() == item["raw_prompt_ids"]
    # 56x56 -> (56/28)^2 = 4 image tokens; the processor agrees through image_grid_thw.
    grid = item["multi_modal_inputs"]["image_grid_thw"]
    assert grid.tolist() == [[1, 4, 4]]
    assert item["raw_prompt_ids"].count(image_token_id(processor)) == 4 == int(grid.prod()) // 4
    assert item["multi_modal_inputs"]["pixel_values"].shape[0] == int(grid.prod())
    assert "mm_token_type_ids" not in item["multi_modal_inputs"]
    assert [im.size for im in item["multi_modal_data"]["image"]] == [(56, 56)]
    assert ds.prompt_length(0) == n
    assert (item["data_source"], item["ground_truth"], item["index"]) == ("synthetic_geometry", "4", 0)
    assert item["extra_info"]["answer"] == "4"
    assert item["raw_prompt"] == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many sides?"}]}
    ]


def test_placeholders_become_image_parts_in_order(processor, image_file):
    ds = RLDataset(image_file, processor.tokenizer, processor, data_cfg())
    item = ds[1]
    text = processor.tokenizer.decode(item["raw_prompt_ids"])
    # 112x56 -> 4x2 = 8 tokens, 56x84 -> 2x3 = 6 tokens, each inside its own vision block, in order.
    first, second = "<|image_pad|>" * 8, "<|image_pad|>" * 6
    expected = f"Look: <|vision_start|>{first}<|vision_end|> then <|vision_start|>{second}<|vision_end|>. Which"
    assert expected in text
    assert item["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 8], [1, 6, 4]]
    assert [im.size for im in item["multi_modal_data"]["image"]] == [(112, 56), (56, 84)]
    assert ds.prompt_length(1) == len(item["raw_prompt_ids"])


def test_min_max_pixels_resize_and_change_token_counts(processor, tmp_path):
    path = tmp_path / "big.parquet"
    write_rl_parquet([rl_row("<image>q", [png((280, 140))])], path, with_images=True)
    small = RLDataset(
        str(path), processor.tokenizer, processor, data_cfg(max_pixels=56 * 56 * 2, max_prompt_length=256)
    )
    big = RLDataset(str(path), processor.tokenizer, processor, data_cfg(max_pixels=280 * 140, max_prompt_length=256))
    s_item, b_item = small[0], big[0]
    s_img, b_img = s_item["multi_modal_data"]["image"][0], b_item["multi_modal_data"]["image"][0]
    assert b_img.size == (280, 140) and s_img.width * s_img.height <= 56 * 56 * 2
    assert s_img.width % 28 == 0 and s_img.height % 28 == 0
    tok = image_token_id(processor)
    assert b_item["raw_prompt_ids"].count(tok) == 10 * 5
    assert s_item["raw_prompt_ids"].count(tok) == (s_img.width // 28) * (s_img.height // 28)
    # min_pixels upsizes a small image.
    up = RLDataset(
        str(path),
        processor.tokenizer,
        processor,
        data_cfg(min_pixels=560 * 280, max_pixels=560 * 280, max_prompt_length=512),
    )
    assert up[0]["multi_modal_data"]["image"][0].size == (560, 280)


def test_placeholder_mismatch_names_the_row(processor, tmp_path):
    path = tmp_path / "bad.parquet"
    write_rl_parquet(
        [rl_row("<image>ok", [png((56, 56))]), rl_row("<image><image>two?", [png((56, 56))])], path, with_images=True
    )
    with pytest.raises(
        UserError,
        match=r"bad.parquet row 1: the prompt has 2 <image> placeholder\(s\) but the row "
        r"has 1 image",
    ):
        RLDataset(str(path), processor.tokenizer, processor, data_cfg())  # found before training, not at ds[1]


def text_file(tmp_path, contents):
    path = tmp_path / "text.parquet"
    write_rl_parquet([rl_row(c, None, "7", "openai/gsm8k") for c in contents], path, with_images=False)
    return str(path)


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_text_truncation_modes(text_tokenizer, tmp_path, mode):
    content = " ".join(f"word{i}" for i in range(60))
    path = text_file(tmp_path, [content])
    full = RLDataset(path, text_tokenizer, None, data_cfg(max_prompt_length=1024))[0]["raw_prompt_ids"]
    assert len(full) > 40
    item = RLDataset(path, text_tokenizer, None, data_cfg(max_prompt_length=40, truncation=mode))[0]
    ids = item["raw_prompt_ids"]
    expected = {"left": full[-40:], "right": full[:40], "middle": full[:20] + full[-20:]}[mode]
    assert ids == expected
    assert item["attention_mask"].all() and item["input_ids"].tolist() == ids
    assert "multi_modal_data" not in item and item["multi_modal_inputs"] == {}


def test_truncate_ids_odd_middle():
    ids = torch.arange(10)
    assert truncate_ids(ids, 5, "middle").tolist() == [0, 1, 7, 8, 9]
    assert truncate_ids(ids, 20, "left").tolist() == list(range(10))


def test_truncation_error_names_every_long_row_when_the_dataset_is_built(text_tokenizer, tmp_path):
    """truncation=error: all rows are measured when the dataset is built, not when training reaches them."""
    long = " ".join(["long"] * 80)
    path = text_file(tmp_path, ["short", long, "short too", long])
    n = RLDataset(path, text_tokenizer, None, data_cfg(max_prompt_length=1024)).prompt_length(1)
    with pytest.raises(
        UserError,
        match=rf"2 of 4 rows have prompts longer than data.max_prompt_length=30 "
        rf"\(checked before training\):\n  - data file .*text.parquet row 1: {n} "
        rf"tokens\n  - data file .*row 3: {n} tokens\nFix: .*filter_overlong_prompts",
    ):
        RLDataset(path, text_tokenizer, None, data_cfg(max_prompt_length=30))
    ds = RLDataset(path, text_tokenizer, None, data_cfg(max_prompt_length=30, truncation="left"))  # cut, not refused
    assert len(ds[1]["raw_prompt_ids"]) == 30


def test_a_row_without_ground_truth_is_named_when_the_dataset_is_built(text_tokenizer, tmp_path):
    rows = [rl_row(f"q{i}", None, "7", "openai/gsm8k") for i in range(5)]
    rows[2]["reward_model"]["ground_truth"] = None
    rows[4]["reward_model"] = None
    path = tmp_path / "gt.parquet"
    write_rl_parquet(rows, path, with_images=False)
    with pytest.raises(
        UserError,
        match=r"2 of 5 rows have no reward_model.ground_truth .*\n  - data file "
        r".*gt.parquet row 2: .*\n  - data file .*gt.parquet row 4: 'reward_model' "
        r"is None\nFix: give every row a ground truth",
    ):
        RLDataset(str(path), text_tokenizer, None, data_cfg())


def test_truncation_never_cuts_image_tokens(processor, tmp_path):
    path = tmp_path / "img_long.parquet"
    write_rl_parquet([rl_row("<image>" + " more words" * 30, [png((112, 112))])], path, with_images=True)
    common = (processor.tokenizer, processor)
    n = RLDataset(str(path), *common, data_cfg(max_prompt_length=512)).prompt_length(0)
    # 'right' keeps the start (the image) and cuts text only: allowed.
    kept = RLDataset(str(path), *common, data_cfg(max_prompt_length=40, truncation="right"))[0]
    assert kept["raw_prompt_ids"].count(image_token_id(processor)) == 16 and len(kept["raw_prompt_ids"]) == 40
    # 'left' keeps the end and would drop the image's tokens: refused, with the fix.
    with pytest.raises(
        UserError,
        match=rf"row 0: the prompt is {n} tokens \(16 of them image tokens\).*would cut "
        rf"image tokens.*at least {n}, or lower data.max_pixels",
    ):
        RLDataset(str(path), *common, data_cfg(max_prompt_length=40, truncation="left"))[0]
    # images alone longer than the limit: no truncation can help, found when the dataset is built
    with pytest.raises(
        UserError,
        match=r"img_long.parquet row 0 column 'images': the images alone take 16 prompt "
        r"tokens, more than data.max_prompt_length=10",
    ):
        RLDataset(str(path), *common, data_cfg(max_prompt_length=10, truncation="right"))


@pytest.mark.parametrize("workers", [1, 2])
def test_filter_overlong_prompts_counts_image_tokens(processor, tmp_path, workers):
    path = tmp_path / "mixed.parquet"
    rows = [
        rl_row("<image>a", [png((56, 56))], "0"),  # ~4 image tokens
        rl_row("<image>b", [png((336, 336))], "1"),  # 144 image tokens
        rl_row("<image>c", [png((84, 56))], "2"),
        rl_row("<image>" + " x" * 200, [png((56, 56))], "3"),
    ]  # long text
    write_rl_parquet(rows, path, with_images=True)
    c = data_cfg(
        max_prompt_length=64,
        filter_overlong_prompts=True,
        filter_overlong_prompts_workers=workers,
        max_pixels=336 * 336,
    )
    ds = RLDataset(str(path), processor.tokenizer, processor, c)
    assert len(ds) == 2 and ds.num_filtered == 2 and ds.num_source_rows == 4
    assert [ds[i]["ground_truth"] for i in range(2)] == ["0", "2"]
    assert [ds[i]["index"] for i in range(2)] == [0, 2]
    # Lower max_pixels: the big image now fits.
    c["max_pixels"] = 56 * 56
    assert [ds2["ground_truth"] for ds2 in RLDataset(str(path), processor.tokenizer, processor, c)] == ["0", "1", "2"]


def test_reads_an_omegaconf_data_node(text_tokenizer, tmp_path):
    from omegaconf import OmegaConf

    path = text_file(tmp_path, ["hello there"])
    node = OmegaConf.create({"data": data_cfg(max_prompt_length=16, return_raw_chat=True, truncation="left")}).data
    ds = RLDataset(OmegaConf.create([path]), text_tokenizer, None, node)
    assert ds.settings.max_prompt_length == 16 and ds[0]["input_ids"].shape == (16,)
    assert ds[0]["raw_prompt"] == [{"role": "user", "content": "hello there"}]


def test_multiple_files_and_input_errors(processor, text_tokenizer, tmp_path, image_file):
    text = text_file(tmp_path, ["one", "two"])
    ds = RLDataset([image_file, text], processor.tokenizer, processor, data_cfg())
    assert len(ds) == 4 and ds[3]["index"] == 3 and ds[3]["data_source"] == "openai/gsm8k"
    assert "multi_modal_data" not in ds[3] and "multi_modal_data" in ds[0]

    with pytest.raises(UserError, match="nope.parquet does not exist"):
        RLDataset(str(tmp_path / "nope.parquet"), text_tokenizer, None, data_cfg())
    with pytest.raises(UserError, match=r"has no column 'question' data.prompt_key"):
        RLDataset(text, text_tokenizer, None, data_cfg(prompt_key="question"))
    with pytest.raises(UserError, match="has images in column 'images' but the model has no image processor"):
        RLDataset(image_file, text_tokenizer, None, data_cfg())
    with pytest.raises(UserError, match="data.truncation='cut'"):
        RLDataset(text, text_tokenizer, None, data_cfg(truncation="cut"))

    vids = tmp_path / "vid.parquet"
    table = pq.read_table(text).append_column("videos", pa.array([["clip.mp4"], []]))
    pq.write_table(table, vids)
    with pytest.raises(UserError, match="videos are not supported"):
        RLDataset(str(vids), text_tokenizer, None, data_cfg(video_key="videos"))
    RLDataset(text, text_tokenizer, None, data_cfg(video_key="videos"))  # the key alone, without videos, is fine

    no_gt = tmp_path / "no_gt.parquet"
    pq.write_table(pq.read_table(text).drop_columns(["reward_model"]), no_gt)
    with pytest.raises(UserError, match=r"no_gt.parquet has no column 'reward_model'"):
        RLDataset(str(no_gt), text_tokenizer, None, data_cfg())

    no_img_col = tmp_path / "noimg.parquet"
    write_rl_parquet([rl_row("<image>q", None)], no_img_col, with_images=False)
    with pytest.raises(UserError, match="prompts with <image> but no image column 'images'"):
        RLDataset(str(no_img_col), processor.tokenizer, processor, data_cfg())


# ---------------------------------------------------------------- loader
def rows_dataset(n: int) -> list[dict]:
    return [
        {"input_ids": torch.full((3,), i), "attention_mask": torch.ones(3, dtype=torch.long), "index": i}
        for i in range(n)
    ]


def test_collate_stacks_ids_and_lists_the_rest():
    items = rows_dataset(2)
    items[1]["multi_modal_data"] = {"image": []}
    batch = collate_rows(items)
    assert batch["input_ids"].shape == (2, 3) and batch["attention_mask"].shape == (2, 3)
    assert batch["index"] == [0, 1] and batch["multi_modal_data"] == [None, {"image": []}]


def test_loader_order_is_a_function_of_seed_and_epoch():
    ds = rows_dataset(10)
    loader = StatefulBatchLoader(ds, batch_size=3, shuffle=True, seed=7)
    assert len(loader) == 3 and len(StatefulBatchLoader(ds, 3, drop_last=False)) == 4
    epoch0 = [b["index"] for b in loader]
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["sample_index"] == 0
    epoch1 = [b["index"] for b in loader]
    assert len(epoch0) == 3 and all(len(b) == 3 for b in epoch0)
    assert len({i for b in epoch0 for i in b}) == 9  # no repeats within an epoch
    assert epoch0 != epoch1
    again = StatefulBatchLoader(ds, 3, True, 7)
    again.set_epoch(1)
    assert [b["index"] for b in again] == epoch1
    assert [b["index"] for b in StatefulBatchLoader(ds, 3, False, 7)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_loader_resumes_at_the_exact_next_batch():
    ds = rows_dataset(12)
    ref = StatefulBatchLoader(ds, 4, True, 1)
    reference = [b["index"] for _ in range(2) for b in ref]  # two full epochs, 6 batches

    first = StatefulBatchLoader(ds, 4, True, 1)
    seen = []
    for b in first:
        seen.append(b["index"])
        if len(seen) == 2:
            break
    state = first.state_dict()
    assert (state["epoch"], state["sample_index"], state["batch_index"]) == (0, 8, 2)

    resumed = StatefulBatchLoader(ds, 4, True, 1)
    resumed.load_state_dict(state)
    resumed.set_epoch(0)  # a trainer calling set_epoch for the current epoch must not rewind it
    seen += [b["index"] for b in resumed]
    seen += [b["index"] for b in resumed]
    assert seen == reference


def test_loader_resume_at_epoch_boundary_does_not_skip_an_epoch():
    ds = rows_dataset(8)
    a = StatefulBatchLoader(ds, 4, True, 3)
    list(a)
    state = a.state_dict()
    assert (state["epoch"], state["sample_index"]) == (1, 0)
    b = StatefulBatchLoader(ds, 4, True, 3)
    b.load_state_dict(state)
    assert [x["index"] for x in b] == [x["index"] for x in a]  # both now yield epoch 1
    with pytest.raises(ValueError):
        b.load_state_dict({"epoch": 1})


def test_loader_over_rl_dataset(processor, image_file):
    ds = RLDataset(image_file, processor.tokenizer, processor, data_cfg())
    batch = next(iter(StatefulBatchLoader(ds, batch_size=2, shuffle=False)))
    assert batch["input_ids"].shape == (2, 128)
    assert batch["ground_truth"] == ["4", "1"]
    assert [len(m["image"]) for m in batch["multi_modal_data"]] == [1, 2]
    assert [mm["image_grid_thw"].shape[0] for mm in batch["multi_modal_inputs"]] == [1, 2]
