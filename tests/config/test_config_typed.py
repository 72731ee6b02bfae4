"""Typed config sections (`verl_npu.config.typed`, issue 22): generated from the one schema, read-only,
pickled to the workers, loud on an unknown key; and no training code repeats a schema default."""

from __future__ import annotations

import ast
import dataclasses
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verl_npu.config import load_recipe
from verl_npu.config.schema import SCHEMA
from verl_npu.config.typed import SECTIONS, ConfigKeyError, FrozenDict, Section, defaults, section

REPO = Path(__file__).resolve().parents[2]


def _leaf(tree: Section, path: str):
    node = tree
    for part in path.removeprefix("backend_config.").split("."):
        node = getattr(node, part)
    return node


def test_every_schema_key_is_a_typed_field_at_its_default():
    root = defaults("backend_config")
    for path, key in SCHEMA.items():
        if not path.startswith("backend_config."):
            continue
        value = _leaf(root, path)
        if key.type == "float" and key.default is not None:
            assert isinstance(value, float) and value == key.default, path
        elif isinstance(key.default, list):
            assert isinstance(value, tuple) and list(value) == key.default, path
        elif isinstance(key.default, dict):
            assert isinstance(value, FrozenDict) and value == key.default, path
        else:
            assert value == key.default and type(value) is type(key.default), path
    # one class per section, named after it; the classes list the schema's keys, nothing else
    assert SECTIONS["backend_config.actor_rollout_ref.actor.optim"].__name__ == "ActorRolloutRef_Actor_OptimSection"
    assert {p.rsplit(".", 1)[1] for p in SCHEMA if p.startswith("backend_config.data.") and p.count(".") == 2} <= set(
        SECTIONS["backend_config.data"]._keys_
    )


def test_a_loaded_recipe_reads_typed_and_equal_to_its_resolved_tree():
    rc = load_recipe("tiny_geo3k", ["data.train_batch_size=16", "actor_rollout_ref.actor.optim.lr=1"])
    cfg = rc.typed
    assert cfg.data.train_batch_size == 16
    assert cfg.actor_rollout_ref.actor.optim.lr == 1.0 and isinstance(cfg.actor_rollout_ref.actor.optim.lr, float)
    assert cfg.trainer.logger == ("console", "tensorboard")
    from omegaconf import OmegaConf

    for path in SCHEMA:
        if path.startswith("backend_config."):
            value = OmegaConf.select(rc.cfg, path)
            value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            typed = _leaf(cfg, path)
            assert (list(typed) if isinstance(typed, tuple) else typed) == value, path
    # the mapping face that verl_npu/rollout/ reads until it is converted
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.get("n") == rollout["n"] == rollout.n == 32 and "n" in rollout and "nope" not in rollout
    assert dict(rollout.items())["temperature"] == 1.0


def test_changing_a_default_in_the_schema_changes_what_the_code_reads(monkeypatch):
    """No code repeats a schema default: each reader below falls back to the schema's value, so
    changing that value in the schema (and nowhere else) changes what the code does."""
    from verl_npu import algorithms
    from verl_npu.rewards import load_reward_fn
    from verl_npu.rewards.dapo import dapo_scores
    from verl_npu.workers.actor import old_log_prob_pass_needed

    def set_default(path: str, value) -> None:
        monkeypatch.setitem(SCHEMA, path, dataclasses.replace(SCHEMA[path], default=value))

    rewards, mask = torch.tensor([[1.0, 0.0, 2.0]]), torch.ones(1, 3)

    def reinforce_returns(cfg):
        return algorithms.compute_advantages(
            "reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask, config=cfg.algorithm
        )[1]

    before = load_recipe("tiny_gsm8k").typed
    assert before.algorithm.gamma == 1.0 and before.algorithm.kl_ctrl.kl_coef == 0.001
    assert reinforce_returns(before).tolist() == [[3.0, 2.0, 2.0]]
    assert algorithms.make_kl_controller(before.algorithm.kl_ctrl).value == 0.001
    assert load_reward_fn(before.custom_reward_function).timeout_s == 30.0
    assert dapo_scores([1.0], {}, [2], before.reward_model.reward_kwargs, 3)[0] == [1.0]
    assert old_log_prob_pass_needed(before, torch.nn.Linear(1, 1)) == []

    set_default("backend_config.algorithm.gamma", 0.5)
    set_default("backend_config.algorithm.kl_ctrl.kl_coef", 0.25)
    set_default("backend_config.custom_reward_function.timeout_s", 7.0)
    set_default("backend_config.reward_model.reward_manager", "dapo")  # the config's rules ask for it with the next
    set_default("backend_config.reward_model.reward_kwargs.overlong_buffer_cfg.enable", True)
    set_default("backend_config.reward_model.reward_kwargs.overlong_buffer_cfg.len", 2)
    set_default("backend_config.reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor", 1.0)
    set_default("backend_config.actor_rollout_ref.actor.ppo_epochs", 2)
    after = load_recipe("tiny_gsm8k").typed  # the recipe sets none of these keys
    assert reinforce_returns(after).tolist() == [[1.5, 1.0, 2.0]]
    assert algorithms.make_kl_controller(after.algorithm.kl_ctrl).value == 0.25
    assert load_reward_fn(after.custom_reward_function).timeout_s == 7.0
    assert load_reward_fn({"path": None}).timeout_s == 7.0  # a partial section: the rest from the schema
    assert dapo_scores([1.0], {}, [2], after.reward_model.reward_kwargs, 3)[0] == [0.5]  # 1 - (2 - (3 - 2)) / 2
    assert dapo_scores([1.0], {}, [2], {}, 3)[0] == [0.5]
    assert old_log_prob_pass_needed(after, torch.nn.Linear(1, 1))[0].startswith("actor.ppo_epochs=2")


