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
    rows = [
        {
            "data_source": "synthetic_geometry",
            "prompt": [{"role": "user", "content": f"<image>Sides {i}?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i)},
            "extra_info": {"index": i},
            "images": [_png((56 + 28 * (i % 3), 56), (20 * i, 30, 30))],
        }
        for i in range(12)
    ]
    path = tmp_path / "d.parquet"
    write_rl_parquet(rows, path, with_images=True)
    cfg = {
        "prompt_key": "prompt",
        "image_key": "images",
        "video_key": None,
        "reward_fn_key": "data_source",
        "max_prompt_length": 256,
        "truncation": "error",
        "filter_overlong_prompts": False,
        "filter_overlong_prompts_workers": 1,
        "return_raw_chat": False,
        "min_pixels": None,
        "max_pixels": None,
    }
    ds = RLDataset(str(path), processor.tokenizer, processor, cfg)

    def batches(workers):
        loader = StatefulBatchLoader(ds, 4, shuffle=True, seed=3, num_workers=workers)
        return [
            (
                b["input_ids"].tolist(),
                list(b["ground_truth"]),
                [float(m["pixel_values"].sum()) for m in b["multi_modal_inputs"]],
            )
            for b in loader
        ]

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
    assert rc.backend.trainer.tensorboard_dir == f"{tmp_path / 'o'}/tensorboard"  # derived default


def test_reward_kwargs_are_accepted_and_passed_to_the_reward_function(tmp_path):
    from verl_npu.rewards import load_reward_fn

    reward = tmp_path / "my_reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
        "    return float(solution_str.strip() == ground_truth) + bonus\n"
    )
    rc = load_recipe(
        "tiny_gsm8k", [f"custom_reward_function.path={reward}", "+custom_reward_function.reward_kwargs.bonus=0.25"]
    )
    assert dict(rc.backend.custom_reward_function.reward_kwargs) == {"bonus": 0.25}
    fn = load_reward_fn(rc.backend.custom_reward_function)
    assert fn("x", "4", "4") == 1.25 and fn("x", "5", "4") == 0.25
    with pytest.raises(ConfigErrors, match="reward_kwargs"):
        load_recipe("tiny_gsm8k", ["custom_reward_function.reward_kwargs=3"])


def test_entropy_chunking_gives_the_same_entropy(tiny_lm_path):
    import torch
    from transformers import AutoModelForCausalLM

    from verl_npu.models.forward import _entropy, response_log_probs

    logits = torch.randn(3, 5, 7, dtype=torch.float64)
    assert torch.allclose(_entropy(logits, chunk=4), _entropy(logits)) and _entropy(logits, 4).shape == (3, 5)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path, dtype=torch.float32)
    ids = torch.randint(3, 200, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    for rmpad in (False, True):
        whole = response_log_probs(model, ids, mask, 4, with_entropy=True, remove_padding=rmpad)
        chunked = response_log_probs(model, ids, mask, 4, with_entropy=True, remove_padding=rmpad, entropy_chunk=3)
        assert torch.allclose(whole[1], chunked[1], atol=1e-6) and torch.equal(whole[0], chunked[0])
    rc = load_recipe("tiny_gsm8k", ["++actor_rollout_ref.actor.entropy_from_logits_with_chunking=true"])
    assert rc.backend.actor_rollout_ref.actor.entropy_from_logits_with_chunking is True


def _prefetch_worker(rank: int, world: int, port: int, path: str, out: str) -> None:
    import torch
    from gloo_workers import gloo_group
    from transformers import AutoModelForCausalLM

    from verl_npu.config.typed import section
    from verl_npu.workers.parallel import shard_module

    with gloo_group(rank, world, port):
        ids = torch.randint(3, 200, (2, 8), generator=torch.Generator().manual_seed(0))
        results = {}
        for prefetch in (False, True):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            sharded = shard_module(
                model, section("actor_rollout_ref.actor.fsdp_config", {"forward_prefetch": prefetch}), world
            )
            layers = sharded.model.layers
            results[prefetch] = (
                sharded(input_ids=ids).logits.detach(),
                [len(layer._get_fsdp_state()._states_to_forward_prefetch) for layer in layers],
            )
        assert torch.allclose(results[True][0], results[False][0])
        assert results[False][1] == [0] * len(layers)
        assert results[True][1] == [1] * (len(layers) - 1) + [0]  # each block prefetches the next
        if rank == 0:
            open(out, "w").write("ok")


@pytest.mark.slow
def test_forward_prefetch_sets_fsdp2_prefetch_and_keeps_the_numbers(tiny_lm_path, tmp_path):
    from gloo_workers import spawn_gloo

    out = tmp_path / "ok"
    spawn_gloo(_prefetch_worker, str(tiny_lm_path), str(out))
    assert out.read_text() == "ok"
