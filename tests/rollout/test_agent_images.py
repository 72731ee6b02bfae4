"""Images in multi-turn conversations: the hf agent loop with a real tiny Qwen2.5-VL (built locally), the
built-in zoom-in tool returning images, verl's geo3k tool, and the multi-turn geometry data."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from gloo_workers import gloo_group, spawn_gloo
from PIL import Image, ImageDraw
from test_agent_loop import scripted

from verl_npu.batch import Batch
from verl_npu.config.typed import section
from verl_npu.data import RLDataset, collate_rows
from verl_npu.data.geometry3k import prepare_synthetic, row_format, write_rl_parquet
from verl_npu.rollout.agent_loop import MULTI_TURN, AgentLoop
from verl_npu.rollout.base import SamplingParams
from verl_npu.rollout.hf import HFRollout
from verl_npu.rollout.image_turns import ImageTurns
from verl_npu.tools.geo3k import Geo3kTool
from verl_npu.tools.image_zoom import ImageZoomInTool, fit_box

R = 400  # the tiny tokenizer writes a tool call in about 80 tokens
REPO_TOOLS = Path(__file__).resolve().parents[2] / "examples" / "tool_config"
ZOOM = '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [10, 8, 60, 50], "label": "corner"}}</tool_call>'
ZOOM_ALL = '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 112, 84]}}</tool_call>'
BAD_BOX = '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [60, 50, 10, 8]}}</tool_call>'
GEO = '<tool_call>{"name": "calc_geo3k_reward", "arguments": {"answer": "4"}}</tool_call>'


@pytest.fixture(scope="module")
def vl():
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from verl_npu.models.tiny import materialize

    path = materialize("tiny://qwen25vl")
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(path)


def picture(size=(112, 84)) -> Image.Image:
    img = Image.new("RGB", size, (255, 255, 255))
    ImageDraw.Draw(img).polygon([(10, 10), (90, 12), (100, 70), (20, 60)], fill=(200, 30, 30))
    return img


def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def data_cfg(**kw) -> dict:
    base = {
        "prompt_key": "prompt",
        "image_key": "images",
        "video_key": None,
        "reward_fn_key": "data_source",
        "max_prompt_length": 512,
        "truncation": "error",
        "filter_overlong_prompts": False,
        "filter_overlong_prompts_workers": 1,
        "return_raw_chat": False,
        "min_pixels": None,
        "max_pixels": None,
    }
    return {**base, **kw}


def tools() -> dict:
    return {"image_zoom_in_tool": ImageZoomInTool({}), "calc_geo3k_reward": Geo3kTool({})}


def prompt_batch(processor, tmp_path, n_rows: int) -> Batch:
    """Rows of verl's multi-turn geometry format (a picture each), read by the dataset as training reads them."""
    to_row, schema = row_format("both")
    rows = [
        to_row(
            {"images": [png(picture())], "problem": "<image>How many sides does the polygon have?", "answer": "4"},
            "train",
            i,
            "synthetic_geometry",
        )
        for i in range(n_rows)
    ]
    path = tmp_path / "train.parquet"
    write_rl_parquet(rows, path, with_images=True, schema=schema)
    schemas = [t.tool_schema.model_dump() for t in tools().values()]
    ds = RLDataset(str(path), processor.tokenizer, processor, data_cfg(), tools=schemas)
    items = collate_rows([ds[i] for i in range(n_rows)])  # a Batch, as the loader yields it
    tensors, lists = dict(items.tensors), dict(items.lists)
    lists["uid"] = [f"q{i}" for i in range(n_rows)]
    return Batch(tensors, lists)


def loop_for(model, processor, scripts, images=True, **settings):
    tok = processor.tokenizer
    eng = HFRollout(model, tok, seed=0)
    return eng, AgentLoop(
        model,
        tok,
        tools(),
        section(MULTI_TURN, {"max_assistant_turns": 4, **settings}),
        eos_ids=eng.eos_ids,
        pad_id=eng.pad_id,
        suppress_ids=eng.suppress_ids,
        pick_factory=scripted(tok, eng.eos_ids[0], scripts),
        images=ImageTurns(processor) if images else None,
    )


def one_forward_log_probs(model, processor, ids: torch.Tensor, images: list) -> torch.Tensor:
    """log p(ids[t] | ids[<t]) from one plain transformers forward over the whole conversation with all its
    images, as the processor prepares the conversation's text and pictures at once (the model computes its
    own rope positions); image / video marker tokens are excluded as the rollout excludes them."""
    import re

    from verl_npu.models.forward import vision_marker_ids

    pad = re.escape(processor.image_token)
    text = re.sub(f"(?:{pad})+", processor.image_token, processor.tokenizer.decode(ids))
    inputs = processor(text=[text], images=images, return_tensors="pt", do_resize=False)
    assert inputs["input_ids"][0].tolist() == ids.tolist()  # the same tokens, image tokens expanded alike
    logits = model(**inputs).logits[0].float()
    logits[:, vision_marker_ids(model.config)] = float("-inf")
    return torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]


