"""`verl-npu import roll` (issue 39): Hydra `defaults:` and `${...}` resolved from the files beside the
config, device_mapping strings, the batch arithmetic, ROLL's differing defaults written out, the agentic
pipeline onto the grid environments; every ROLL example of the corpus (tests/fixtures/import/roll) imports
without a traceback, every input key has a row, and every recipe validates or names what it lacks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from import_helpers import assert_every_key_is_in_the_table, assert_valid_or_names_what_it_lacks

from verl_npu.errors import UserError
from verl_npu.importers import import_config, import_to, read_config
from verl_npu.importers.hydra import compose, device_list
from verl_npu.importers.ledger import DEFAULT, MAPPED, NOT_MAPPED, flatten_input

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "import" / "roll"
CORPUS = sorted(str(p.relative_to(DATA)) for p in DATA.glob("*/*.yaml") if p.parent.name != "config")
AC, RO = "backend_config.actor_rollout_ref.actor", "backend_config.actor_rollout_ref.rollout"


def test_defaults_are_composed_from_beside_the_config_and_interpolations_resolved():
    tree, files = compose(DATA / "qwen2.5-0.5B-agentic" / "agentic_val_sokoban.yaml")
    assert [f.name for f in files] == [
        "agentic_val_sokoban.yaml",
        "traj_envs.yaml",
        "deepspeed_zero.yaml",
        "deepspeed_zero2.yaml",
    ]
    resolved = read_config("roll", DATA / "qwen2.5-0.5B-agentic" / "agentic_val_sokoban.yaml")
    env = resolved["custom_envs"]["SimpleSokoban"]
    # ${custom_env.SimpleSokoban} from the included file, whose ${max_tokens_per_step} the config overrides (64)
    assert env["env_type"] == "sokoban" and env["max_tokens_per_step"] == 64 and env["max_steps"] == 10
    assert "defaults" not in resolved


def test_a_missing_include_or_interpolation_is_named(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("defaults:\n  - ../config/nowhere@_here_\n")
    with pytest.raises(UserError, match="nowhere.yaml, which does not exist"):
        read_config("roll", cfg)
    cfg.write_text("a: ${b}\n")
    with pytest.raises(UserError, match="interpolation at a"):
        read_config("roll", cfg)


def test_device_mapping_strings_are_evaluated_without_eval():
    assert device_list("list(range(0,16))", "k") == list(range(16))
    assert device_list("[0, 1] + list(range(4, 6))", "k") == [0, 1, 4, 5]
    with pytest.raises(UserError, match="not a device list"):
        device_list("__import__('os').system('true')", "actor_train.device_mapping")


def test_rlvr_arithmetic_and_rolls_defaults(tmp_path):
    r = import_config("roll", DATA / "qwen2.5-7B-rlvr_megatron" / "rlvr_config.yaml")
    rec = r.recipe
    assert rec["backend_config.data.train_batch_size"] == 64  # prompts
    assert rec[f"{RO}.n"] == 8
    # per_device 1 x GA 32 x dp (16 devices / TP 2) = 256 responses = 32 prompts of 8
    assert rec[f"{AC}.ppo_mini_batch_size"] == 32
    assert rec["backend_config.trainer.nnodes"] == 2 and rec["backend_config.trainer.n_gpus_per_node"] == 8
    # ROLL's loss_agg_mode default differs from verl's: written out, with a 'default' row
    assert rec[f"{AC}.loss_agg_mode"] == "seq-mean-token-mean"
    rows = {row.key: row for row in r.rows}
    assert rows["loss_agg_mode"].status == DEFAULT
    assert rows["actor_train.strategy_args.strategy_name"].status == NOT_MAPPED
    assert "Megatron" in rows["actor_train.strategy_args.strategy_name"].note
    assert rows["adv_estimator"].status == NOT_MAPPED  # reinforce: no verl-npu estimator
    assert all(k.startswith("deepspeed_") for k in rows if k.startswith("deepspeed"))
    assert rows["deepspeed_zero2.zero_optimization.stage"].status == NOT_MAPPED


def test_temperature_and_top_p_defaults_are_written_out(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "pretrain: m\nrollout_batch_size: 4\nnum_return_sequences_in_group: 2\n"
        "actor_infer:\n  strategy_args: {strategy_name: vllm}\n  device_mapping: list(range(0,2))\n"
    )
    r = import_config("roll", cfg)
    assert r.recipe[f"{RO}.temperature"] == 0.95 and r.recipe[f"{RO}.top_p"] == 0.7 and r.recipe[f"{RO}.top_k"] == 50
    assert r.recipe["backend_config.algorithm.adv_estimator"] == "gae"
    assert r.recipe["backend_config.algorithm.lam"] == 0.95


def test_agentic_maps_onto_the_grid_environment(tmp_path):
    result, out = import_to("roll", DATA / "qwen2.5-0.5B-agentic" / "agentic_val_sokoban.yaml", tmp_path / "r.yaml")
    rec = result.recipe
    assert rec["backend_config.data.train_batch_size"] == 16  # 128 trajectories / group_size 8
    assert rec[f"{RO}.n"] == 8
    assert rec["backend_config.algorithm.reward_norm.grouping"] == "state"  # traj_group_id
    assert rec["backend_config.algorithm.reward_norm.method"] == "mean_std"
    interaction = yaml.safe_load((tmp_path / "r.interaction.yaml").read_text())["interaction"][0]
    assert interaction["config"] == {
        "env": "sokoban",
        "env_config": {"size": 6},
        "max_steps": 10,
        "max_tokens_per_step": 64,
        "format_penalty": -0.15,
    }
    assert rec[f"{RO}.multi_turn.interaction_config_path"] == str(tmp_path / "r.interaction.yaml")
    assert result.validated, result.problems
    rows = {row.key: row for row in result.rows}
    assert rows["custom_envs.LargerSokoban.env_config.num_boxes"].status == NOT_MAPPED


def test_async_generation_maps_onto_separate_async():
    r = import_config("roll", DATA / "qwen3-8B-rlvr_fsdp2" / "rlvr_config_async.yaml")
    row = next(row for row in r.rows if row.key == "async_generation_ratio")
    assert row.status == MAPPED and row.target == "trainer.v1.sampler.max_off_policy_threshold"
    rec = {k.removeprefix("backend_config."): v for k, v in r.recipe.items()}
    # ratio 1: the next batch generated while this one trains, one model version stale at most
    assert (
        rec["trainer.v1.trainer_mode"] == "separate_async" and rec["trainer.v1.sampler.max_off_policy_threshold"] == 1
    )
    assert rec["trainer.v1.separate_async.parameter_sync_step"] == (
        rec["data.train_batch_size"] // rec["actor_rollout_ref.actor.ppo_mini_batch_size"]
    )


def test_the_sft_pipeline_becomes_an_sft_recipe(tmp_path):
    result, out = import_to("roll", DATA / "qwen3-30BA3B-sft_fsdp2" / "sft_config.yaml", tmp_path / "r.yaml")
    assert result.kind == "sft" and result.validated, result.problems
    rec = {k.removeprefix("backend_config."): v for k, v in result.recipe.items()}
    # per_device_train_batch_size 1 x gradient_accumulation_steps 8 x 8 devices of its device_mapping
    assert (rec["data.train_batch_size"], rec["data.micro_batch_size_per_gpu"], rec["data.use_dynamic_bsz"]) == (
        64,
        1,
        False,
    )
    assert (rec["model.path"], rec["optim.lr"], rec["data.max_length"]) == ("Qwen/Qwen3-30B-A3B", 1e-5, 4096)
    assert (rec["engine.strategy"], rec["engine.dtype"], rec["trainer.total_training_steps"]) == (
        "fsdp2",
        "bfloat16",
        1000,
    )
    assert any("foreign_json.py roll --sft --input data/sft_data.jsonl" in n for n in result.notes)


def test_the_corpus_covers_the_kinds_the_issue_names():
    assert len(CORPUS) >= 8
    text = " ".join((DATA / n).read_text() for n in CORPUS)
    for marker in (
        'adv_estimator: "grpo"',
        'adv_estimator: "gae"',
        "lora_rank",
        "pg_clip_high",
        "train_env_manager",
        "async_generation_ratio: 1",
        "sft_train",
        "ascend",
        "deepspeed_train",
    ):
        assert marker in text, marker


@pytest.mark.parametrize("name", CORPUS)
def test_every_corpus_config_imports_with_every_key_in_the_table(name, tmp_path):
    path = DATA / name
    result, out = import_to("roll", path, tmp_path / "recipe.yaml")
    assert_every_key_is_in_the_table(result, set(flatten_input(read_config("roll", path))))
    assert out is not None and result.kind == ("sft" if "sft" in name else "rl")
    assert_valid_or_names_what_it_lacks(result)
