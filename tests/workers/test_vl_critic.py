"""PPO with a critic on a vision-language model (tiny://qwen25vl): the value model (the actor's model class
with a `v_head`), its values against a hand computation, a GAE run that trains, saves, resumes, and the
vision-language reward model refused before anything starts."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from PIL import Image
from run_helpers import run_overrides

from verl_npu.models.forward import response_values
from verl_npu.models.value_model import PREFIX, VisionLanguageValueModel, load_value_model, saved_value_head

RESPONSE = 4


def _load(path, **kw):
    return load_value_model(
        str(path),
        dtype=torch.float32,
        attn_implementation="sdpa",
        override_config=None,
        trust_remote_code=False,
        gradient_checkpointing=False,
        **kw,
    )


def _vl_rows(path):
    """Six rows over two prompts (each with its own picture, of different sizes: the shorter prompt is
    left-padded), three rows each with responses of varied length (one empty): ids, mask, response mask,
    and the per-row processor outputs."""
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(path)
    proc.tokenizer.padding_side = "left"
    red, blue = Image.new("RGB", (56, 56), (255, 0, 0)), Image.new("RGB", (28, 56), (0, 0, 255))

    def chat(text):
        return proc.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}],
            add_generation_prompt=True,
            tokenize=False,
        )

    texts, images = [chat("how many sides?"), chat("sides")], [red, blue]
    enc = proc(text=texts, images=images, return_tensors="pt", padding=True)
    one = [proc(text=[t], images=[im], return_tensors="pt") for t, im in zip(texts, images)]
    mm = [{"pixel_values": o["pixel_values"], "image_grid_thw": o["image_grid_thw"]} for o in one]
    prompt_of_row = [0, 1, 0, 1, 0, 1]
    lengths = torch.tensor([4, 1, 3, 4, 2, 0])
    g = torch.Generator().manual_seed(3)
    response_mask = (torch.arange(RESPONSE)[None, :] < lengths[:, None]).long()
    responses = torch.randint(3, 200, (6, RESPONSE), generator=g)
    # a response never holds image / video markers (the rollout cannot sample them)
    from transformers import AutoConfig

    from verl_npu.models.forward import vision_marker_ids

    markers = torch.tensor(vision_marker_ids(AutoConfig.from_pretrained(path)))
    responses = torch.where(torch.isin(responses, markers), 7, responses)
    responses = responses.masked_fill(response_mask == 0, proc.tokenizer.pad_token_id)
    ids = torch.cat([enc["input_ids"][prompt_of_row], responses], 1)
    mask = torch.cat([enc["attention_mask"][prompt_of_row], response_mask], 1)
    return ids, mask, response_mask.bool(), [mm[p] for p in prompt_of_row]


def _hand_values(model: VisionLanguageValueModel, ids, mask, rows_mm):
    """Each row alone through the plain backbone (the model computes its own 3-D rope positions), then
    value = w . h + b at the hidden state before each response token."""
    base = model.pretrained_model.base_model
    w, b = model.v_head.summary.weight[0], model.v_head.summary.bias[0]
    out = []
    for r in range(len(ids)):
        keep = mask[r].bool()
        row = ids[r][keep][None]
        types = (row == model.config.image_token_id).int()  # which tokens stand for the picture
        hidden = base(input_ids=row, mm_token_type_ids=types, **rows_mm[r]).last_hidden_state[0]  # [tokens, H]
        full = torch.zeros(ids.shape[1], hidden.shape[-1])
        full[keep] = hidden
        out.append(full[ids.shape[1] - RESPONSE - 1 : -1] @ w + b)
    return torch.stack(out)


def test_vl_value_model_is_the_actors_model_with_a_value_head(tiny_vl_path):
    from transformers import AutoModelForImageTextToText

    model = _load(tiny_vl_path)
    assert isinstance(model, VisionLanguageValueModel)
    assert isinstance(model.pretrained_model, AutoModelForImageTextToText._model_mapping[type(model.config)])
    hidden = model.config.get_text_config().hidden_size
    names = dict(model.named_parameters())
    assert names["v_head.summary.weight"].shape == (1, hidden) and names["v_head.summary.bias"].shape == (1,)
    head = {"v_head.summary.weight", "v_head.summary.bias"}
    assert all(n.startswith(PREFIX) for n in names if n not in head)  # verl's (trl's) names
    assert any(".visual." in n for n in names)  # the vision tower is part of it


@pytest.mark.parametrize("remove_padding", [False, True], ids=["padded", "padding-free"])
def test_vl_values_equal_the_backbone_hidden_states_through_the_head(tiny_vl_path, remove_padding):
    """Values of rows with pictures (two prompts, three rows each: the padding-free path runs each prompt
    and picture once) equal the hand computation over each row alone, at every response token."""
    torch.manual_seed(0)
    model = _load(tiny_vl_path).eval()
    ids, mask, resp, rows_mm = _vl_rows(tiny_vl_path)
    with torch.no_grad():
        got = response_values(model, ids, mask, RESPONSE, multi_modal_inputs=rows_mm, remove_padding=remove_padding)
        want = _hand_values(model, ids, mask, rows_mm)
    assert got.shape == (6, RESPONSE) and got.dtype == torch.float32
    torch.testing.assert_close(got[resp], want[resp], atol=2e-5, rtol=1e-4)
    # the pictures matter: the same rows with other pixels (the colours inverted) give other values
    other = [{"pixel_values": -m["pixel_values"], "image_grid_thw": m["image_grid_thw"]} for m in rows_mm]
    with torch.no_grad():
        changed = response_values(model, ids, mask, RESPONSE, multi_modal_inputs=other, remove_padding=remove_padding)
    assert not torch.allclose(changed[resp], want[resp], atol=1e-4)


def _grads(path, *, remove_padding: bool, checkpointing: bool) -> dict:
    torch.manual_seed(0)
    model = _load(path).train()
    if checkpointing:
        from verl_npu.models.loading import enable_activation_checkpointing

        enable_activation_checkpointing(model.pretrained_model)
    ids, mask, resp, rows_mm = _vl_rows(path)
    values = response_values(model, ids, mask, RESPONSE, multi_modal_inputs=rows_mm, remove_padding=remove_padding)
    (values * resp).sum().backward()
    return {n: p.grad for n, p in model.named_parameters()}


def test_vl_values_get_gradients_through_head_backbone_and_vision_tower(tiny_vl_path):
    """The same gradients padded, padding-free, and padding-free with activation checkpointing (whose
    recomputation runs the packed attention again)."""
    grads = _grads(tiny_vl_path, remove_padding=False, checkpointing=False)
    assert grads["v_head.summary.weight"].abs().sum() > 0
    assert any(g is not None and g.abs().sum() > 0 for n, g in grads.items() if ".visual." in n)
    for kw in ({"remove_padding": True, "checkpointing": False}, {"remove_padding": True, "checkpointing": True}):
        other = _grads(tiny_vl_path, **kw)
        for name, g in grads.items():
            if g is None:
                assert other[name] is None, name
            else:
                torch.testing.assert_close(other[name], g, atol=1e-5, rtol=1e-4, msg=lambda m: f"{kw} {name}: {m}")


def test_text_critic_keeps_the_token_classification_model(tiny_lm_path):
    from transformers import AutoModelForTokenClassification

    model = _load(tiny_lm_path)
    assert type(model) is AutoModelForTokenClassification._model_mapping[type(model.config)]
    assert model.config.num_labels == 1 and "score.weight" in dict(model.named_parameters())


def test_text_values_padded_and_padding_free_agree(tiny_lm_path):
    """The text critic takes the padding-free path too (critic.model.use_remove_padding)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm_path)
    tok.padding_side = "left"
    torch.manual_seed(0)
    model = _load(tiny_lm_path).eval()
    enc = tok(["a longer prompt here", "hi", "a longer prompt here"], return_tensors="pt", padding=True)
    resp_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
    ids = torch.cat([enc["input_ids"], torch.randint(3, 100, (3, RESPONSE))], 1)
    mask = torch.cat([enc["attention_mask"], resp_mask], 1)
    with torch.no_grad():
        padded = response_values(model, ids, mask, RESPONSE)
        packed = response_values(model, ids, mask, RESPONSE, remove_padding=True)
        # the token-classification forward at every position, read before each response token
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        direct = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[..., 0][:, -RESPONSE - 1 : -1]
    assert torch.equal(padded, direct)
    torch.testing.assert_close(packed[resp_mask.bool()], padded[resp_mask.bool()], atol=2e-5, rtol=1e-4)