def test_a_tool_image_joins_the_conversation_masked_and_scored_like_one_forward(vl, tmp_path):
    from verl_npu.models.forward import response_log_probs

    model, processor = vl
    tok = processor.tokenizer
    scripts = {
        "q0": [ZOOM, ZOOM_ALL, "4"],  # two zooms: the prompt's picture and two tool pictures
        "q1": [BAD_BOX, "4"],  # an invalid box: an error text, no picture
        "q2": [GEO, "4"],
    }  # verl's geo3k tool: text
    eng, loop = loop_for(model, processor, scripts)
    batch = prompt_batch(processor, tmp_path, 3)
    out = loop.run(batch, SamplingParams(n=2, max_new_tokens=R), record_log_probs=True)
    P = batch["input_ids"].shape[1]

    eos = eng.eos_ids[0]
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    turns = out["agent_turns"][0]
    assert [t["role"] for t in turns] == ["assistant", "tool", "assistant", "tool", "assistant"]
    # the 50x42 crop, enlarged to the zoom tool's min_pixels (56 x 56) with sides multiples of 28
    assert turns[1]["images"] == 1 and turns[1]["calls"][0]["images"] == [[56, 56]]
    pad = "<|image_pad|>"
    first = (
        f"\n<|im_start|>tool\n<|vision_start|>{pad * 4}<|vision_end|>Zoomed in on the image to the region "
        "[10, 8, 60, 50] with label corner.<|im_end|>\n<|im_start|>assistant\n"
    )
    second = (
        f"\n<|im_start|>tool\n<|vision_start|>{pad * 12}<|vision_end|>Zoomed in on the image to the region "
        "[0, 0, 112, 84].<|im_end|>\n<|im_start|>assistant\n"
    )
    model_turns = [ids(ZOOM) + [eos], ids(ZOOM_ALL) + [eos], ids("4") + [eos]]
    tool_turns = [ids(first), ids(second)]
    want_ids = model_turns[0] + tool_turns[0] + model_turns[1] + tool_turns[1] + model_turns[2]
    want_mask = (
        [1] * len(model_turns[0])
        + [0] * len(tool_turns[0])
        + [1] * len(model_turns[1])
        + [0] * len(tool_turns[1])
        + [1] * len(model_turns[2])
    )
    for row in (0, 1):  # the two samples of q0
        assert out["responses"][row, : len(want_ids)].tolist() == want_ids
        assert out["response_mask"][row].tolist() == want_mask + [0] * (R - len(want_mask))
        assert out["attention_mask"][row, P:].tolist() == [1] * len(want_ids) + [0] * (R - len(want_ids))
        assert out["tool_mask"][row].sum() == len(tool_turns[0]) + len(tool_turns[1])
        # the prompt's picture (84x112 -> 6x8 patches), then the tools' (56x56, then 84x112)
        assert out["multi_modal_inputs"][row]["image_grid_thw"].tolist() == [[1, 6, 8], [1, 4, 4], [1, 6, 8]]
        assert [im.size for im in out["multi_modal_data"][row]["image"]] == [(112, 84), (56, 56), (112, 84)]
    assert "Error: the bounding box [60, 50, 10, 8] is invalid" in out["agent_turns"][2][1]["text"]
    assert "Current parsed answer='4' reward=1.0" in out["agent_turns"][4][1]["text"]
    for row in (2, 3, 4, 5):  # no tool picture: the prompt's only
        assert out["multi_modal_inputs"][row]["image_grid_thw"].tolist() == [[1, 6, 8]]
    assert out["tool_rewards"][2] == [-0.05] and out["tool_rewards"][4] == [0.0]

    trained = out["response_mask"].bool()
    mm = out["multi_modal_inputs"]
    padded = response_log_probs(model, out["input_ids"], out["attention_mask"], R, multi_modal_inputs=mm)[0]
    packed = response_log_probs(
        model, out["input_ids"], out["attention_mask"], R, multi_modal_inputs=mm, remove_padding=True
    )[0]
    for row in range(len(out["responses"])):
        real = out["attention_mask"][row].bool()
        seq = out["input_ids"][row][real]
        n_resp = int(out["attention_mask"][row, P:].sum())
        ref = one_forward_log_probs(model, processor, seq, out["multi_modal_data"][row]["image"])[-n_resp:]
        got = trained[row, :n_resp]
        for name, lp in (("rollout", out["rollout_log_probs"]), ("padded", padded), ("packed", packed)):
            torch.testing.assert_close(lp[row, :n_resp][got], ref[got], atol=1e-5, rtol=1e-5, msg=f"{name} row {row}")
    assert (out["rollout_log_probs"][~trained] == 0).all()


