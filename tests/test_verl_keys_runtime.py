"""verl keys that were accepted but read nowhere (issue 9) now do what they say: the loader's worker
threads (data.dataloader_num_workers), the TensorBoard folder (trainer.tensorboard_dir) and the
reward function's extra arguments (custom_reward_function.reward_kwargs)."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from verl_npu.config import load_recipe
from verl_npu.data import RLDataset, StatefulBatchLoader
from verl_npu.data.geometry3k import write_rl_parquet
from verl_npu.errors import ConfigErrors


def _png(size, colour) -> dict:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return {"bytes": buf.getvalue(), "path": None}


def test_dataloader_threads_give_the_same_batches(tmp_path, tiny_vl_path):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_vl_path)
    rows = [{"data_source": "synthetic_geometry", "prompt": [{"role": "user", "content": f"<image>Sides {i}?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(i)},
             "extra_info": {"index": i}, "images": [_png((56 + 28 * (i % 3), 56), (20 * i, 30, 30))]}
            for i in range(12)]
    path = tmp_path / "d.parquet"
    write_rl_parquet(rows, path, with_images=True)
    cfg = {"prompt_key": "prompt", "image_key": "images", "video_key": None, "reward_fn_key": "data_source",
           "max_prompt_length": 256, "truncation": "error", "filter_overlong_prompts": False,
           "filter_overlong_prompts_workers": 1, "return_raw_chat": False, "min_pixels": None, "max_pixels": None}
    ds = RLDataset(str(path), processor.tokenizer, processor, cfg)

    def batches(workers):
        loader = StatefulBatchLoader(ds, 4, shuffle=True, seed=3, num_workers=workers)
        return [(b["input_ids"].tolist(), list(b["ground_truth"]),
                 [float(m["pixel_values"].sum()) for m in b["multi_modal_inputs"]]) for b in loader]

    one_by_one, threaded = batches(0), batches(3)
    assert len(one_by_one) == 3 and threaded == one_by_one


def test_dataloader_num_workers_reaches_the_loader():
    rc = load_recipe("tiny_gsm8k", ["data.dataloader_num_workers=2"])
    assert rc.backend.data.dataloader_num_workers == 2
    with pytest.raises(ConfigErrors, match="dataloader_num_workers"):
        load_recipe("tiny_gsm8k", ["data.dataloader_num_workers=-1"])


def test_tensorboard_dir_is_where_events_go(tmp_path):
    from verl_npu.trainer.tracking import Tracker

    tb = tmp_path / "elsewhere" / "tb"
    tracker = Tracker(tmp_path / "out", ["tensorboard"], "p", "e", tensorboard_dir=tb)
    tracker.log({"critic/score/mean": 0.5}, step=1)
    tracker.close()
    assert list(tb.glob("events.out.tfevents.*")), "events must land in trainer.tensorboard_dir"
    assert not (tmp_path / "out" / "tensorboard").exists()
    rc = load_recipe("tiny_gsm8k", [f"af_output_dir={tmp_path / 'o'}"])
    assert rc.backend.trainer.tensorboard_dir == f"{tmp_path / 'o'}/tensorboard"   # derived default


def test_reward_kwargs_are_accepted_and_passed_to_the_reward_function(tmp_path):
    from verl_npu.rewards import load_reward_fn

    reward = tmp_path / "my_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
                      "    return float(solution_str.strip() == ground_truth) + bonus\n")
    rc = load_recipe("tiny_gsm8k", [f"custom_reward_function.path={reward}",
                                    "+custom_reward_function.reward_kwargs.bonus=0.25"])
    assert dict(rc.backend.custom_reward_function.reward_kwargs) == {"bonus": 0.25}
    fn = load_reward_fn(rc.backend.custom_reward_function)
    assert fn("x", "4", "4") == 1.25 and fn("x", "5", "4") == 0.25
    with pytest.raises(ConfigErrors, match="reward_kwargs"):
        load_recipe("tiny_gsm8k", ["custom_reward_function.reward_kwargs=3"])