# ---- a GAE run on the picture demo ---------------------------------------------------------------------
def _geo_overrides(out, data, **extra) -> list[str]:
    return run_overrides(
        out,
        data,
        {
            "data.train_batch_size": 2,
            "data.max_response_length": 3,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
            "actor_rollout_ref.rollout.n": 2,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
            "algorithm.adv_estimator": "gae",
            "algorithm.gamma": 1.0,
            "algorithm.lam": 0.95,
            "critic.optim.lr": 1e-2,
            "critic.ppo_micro_batch_size_per_gpu": 2,
            "critic.model.use_remove_padding": "true",
            "critic.model.enable_gradient_checkpointing": "false",
            "trainer.total_training_steps": 2,
            "trainer.save_freq": 1,
            "trainer.test_freq": -1,
            "trainer.logger": "[console]",
            "ray_init.num_cpus": 2,
        },
        extra,
    )


@pytest.fixture(scope="module")
def geo_data(tmp_path_factory):
    from verl_npu.data.geometry3k import prepare_synthetic

    data = tmp_path_factory.mktemp("vl_critic_data")
    prepare_synthetic(data, n_train=8, n_test=2, seed=0, image_size=56)
    return data


@pytest.fixture(scope="module")
def vl_gae_run(tmp_path_factory, geo_data, tiny_vl_path):
    """Two GAE steps of the picture demo with a critic, a checkpoint after each."""
    from verl_npu.config import load_recipe
    from verl_npu.trainer.entry import run_training

    out = tmp_path_factory.mktemp("vl_gae") / "out"
    assert run_training(load_recipe("tiny_geo3k", _geo_overrides(out, geo_data))) == 0
    return out