#: the packages (and modules, `*.py`) whose code reads the typed sections (verl_npu/tools/ joins them once
#: converted: it still reads the mapping face, `section.get("key", default)`)
TYPED_READERS = ("algorithms", "data", "rewards", "rollout", "workers", "trainer", "models", "optim.py")


def test_no_training_code_repeats_a_schema_default():
    """Statically, over the AST of the packages above: no `_cfg_get`-style reader, and no
    `.get("<schema key name>", <default>)`: a schema key is read as an attribute of its typed section."""
    leaves = {p.rsplit(".", 1)[-1] for p in SCHEMA}
    found = []
    for package in TYPED_READERS:
        path = REPO / "verl_npu" / package
        for file in [path] if path.suffix == ".py" else sorted(path.rglob("*.py")):
            for node in ast.walk(ast.parse(file.read_text())):
                where = f"{file.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.FunctionDef) and (node.name.endswith("cfg_get") or node.name == "cfg_value"):
                    found.append(f"{where}: def {node.name}")
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get"
                    and len(node.args) == 2
                    and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value in leaves
                ):
                    found.append(f"{where}: .get({node.args[0].value!r}, ...)")
    assert found == []


def test_sections_pickle_and_unpickle_in_a_fresh_interpreter(tmp_path):
    cfg = load_recipe("tiny_geo3k").typed
    data = pickle.dumps(cfg)
    assert pickle.loads(data) == cfg
    (tmp_path / "cfg.pkl").write_bytes(data)
    code = (
        "import pickle, sys; cfg = pickle.load(open(sys.argv[1], 'rb')); "
        "arr = cfg.actor_rollout_ref; print(type(cfg).__name__, arr.actor.optim.lr, arr.model.override_config)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "cfg.pkl")], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert out.stdout.split() == ["BackendConfigSection", "0.001", "{}"]


def test_unknown_keys_fail_loudly_naming_the_key():
    cfg = defaults("backend_config")
    with pytest.raises(ConfigKeyError, match=r"actor_rollout_ref\.actor\.ppo_mini_batch is not a config key"):
        cfg.actor_rollout_ref.actor.ppo_mini_batch  # noqa: B018
    with pytest.raises(AttributeError, match="data.max_prompt_len "):  # an AttributeError too: hasattr is False
        cfg.data.max_prompt_len  # noqa: B018
    with pytest.raises(KeyError, match="algorithm.gama"):
        cfg.algorithm["gama"]
    with pytest.raises(ConfigKeyError, match="algorithm.kl_ctrl.coef"):
        cfg.algorithm.kl_ctrl.get("coef", 0.1)  # a default does not hide a misspelt key
    with pytest.raises(ConfigKeyError, match="algorithm.gama .*given to section"):
        section("algorithm", {"gama": 0.5})
    with pytest.raises(ConfigKeyError, match="nope is not a config section"):
        section("nope")
    # verl's keys that change nothing here may sit in a resolved config: they are accepted and not exposed
    rc = load_recipe("tiny_gsm8k", ["actor_rollout_ref.ref.strategy=fsdp2"])
    assert "strategy" not in rc.typed.actor_rollout_ref.ref
    # and verl's keys that are supported only at their default are fields, at that default
    assert rc.typed.actor_rollout_ref.ref.fsdp_config.reshard_after_forward is True


def test_sections_are_read_only():
    cfg = defaults("backend_config")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.data.train_batch_size = 3
    with pytest.raises(TypeError, match="read-only"):
        cfg.actor_rollout_ref.model.override_config["x"] = 1
    changed = cfg.data.replace(train_batch_size=3)
    assert changed.train_batch_size == 3 and cfg.data.train_batch_size == 1024


def test_the_generated_sections_module_is_the_schemas():
    """verl_npu/config/sections.py (what a type checker reads) is what the generator writes for today's
    schema, and every section is its class: after a schema change, run `python -m verl_npu.config.sections_gen`."""
    from verl_npu.config import sections, sections_gen

    assert sections_gen.TARGET.read_text(encoding="utf-8") == sections_gen.render(), (
        "verl_npu/config/sections.py is stale: run python -m verl_npu.config.sections_gen"
    )
    for path, cls in SECTIONS.items():
        assert cls.__module__ == sections.__name__ and getattr(sections, cls.__name__) is cls, path
    assert type(section("backend_config", {})) is sections.BackendConfigSection