def test_a_text_only_rollout_turns_a_tool_image_into_an_error_message(vl, tmp_path):
    model, processor = vl
    _, loop = loop_for(model, processor, {"q0": [ZOOM, "4"]}, images=False)
    batch = prompt_batch(processor, tmp_path, 1)
    batch.lists.pop("multi_modal_data")  # a text-only rollout of the same prompt (its tokens as they are)
    batch.lists.pop("multi_modal_inputs")
    out = loop.run(batch, SamplingParams(n=1, max_new_tokens=R))
    text = out["agent_turns"][0][1]["text"]
    assert "there is no image to zoom into" in text  # a row without a picture to crop
    _, loop = loop_for(model, processor, {"q0": [ZOOM, "4"]}, images=False)
    from verl_npu.errors import UserError

    with pytest.raises(UserError, match="rollout.name=hf"):
        loop.run(prompt_batch(processor, tmp_path, 1), SamplingParams(n=1, max_new_tokens=R))


def test_zoom_tool_checks_its_box_and_sizes_its_crop():
    assert fit_box([10, 8, 60, 50], 112, 84, 28) == [10.0, 8.0, 60.0, 50.0]
    assert fit_box([-5, -5, 200, 200], 112, 84, 28) == [0.0, 0.0, 112.0, 84.0]  # clamped to the image
    assert fit_box([50, 40, 55, 44], 112, 84, 28) is not None  # grown around its centre
    left, top, right, bottom = fit_box([50, 40, 55, 44], 112, 84, 28)
    assert min(right - left, bottom - top) >= 28 and right <= 112 and bottom <= 84
    assert fit_box([60, 50, 10, 8], 112, 84, 28) is None  # corners swapped
    assert fit_box([0, 0, 112, 1], 112, 84, 28) is None  # aspect ratio over 100
    tool = ImageZoomInTool({"max_pixels": 56 * 56})
    iid, _ = tool.create(create_kwargs={"image": {"bytes": png(picture((300, 200))), "path": None}})
    reply, reward, metrics = tool.execute(iid, {"bbox_2d": [0, 0, 300, 200]})
    (crop,) = reply.image
    assert crop.width * crop.height <= 56 * 56 and crop.width % 28 == 0 and crop.height % 28 == 0
    assert reward == 0.0 and metrics == {"success": True}
    for bad in ({"bbox_2d": [1, 2, 3]}, {"bbox_2d": "x"}, {}, {"bbox_2d": [0, 0, float("nan"), 5]}):
        reply, reward, metrics = tool.execute(iid, bad)
        assert reply.text.startswith("Error: bbox_2d must be") and reward == -0.05 and not reply.image
    with pytest.raises(ValueError, match="unknown config key"):
        ImageZoomInTool({"zoom": 2})


def test_geo3k_tool_grades_answers_as_verl_does():
    tool = Geo3kTool({})
    iid, _ = tool.create(create_kwargs={"ground_truth": "4"})
    assert tool.execute(iid, {"answer": "3"})[1:] == (-0.05, {})  # wrong: no improvement
    reply, step, _ = tool.execute(iid, {"answer": "4"})
    assert reply.text == "Current parsed answer='4' reward=1.0" and step == 0.0 and tool.calc_reward(iid) == 1.0
    assert tool.execute(iid, {"answer": "4.0"})[1] == -0.05  # right again: not better
    tool.release(iid)