@pytest.mark.slow
def test_vl_gae_run_trains_the_critic(vl_gae_run):
    from run_helpers import step_metrics

    rows = step_metrics(vl_gae_run)
    assert sorted(rows) == [1, 2]
    for row in rows.values():
        assert torch.isfinite(torch.tensor(row["critic/vf_loss"])) and row["critic/grad_norm"] > 0
    assert rows[1]["critic/values/mean"] != rows[2]["critic/values/mean"]  # the critic learns


@pytest.mark.slow
def test_vl_critic_checkpoint_holds_verls_names_and_the_value_head(vl_gae_run, tiny_vl_path):
    from safetensors.torch import load_file

    from verl_npu.workers.torch_files import load_torch

    critic = vl_gae_run / "checkpoints" / "global_step_2" / "critic"
    shard = load_torch(critic / "model_world_size_1_rank_0.pt")
    assert "v_head.summary.weight" in shard and f"{PREFIX}lm_head.weight" in shard
    assert any(k.startswith(f"{PREFIX}model.visual.") for k in shard)
    hf = critic / "huggingface"
    weights = load_file(str(hf / "model.safetensors"))
    head = weights["v_head.summary.weight"]
    assert head.shape == (1, json.loads((hf / "config.json").read_text())["text_config"]["hidden_size"])
    assert not any(k.startswith(PREFIX) for k in weights)  # trl's layout: the model's own names + v_head.*
    torch.testing.assert_close(
        head,
        shard["v_head.summary.weight"].to_local()
        if hasattr(shard["v_head.summary.weight"], "to_local")
        else shard["v_head.summary.weight"],
    )
    # critic.model.path = that folder continues the trained critic: its value head is loaded
    assert set(saved_value_head(str(hf))) == {"summary.weight", "summary.bias"}
    torch.testing.assert_close(_load(hf).v_head.summary.weight.detach(), head)
    fresh = _load(tiny_vl_path).v_head.summary.weight.detach()
    assert not torch.equal(fresh, head)


