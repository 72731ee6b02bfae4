"""Every shipped recipe (recipes/**/*.yaml, picked up automatically) loads and validates with its
placeholders filled; recipe lookup, listing and copying."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_npu.config import REQUIRED, load_recipe
from verl_npu.config.recipes import copy_recipe, find_recipe, list_recipes, placeholder_fields
from verl_npu.config.rules_distill import TEACHER_PATH
from verl_npu.config.sft import is_sft_recipe, load_sft_recipe
from verl_npu.config.stages import is_stages_tree, load_stages
from verl_npu.config.tree import read_yaml_file
from verl_npu.errors import ConfigErrors, UserError

REPO = Path(__file__).resolve().parents[2]
ALL_RECIPES = sorted((REPO / "recipes").rglob("*.yaml"))
#: SFT recipes (verl's SFT sections, `verl-npu sft`) are validated by the SFT loader; the rest by the RL one
SFT_RECIPES = [p for p in ALL_RECIPES if is_sft_recipe(p)]
#: stages recipes (SFT then RL, docs/sft.md) are validated stage by stage
STAGES_RECIPES = [p for p in ALL_RECIPES if is_stages_tree(read_yaml_file(p))]
RECIPES = [p for p in ALL_RECIPES if p not in SFT_RECIPES and p not in STAGES_RECIPES]
SUPPLY = {
    "af_output_dir": "/tmp/verl_npu_test_out",
    "backend_config.data.train_files": "/data/train.parquet",
    "backend_config.data.val_files": "/data/test.parquet",
    "backend_config.actor_rollout_ref.model.path": "/models/model",
    TEACHER_PATH: "/models/teacher",  # required with distillation.enabled
    "backend_config.model.path": "/models/model",  # an SFT recipe's model
}
#: placeholders a shipped RL recipe may hold: the required fields, and the teacher of a distillation recipe
PLACEHOLDER_KEYS = {*REQUIRED, TEACHER_PATH}


def _filled(path: Path) -> list[str]:
    return [f"{key}={SUPPLY[key]}" for key in placeholder_fields(path)]


def test_recipes_are_found():
    names = {p.stem for p in ALL_RECIPES}
    assert "tiny_sft" in {p.stem for p in SFT_RECIPES}
    assert {"qwen25vl_geo3k", "qwen25vl_geo3k_longseq", "qwen25_gsm8k"} <= names
    assert {r.name for r in list_recipes()} == names


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_validates_with_required_fields_supplied(path):
    fields = placeholder_fields(path)
    assert set(fields) <= PLACEHOLDER_KEYS, f"placeholders only belong in required fields: {fields}"
    rc = load_recipe(path.stem, _filled(path))
    assert rc.source == path and rc.world_size >= 1
    if fields:  # a recipe that ships placeholders is refused as is, naming each field
        with pytest.raises(ConfigErrors) as info:
            load_recipe(path)
        assert sorted(p.key for p in info.value.problems) == sorted(fields)


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_is_fully_supported_by_the_trainer(path):
    """`verl-npu run` starts every shipped recipe: tensor-parallel rollout included (the flagship
    qwen25vl_geo3k uses TP 4, qwen25_gsm8k TP 2)."""
    load_recipe(path.stem, _filled(path))  # the trainer's own refusals are rules of the same registry


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_files_named_from_the_repository_root_load(path):
    """The tool config and custom reward file a recipe names (paths from the repository root, where the launcher
    runs) exist and load: validation without --check-paths reads neither."""
    from verl_npu.rewards import load_reward_fn
    from verl_npu.tool_registry import read_tool_config

    backend = load_recipe(path.stem, _filled(path)).backend
    tools = backend.actor_rollout_ref.rollout.multi_turn.tool_config_path
    if tools:
        entries, problems = read_tool_config(REPO / tools)
        assert entries and not problems, (tools, problems)
    if backend.custom_reward_function.path:
        reward = dict(backend.custom_reward_function, path=str(REPO / backend.custom_reward_function.path))
        assert load_reward_fn(reward).name


def test_tensor_parallel_recipes_keep_their_sizes():
    sizes = {
        name: load_recipe(name, _filled(find_recipe(name))).backend.actor_rollout_ref.rollout.tensor_model_parallel_size
        for name in ("qwen25vl_geo3k", "qwen25_gsm8k")
    }
    assert sizes == {"qwen25vl_geo3k": 4, "qwen25_gsm8k": 2}


@pytest.mark.parametrize("path", SFT_RECIPES, ids=[p.stem for p in SFT_RECIPES])
def test_sft_recipe_validates_and_the_rl_loader_names_the_sft_command(path):
    fields = placeholder_fields(path)
    rc = load_sft_recipe(path, _filled(path))
    assert rc.source == path and rc.world_size >= 1 and rc.typed.model.path
    if fields:  # an accelerator SFT recipe ships placeholders: refused as is, naming each field
        with pytest.raises(ConfigErrors) as info:
            load_sft_recipe(path)
        assert sorted(p.key for p in info.value.problems) == sorted(fields)
    with pytest.raises(UserError, match=f"verl-npu sft {path.stem}"):
        load_recipe(path.stem)


@pytest.mark.parametrize("path", STAGES_RECIPES, ids=[p.stem for p in STAGES_RECIPES])
def test_stages_recipe_validates_both_stages(path):
    recipe = load_stages(path, _stage_fills(path))
    assert [s.kind for s in recipe.stages] == ["sft", "rl"] and recipe.source == path
    if placeholder_fields(path):  # refused as is, each stage's placeholders named with the stage
        with pytest.raises(ConfigErrors) as info:
            load_stages(path)
        assert {p.key.split(":")[0] for p in info.value.problems} == {"sft", "rl"}


def _stage_fills(path: Path) -> list[str]:
    """Command-line fills for a stages recipe's placeholders: its own, then each stage recipe's
    (`<stage>.key=value`; the RL stage's model path is the SFT stage's output, set by the stages loader)."""
    fills = _filled(path)
    for stage in read_yaml_file(path)["stages"]:
        for fill in _filled(find_recipe(stage["recipe"])):
            if fill.split("=")[0] not in ("af_output_dir", "backend_config.actor_rollout_ref.model.path"):
                fills.append(f"{stage['name']}.{fill}")
    return fills


@pytest.mark.parametrize("path", ALL_RECIPES, ids=[p.stem for p in ALL_RECIPES])
def test_recipe_header_says_what_where_how_and_expected(path):
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lower())
    text = "\n".join(header)
    for word in ("train", "hardware", "run", "expect"):
        assert word in text, f"{path.name} header lacks '{word}'"
    assert "launch/run_recipe.sh" in text


def test_flagship_has_the_seed_values():
    rc = load_recipe("qwen25vl_geo3k", _filled(find_recipe("qwen25vl_geo3k")))
    b = rc.backend
    a, r = b.actor_rollout_ref.actor, b.actor_rollout_ref.rollout
    assert (b.data.train_batch_size, a.ppo_mini_batch_size, a.ppo_micro_batch_size_per_gpu) == (32, 8, 1)
    assert r.log_prob_micro_batch_size_per_gpu == 1 and b.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == 1
    assert b.trainer.total_epochs == 5 and r.tensor_model_parallel_size == 4 and b.data.image_key == "images"
    assert rc.cfg.engine_kwargs.vllm.disable_mm_preprocessor_cache is True
    assert (b.data.max_prompt_length, b.data.max_response_length) == (1024, 1024)
    assert b.data.shuffle is True and b.data.truncation == "error" and a.optim.lr == pytest.approx(1e-6)
    assert b.actor_rollout_ref.model.use_remove_padding and b.actor_rollout_ref.model.enable_gradient_checkpointing
    assert a.use_kl_loss and a.kl_loss_coef == 0.01 and a.kl_loss_type == "low_var_kl" and a.entropy_coeff == 0
    assert a.use_torch_compile is False and r.name == "vllm" and r.gpu_memory_utilization == 0.4 and r.n == 4
    assert list(b.trainer.logger) == ["console", "tensorboard"] and b.trainer.val_before_train is False
    assert b.trainer.resume_mode == "auto" and b.trainer.save_freq == -1


def test_longseq_derives_long_sequence_settings():
    rc = load_recipe("qwen25vl_geo3k_longseq", _filled(find_recipe("qwen25vl_geo3k_longseq")))
    b = rc.backend
    assert b.data.max_response_length > 8192
    seq = b.data.max_prompt_length + b.data.max_response_length
    derived = {d.key.removeprefix("backend_config.") for d in rc.derived}
    assert b.actor_rollout_ref.rollout.max_num_batched_tokens == seq
    assert {
        "actor_rollout_ref.rollout.max_num_batched_tokens",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    } <= derived
    assert b.actor_rollout_ref.actor.ulysses_sequence_parallel_size > 1


def test_gsm8k_is_a_text_grpo_recipe():
    rc = load_recipe("qwen25_gsm8k", _filled(find_recipe("qwen25_gsm8k")))
    assert rc.backend.algorithm.adv_estimator == "grpo" and rc.backend.actor_rollout_ref.rollout.n >= 2
    assert "gsm8k" in str(rc.backend.data.train_files) or "gsm8k" in find_recipe("qwen25_gsm8k").read_text()


def test_find_recipe_by_name_and_path(tmp_path, monkeypatch):
    assert find_recipe("qwen25_gsm8k") == REPO / "recipes" / "qwen25_gsm8k.yaml"
    monkeypatch.chdir(REPO)
    assert find_recipe("recipes/qwen25_gsm8k.yaml") == Path("recipes/qwen25_gsm8k.yaml")
    with pytest.raises(UserError, match="Did you mean qwen25_gsm8k"):
        find_recipe("qwen25_gsm8")
    with pytest.raises(UserError, match="recipe file not found"):
        find_recipe(str(tmp_path / "x.yaml"))


def test_copy_refuses_to_overwrite_and_lists_fields(tmp_path):
    target, fields = copy_recipe("qwen25vl_geo3k", tmp_path)
    assert target == tmp_path / "qwen25vl_geo3k.yaml"
    assert target.read_text() == find_recipe("qwen25vl_geo3k").read_text()
    assert sorted(fields) == sorted(REQUIRED)
    with pytest.raises(UserError, match="already exists"):
        copy_recipe("qwen25vl_geo3k", target)
    with pytest.raises(UserError, match="does not exist"):
        copy_recipe("qwen25vl_geo3k", tmp_path / "no" / "x.yaml")


ACCELERATOR_RL = [p for p in RECIPES if not p.stem.startswith("tiny_")]


@pytest.mark.parametrize("path", ACCELERATOR_RL, ids=[p.stem for p in ACCELERATOR_RL])
def test_the_one_step_off_version_of_each_accelerator_recipe_validates(path):
    """docs/async.md, 'One-step-off versions of the shipped recipes': the recipe's trainer devices, as many again
    for the rollout side (its own engines), verl's batch rule for parameter_sync_step, k=1, decoupled PPO; a DAPO
    recipe's gen_batch_size unset (refills replace filtered groups one for one)."""
    cfg = load_recipe(path.stem, _filled(path)).typed
    devices = cfg.trainer.n_gpus_per_node
    sync_step = cfg.data.train_batch_size // cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    one_step_off = [
        "trainer.v1.trainer_mode=separate_async",
        "actor_rollout_ref.rollout.nnodes=1",
        f"actor_rollout_ref.rollout.n_gpus_per_node={devices}",
        f"trainer.v1.separate_async.parameter_sync_step={sync_step}",
        "trainer.v1.sampler.max_off_policy_threshold=1",
        "algorithm.rollout_correction.rollout_is=token",
    ]
    if cfg.algorithm.filter_groups.enable:
        one_step_off.append("data.gen_batch_size=null")
    async_cfg = load_recipe(path.stem, _filled(path) + one_step_off).typed
    assert async_cfg.trainer.v1.trainer_mode == "separate_async"
    assert async_cfg.actor_rollout_ref.rollout.name == cfg.actor_rollout_ref.rollout.name  # its own engine
    assert sync_step * cfg.actor_rollout_ref.actor.ppo_mini_batch_size == cfg.data.train_batch_size