def test_data_prep_writes_verl_multiturn_geometry_rows(tmp_path):
    from verl_npu.data.geometry3k import main

    main(["--multiturn", "both", "--synthetic", "6", "--local-save-dir", str(tmp_path)])
    row = pq.read_table(tmp_path / "train.parquet").to_pylist()[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and row["agent_name"] == "tool_agent"
    assert "image_zoom_in_tool" in row["prompt"][0]["content"] and "calc_geo3k_reward" in row["prompt"][0]["content"]
    assert (
        row["extra_info"]["tools_kwargs"]["calc_geo3k_reward"]["create_kwargs"]["ground_truth"]
        == row["reward_model"]["ground_truth"]
    )
    assert (
        row["extra_info"]["need_tools_kwargs"] and len(row["images"]) == 1 and "<image>" in row["prompt"][1]["content"]
    )


def test_tiny_geo3k_tool_runs_two_steps_with_pictures_and_the_tools(tmp_path):
    import json

    from verl_npu.config import load_recipe
    from verl_npu.trainer.entry import run_training

    data = tmp_path / "data"
    prepare_synthetic(data, 8, 2, multiturn="both")
    over = {
        "af_output_dir": tmp_path / "out",
        "data.train_files": data / "train.parquet",
        "data.val_files": data / "test.parquet",
        "actor_rollout_ref.rollout.n": 2,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,  # two updates: old log-probs
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
        "actor_rollout_ref.actor.use_kl_loss": "true",
        "actor_rollout_ref.actor.kl_loss_coef": 0.01,
        "actor_rollout_ref.rollout.calculate_log_probs": "true",
        "trainer.total_training_steps": 2,
        "trainer.test_freq": 2,
        "trainer.save_freq": 2,
        "trainer.rollout_data_dir": tmp_path / "rollouts",
    }
    rc = load_recipe("tiny_geo3k_tool", [f"{k}={v}" for k, v in over.items()])
    assert run_training(rc) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "training/global_step" in r]
    assert [r["training/global_step"] for r in train] == [1.0, 2.0]
    for r in train:
        assert r["num_turns/min"] >= 2 and "tool_call_counts/mean" in r and "actor/kl_loss" in r
        assert r["training/rollout_probs_diff_max"] < 1e-4  # fp32 on CPU: the same distribution
    assert "val-aux/num_turns/mean" in rows[-1]
    dumped = [json.loads(line) for line in (tmp_path / "rollouts" / "1.jsonl").read_text().splitlines()]
    assert len(dumped) == 8 and all(d["turns"][0]["role"] == "assistant" for d in dumped)


def test_images_in_turns_on_vllm_are_refused_before_start(tmp_path):
    from verl_npu.config import load_recipe
    from verl_npu.errors import ConfigErrors, UserError
    from verl_npu.trainer.entry import run_training

    data = tmp_path / "data"
    prepare_synthetic(data, 8, 2, multiturn="both")
    over = [
        f"af_output_dir={tmp_path / 'out'}",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}",
        "actor_rollout_ref.rollout.name=vllm",
    ]
    # an image tool in the tool config: the config check names rollout.name and the tool
    with pytest.raises(ConfigErrors) as err:
        load_recipe("tiny_geo3k_tool", over, check_paths=True)
    (problem,) = err.value.problems
    assert problem.key.endswith("actor_rollout_ref.rollout.name")
    assert "image_zoom_in" in problem.message and problem.fix == "set actor_rollout_ref.rollout.name=hf"
    # pictures in the data (a text tool): refused when the data are read, before any worker starts
    geo = tmp_path / "geo3k.yaml"
    geo.write_text((REPO_TOOLS / "geo3k_tool_config.yaml").read_text())
    rc = load_recipe("tiny_geo3k_tool", [*over, f"actor_rollout_ref.rollout.multi_turn.tool_config_path={geo}"])
    with pytest.raises(UserError, match=r"train.parquet has images.*rollout.name=hf"):
        run_training(rc)
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


SYNC_SCRIPTS = {"q0": [ZOOM, "4"], "q1": ["4"]}


def _sharded_worker(rank: int, world: int, port: int, result_dir: str) -> None:
    import os

    from transformers import AutoModelForImageTextToText, AutoProcessor

    from verl_npu.models.tiny import materialize
    from verl_npu.workers.parallel import shard_module

    with gloo_group(rank, world, port):
        path = materialize("tiny://qwen25vl")
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
        processor = AutoProcessor.from_pretrained(path)
        model = shard_module(model, section("actor_rollout_ref.actor.fsdp_config"), world)  # vision tower: a unit
        _, loop = loop_for(model, processor, SYNC_SCRIPTS)
        loop.synced = True
        folder = Path(result_dir) / f"data{rank}"
        folder.mkdir()
        batch = prompt_batch(processor, folder, 2).select([rank])  # rank 0: q0 (a zoom), rank 1: q1 (one turn)
        out = loop.run(batch, SamplingParams(max_new_tokens=R))
        torch.save({k: out[k] for k in ("responses", "response_mask")}, os.path.join(result_dir, f"rank{rank}.pt"))


def test_sharded_ranks_stay_in_step_when_only_one_has_pictures_to_encode(vl, tmp_path):
    """Two FSDP-sharded workers (the vision tower is an FSDP unit: its forward is a collective): rank 1
    finishes after one turn while rank 0 prefills a conversation with a tool picture; rank 1's stand-in
    decode encodes a picture too, so neither hangs, and each rank gets the trajectory it gets alone."""
    spawn_gloo(_sharded_worker, str(tmp_path), timeout_s=300)
    model, processor = vl
    _, loop = loop_for(model, processor, SYNC_SCRIPTS)
    alone = loop.run(prompt_batch(processor, tmp_path, 2), SamplingParams(max_new_tokens=R))
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.equal(got["responses"][0], alone["responses"][rank])
        assert torch.equal(got["response_mask"][0], alone["response_mask"][rank])
    assert alone["agent_turns"][0][1]["images"] == 1 and len(alone["agent_turns"][1]) == 1