@pytest.mark.slow
def test_vl_gae_run_resumes_the_critic_exactly(tmp_path, vl_gae_run, geo_data):
    """From global_step_1 of the run, step 2 again: the same critic and actor numbers (the value head and
    its optimizer state came back)."""
    from run_helpers import step_metrics

    from verl_npu.config import load_recipe
    from verl_npu.trainer.entry import run_training

    out = tmp_path / "out"
    shutil.copytree(vl_gae_run, out)
    shutil.rmtree(out / "checkpoints" / "global_step_2")
    (out / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("1")
    assert run_training(load_recipe("tiny_geo3k", _geo_overrides(out, geo_data))) == 0
    got, ref = step_metrics(out), step_metrics(vl_gae_run)
    for key in ("critic/vf_loss", "critic/values/mean", "critic/vpred_mean", "critic/grad_norm", "actor/pg_loss"):
        assert got[2][key] == pytest.approx(ref[2][key], rel=1e-4, abs=1e-6), key


# ---- the reward model: a vision-language one is refused before anything starts ---------------------------
def test_vision_language_reward_model_folder_is_refused_by_check_paths(tmp_path, tiny_vl_path):
    from verl_npu.config import load_recipe
    from verl_npu.config.paths import check_paths

    folder = tmp_path / "vl_rm"
    shutil.copytree(tiny_vl_path, folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["Qwen2_5_VLForSequenceClassification"]  # what a VL reward model would say
    (folder / "config.json").write_text(json.dumps(config))
    rc = load_recipe("tiny_geo3k", ["reward_model.enable=true", f"reward_model.model.path={folder}"])
    problems = [p for p in check_paths(rc) if p.key.endswith("reward_model.model.path")]
    assert len(problems) == 1 and "vision-language" in problems[0].message
    assert "text reward model" in problems[0].fix
    # the tiny vision-language model too (built locally, so only its name is read)
    rc = load_recipe("tiny_geo3k", ["reward_model.enable=true", "reward_model.model.path=tiny://qwen25vl?seed=1"])
    problems = [p for p in check_paths(rc) if p.key.endswith("reward_model.model.path")]
    assert len(problems) == 1 and "vision-language" in problems[0].message
    rc = load_recipe("tiny_geo3k", ["reward_model.enable=true", "reward_model.model.path=tiny://qwen2rm"])
    assert not [p for p in check_paths(rc) if p.key.endswith("reward_model.model.path")]


def test_vision_language_reward_model_is_refused_by_the_worker_by_name(tiny_vl_path):
    from verl_npu.errors import UserError
    from verl_npu.workers.reward_model import load_reward_model

    with pytest.raises(UserError, match=r"reward_model\.model\.path=tiny://qwen25vl .*vision-language"):
        load_reward_model(
            "tiny://qwen25vl",
            dtype=torch.float32,
            attn_implementation="sdpa",
            override_config=None,
            trust_remote_code=False,
        )


@pytest.mark.slow
def test_two_workers_train_the_vl_critic_like_one(tmp_path, vl_gae_run, geo_data):
    """Two Ray workers (FSDP2 shards of the value model, the value head included) give the one worker's
    numbers."""
    from run_helpers import step_metrics

    from verl_npu.config import load_recipe
    from verl_npu.trainer.entry import run_training

    out = tmp_path / "two"
    over = _geo_overrides(out, geo_data, **{"trainer.n_gpus_per_node": 2, "trainer.save_freq": -1})
    assert run_training(load_recipe("tiny_geo3k", over)) == 0
    one, two = step_metrics(vl_gae_run), step_metrics(out)
    assert sorted(two) == [1, 2]
    for step in (1, 2):
        for key in ("critic/vf_loss", "critic/values/mean", "critic/vpred_mean", "critic/grad_norm", "actor/pg_loss"):
            assert two[step][key] == pytest.approx(one[step][key], rel=1e-4, abs=1e-5), (step, key)


def test_a_text_critic_beside_a_vision_language_actor_reads_the_token_ids_only(tiny_lm_path, tiny_vl_path):
    model = _load(tiny_lm_path).eval()
    ids, mask, resp, rows_mm = _vl_rows(tiny_vl_path)
    with torch.no_grad():
        with_images = response_values(model, ids, mask, RESPONSE, multi_modal_inputs=rows_mm, remove_padding=True)
        without = response_values(model, ids, mask, RESPONSE, remove_padding=True)
    assert torch.equal(with_images, without)


def test_the_config_layer_knows_which_tiny_models_are_vision_language(tiny_cache):
    from verl_npu.config.rules_roles import TINY_VISION_LANGUAGE
    from verl_npu.models.loading import is_vision_language, load_config
    from verl_npu.models.tiny import TINY_BUILDERS

    vision = {name for name in TINY_BUILDERS if is_vision_language(load_config(f"tiny://{name}"))}
    assert vision == set(TINY_VISION_LANGUAGE)
