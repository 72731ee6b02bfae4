"""Loading: YAML, overrides (full/short form, lists, booleans), merge, derived values, to_yaml,
check_paths and the generated reference doc."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from run_helpers import FLAGSHIP_FILLED as FILLED

from verl_npu.config import SCHEMA, check_paths, describe_key, find_key, load_recipe, parse_override, parse_value
from verl_npu.config.reference import render_reference
from verl_npu.errors import ConfigErrors, UserError

REPO = Path(__file__).resolve().parents[2]
ROLL = "backend_config.actor_rollout_ref.rollout."


def _derived(rc) -> dict:
    return {d.key: d.value for d in rc.derived}


@pytest.mark.parametrize(
    "text,value",
    [
        ("64", 64),
        ("1e-6", 1e-6),
        ("0.5", 0.5),
        ("true", True),
        ("False", False),
        ("null", None),
        ("[console,tensorboard]", ["console", "tensorboard"]),
        ("error", "error"),
        ("'1'", "1"),
        ("EDIT_ME: x", "EDIT_ME: x"),
        ("{a: 1}", {"a": 1}),
        ("/a/b.parquet", "/a/b.parquet"),
    ],
)
def test_parse_value_like_verl(text, value):
    assert parse_value(text) == value


def test_override_short_full_and_hydra_plus_forms():
    assert parse_override("data.train_batch_size=64") == ("backend_config.data.train_batch_size", 64)
    assert parse_override("backend_config.data.train_batch_size=64") == ("backend_config.data.train_batch_size", 64)
    assert parse_override("+trainer.logger=[console]") == ("backend_config.trainer.logger", ["console"])
    assert parse_override("af_output_dir=/x") == ("af_output_dir", "/x")
    with pytest.raises(UserError, match="not key=value"):
        parse_override("data.train_batch_size")
    assert parse_override("++data.seed=3") == ("backend_config.data.seed", 3)
    from verl_npu.config.overrides import DELETE

    assert parse_override("~data.seed") == ("backend_config.data.seed", DELETE)
    assert parse_override("~data.seed=1") == ("backend_config.data.seed", DELETE)


def test_overrides_apply_over_the_recipe():
    rc = load_recipe(
        "qwen25vl_geo3k",
        FILLED
        + [
            "data.train_batch_size=64",
            "backend_config.trainer.total_epochs=2",
            "trainer.logger=[console]",
            "trainer.val_before_train=True",
            "actor_rollout_ref.actor.optim.lr=3e-6",
            "data.train_files=[a.parquet,b.parquet]",
        ],
    )
    b = rc.backend
    assert b.data.train_batch_size == 64 and b.trainer.total_epochs == 2
    assert list(b.trainer.logger) == ["console"] and b.trainer.val_before_train is True
    assert b.actor_rollout_ref.actor.optim.lr == pytest.approx(3e-6)
    assert list(b.data.train_files) == ["a.parquet", "b.parquet"]
    assert rc.cfg.af_output_dir == "/tmp/verl_npu_out"
    # the recipe's own values and the defaults are there too
    assert b.actor_rollout_ref.rollout.tensor_model_parallel_size == 4
    assert b.data.prompt_key == "prompt" and b.actor_rollout_ref.actor.clip_ratio_c == 3.0
    assert rc.source == REPO / "recipes" / "qwen25vl_geo3k.yaml"


def test_every_schema_key_is_in_the_resolved_config():
    rc = load_recipe("qwen25vl_geo3k", FILLED)
    for path in SCHEMA:
        assert OmegaConf.select(rc.cfg, path, default="<missing>") != "<missing>", path


def test_free_form_engine_kwargs_merge_and_pass_through():
    rc = load_recipe(
        "qwen25vl_geo3k",
        FILLED
        + [
            "+engine_kwargs.vllm.mm_processor_cache_gb=0",
            "actor_rollout_ref.model.override_config.attn_implementation=eager",
        ],
    )
    assert dict(rc.cfg.engine_kwargs.vllm) == {"disable_mm_preprocessor_cache": True, "mm_processor_cache_gb": 0}
    engine = dict(rc.backend.actor_rollout_ref.rollout.engine_kwargs.vllm)
    assert engine == {"disable_mm_preprocessor_cache": True, "mm_processor_cache_gb": 0}
    assert _derived(rc)[ROLL + "engine_kwargs.vllm"] == engine
    assert rc.backend.actor_rollout_ref.model.override_config.attn_implementation == "eager"


def test_derived_values_with_reasons():
    rc = load_recipe("qwen25vl_geo3k", FILLED)
    d = _derived(rc)
    assert d[ROLL + "max_num_batched_tokens"] == 8192 and d[ROLL + "max_model_len"] == 2048
    assert d[ROLL + "response_length"] == 1024
    assert d["backend_config.trainer.default_local_dir"] == "/tmp/verl_npu_out/checkpoints"
    assert d["backend_config.trainer.tensorboard_dir"] == "/tmp/verl_npu_out/tensorboard"
    assert all(x.reason for x in rc.derived)
    assert rc.backend.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 1


def test_long_sequence_derivations_follow_the_seed_rule():
    rc = load_recipe(
        "qwen25vl_geo3k", FILLED + ["data.max_response_length=16384", "actor_rollout_ref.actor.use_dynamic_bsz=true"]
    )
    b = rc.backend.actor_rollout_ref
    assert b.rollout.max_num_batched_tokens == 1024 + 16384
    assert b.actor.ulysses_sequence_parallel_size == 8 and b.ref.ulysses_sequence_parallel_size == 8
    assert b.actor.ppo_max_token_len_per_gpu == 4 * (1024 + 16384)
    assert b.rollout.log_prob_max_token_len_per_gpu == b.ref.log_prob_max_token_len_per_gpu == 4 * 17408
    assert b.rollout.log_prob_use_dynamic_bsz is True


def test_sequence_parallel_is_lowered_to_fit_devices_and_heads(tmp_path):
    model = tmp_path / "qwen"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_attention_heads": 28, "num_key_value_heads": 4}))
    rc = load_recipe(
        "qwen25vl_geo3k", FILLED + ["data.max_response_length=16384", f"actor_rollout_ref.model.path={model}"]
    )
    assert rc.backend.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 4
    rc = load_recipe(
        "qwen25vl_geo3k",
        FILLED
        + [
            "data.max_response_length=12288",
            "trainer.n_gpus_per_node=4",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        ],
    )
    assert rc.backend.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 4  # 12288 // 2048 = 6 -> 4


def test_explicit_user_values_are_never_overwritten():
    rc = load_recipe(
        "qwen25vl_geo3k",
        FILLED
        + [
            "data.max_response_length=16384",
            "actor_rollout_ref.rollout.max_num_batched_tokens=40000",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "trainer.default_local_dir=/ckpt",
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20000",
            "actor_rollout_ref.actor.clip_ratio_high=0.28",
            "actor_rollout_ref.rollout.max_model_len=30000",
        ],
    )
    b = rc.backend
    assert b.actor_rollout_ref.rollout.max_num_batched_tokens == 40000
    assert b.actor_rollout_ref.rollout.max_model_len == 30000
    assert b.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 2
    assert b.actor_rollout_ref.ref.ulysses_sequence_parallel_size == 2  # follows the actor
    assert b.trainer.default_local_dir == "/ckpt"
    assert b.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 20000
    assert b.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == 20000
    assert b.actor_rollout_ref.actor.clip_ratio_high == 0.28 and b.actor_rollout_ref.actor.clip_ratio_low == 0.2
    user_set = {ROLL + "max_num_batched_tokens", "backend_config.trainer.default_local_dir"}
    assert not user_set & {d.key for d in rc.derived}


def test_hf_rollout_tp_derived_when_unset(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "af_output_dir": "out",
                "backend_config": {
                    "data": {"train_files": "t.parquet", "val_files": "v.parquet", "train_batch_size": 4},
                    "actor_rollout_ref": {
                        "model": {"path": "tiny://qwen2"},
                        "actor": {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 1},
                        "rollout": {"name": "hf", "n": 2, "log_prob_micro_batch_size_per_gpu": 4},
                    },
                    "trainer": {"n_gpus_per_node": 1, "device": "cpu"},
                },
            }
        )
    )
    rc = load_recipe(recipe)
    assert rc.backend.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert rc.world_size == 1 and rc.source == recipe


def test_to_yaml_round_trips_and_marks_derived_values(tmp_path):
    rc = load_recipe("qwen25vl_geo3k", FILLED)
    text = rc.to_yaml()
    assert yaml.safe_load(text) == OmegaConf.to_container(rc.cfg, resolve=True)
    line = next(x for x in text.splitlines() if x.strip().startswith("max_num_batched_tokens:"))
    assert "# derived:" in line
    assert "# derived:" not in next(x for x in text.splitlines() if x.strip().startswith("train_batch_size:"))
    resolved = tmp_path / "exp-config.yaml"
    resolved.write_text(text)
    again = load_recipe(resolved)  # the resolved file is itself a valid recipe
    assert OmegaConf.to_container(again.cfg) == OmegaConf.to_container(rc.cfg)


def test_interpolation_with_full_keys(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        (REPO / "recipes" / "qwen25vl_geo3k.yaml")
        .read_text()
        .replace("experiment_name: qwen25vl_7b_grpo", "experiment_name: run_${backend_config.data.train_batch_size}")
    )
    rc = load_recipe(recipe, FILLED)
    assert rc.backend.trainer.experiment_name == "run_32"


def test_bad_yaml_and_missing_file_are_user_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("backend_config:\n  data: [unclosed\n")
    with pytest.raises(UserError, match="bad.yaml: not valid YAML"):
        load_recipe(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(UserError, match="must be a YAML mapping"):
        load_recipe(listy)
    with pytest.raises(UserError, match="recipe file not found: .*nope.yaml"):
        load_recipe(tmp_path / "nope.yaml")
    with pytest.raises(UserError, match="no recipe named 'qwen25vl_geo3kk'.*Did you mean qwen25vl_geo3k"):
        load_recipe("qwen25vl_geo3kk")


def test_unknown_key_in_recipe_file_is_named(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        (REPO / "recipes" / "qwen25vl_geo3k.yaml").read_text().replace("    shuffle: true\n", "    shufle: true\n", 1)
    )
    with pytest.raises(ConfigErrors) as info:
        load_recipe(recipe, FILLED)
    (problem,) = info.value.problems
    assert problem.key == "backend_config.data.shufle" and "r.yaml" in problem.message
    assert "did you mean backend_config.data.shuffle" in problem.fix


def test_check_paths(tmp_path):
    train, val, model = tmp_path / "train.parquet", tmp_path / "test.parquet", tmp_path / "model"
    rc = load_recipe(
        "qwen25vl_geo3k",
        FILLED[:1] + [f"data.train_files={train}", f"data.val_files=[{val}]", f"actor_rollout_ref.model.path={model}"],
    )
    keys = sorted(p.key for p in check_paths(rc))
    assert keys == [
        "backend_config.actor_rollout_ref.model.path",
        "backend_config.data.train_files",
        "backend_config.data.val_files",
    ]
    train.write_bytes(b"PAR1")  # a parquet file's magic bytes: what --check-paths reads
    val.write_bytes(b"PAR1")
    model.mkdir()
    assert check_paths(rc) == []
    tiny = load_recipe(
        "qwen25vl_geo3k",
        FILLED[:1]
        + [f"data.train_files={train}", f"data.val_files={val}", "actor_rollout_ref.model.path=tiny://qwen25vl"],
    )
    assert check_paths(tiny) == []
    with pytest.raises(ConfigErrors, match="model folder"):
        load_recipe("qwen25vl_geo3k", FILLED, check_paths=True)


def test_find_key_and_describe():
    assert find_key("data.max_prompt_length") is find_key("backend_config.data.max_prompt_length")
    assert find_key("data.nope") is None
    text = describe_key(find_key("actor_rollout_ref.actor.ppo_mini_batch_size"))
    assert "type: int" in text and "default: 256" in text and "ppo_mini_batch_size x rollout.n" in text


def test_config_import_stays_light():
    import subprocess

    code = (
        "import sys, verl_npu.cli, verl_npu.config; "
        "print(sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


def test_reference_doc_is_in_sync():
    doc = (REPO / "docs" / "config_reference.md").read_text()
    assert doc == render_reference(), "regenerate: python -m verl_npu.config.reference > docs/config_reference.md"
    for path in SCHEMA:
        assert f"`{find_key(path).short}`" in doc


def test_check_paths_reads_the_critic_model_path_only_when_a_critic_is_trained(tmp_path):
    (tmp_path / "model").mkdir()
    base = FILLED[:1] + [
        f"data.train_files={tmp_path / 'model'}",
        f"data.val_files={tmp_path / 'model'}",
        f"actor_rollout_ref.model.path={tmp_path / 'model'}",
        f"critic.model.path={tmp_path / 'nope'}",
    ]
    base[1] = "data.train_files=" + str(tmp_path / "t.parquet")
    base[2] = "data.val_files=" + str(tmp_path / "t.parquet")
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    grpo = load_recipe("qwen25vl_geo3k", base)
    assert check_paths(grpo) == []  # verl's default critic path is set in scripts that train no critic
    gae = load_recipe("qwen25vl_geo3k", base + ["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=1"])
    (problem,) = check_paths(gae)
    assert problem.key == "backend_config.critic.model.path" and "does not exist" in problem.message
