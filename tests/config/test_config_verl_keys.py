"""verl's deprecated keys that verl 0.9.1 still reads (mapped, with a warning), and keys added with `+`
that nothing reads (ignored, with a warning; refused by `validate --strict`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from run_helpers import FLAGSHIP_FILLED as FILLED

from verl_npu.config import load_recipe
from verl_npu.errors import ConfigErrors

REPO = Path(__file__).resolve().parents[2]
A = "backend_config.actor_rollout_ref."


@pytest.fixture(autouse=True)
def _validated_as_on_npus(monkeypatch):
    """The flagship recipe validated as on its target machine (see tests/config/test_config_rules.py)."""
    import verl_npu.device as device

    monkeypatch.setattr(device, "configured_device", lambda requested=None: device.DeviceInfo("npu"))


def _load(*overrides: str):
    return load_recipe("qwen25vl_geo3k", [*FILLED, *overrides])


@pytest.mark.parametrize(
    "old,new,value,extra,per_gpu,ranks",
    [
        ("actor.ppo_micro_batch_size", "actor.ppo_micro_batch_size_per_gpu", 16, [], 2, 8),
        ("rollout.log_prob_micro_batch_size", "rollout.log_prob_micro_batch_size_per_gpu", 24, [], 3, 8),
        (
            "ref.log_prob_micro_batch_size",
            "ref.log_prob_micro_batch_size_per_gpu",
            8,
            ["trainer.n_gpus_per_node=4", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
            4,
            2,
        ),
        # floor division, as verl's old per-device split: 20 // 8 = 2
        ("actor.ppo_micro_batch_size", "actor.ppo_micro_batch_size_per_gpu", 20, [], 2, 8),
    ],
)
def test_deprecated_micro_batch_size_is_divided_by_the_data_parallel_ranks(old, new, value, extra, per_gpu, ranks):
    rc = _load(f"~actor_rollout_ref.{new}", f"actor_rollout_ref.{old}={value}", *extra)
    assert OmegaConf.select(rc.cfg, A + new) == per_gpu
    warning = next(w for w in rc.warnings if "deprecated" in w)
    assert f"actor_rollout_ref.{old}={value}" in warning and f"actor_rollout_ref.{new}={per_gpu}" in warning
    assert f"{value} // {ranks} data-parallel ranks" in warning and "\n" not in warning
    derived = {d.key: d for d in rc.derived}
    assert derived[A + new].value == per_gpu and old in derived[A + new].reason
    assert A + new in rc.user_keys
    assert f"derived: from verl's deprecated actor_rollout_ref.{old}={value}" in rc.to_yaml()


def test_deprecated_critic_micro_batch_size():
    rc = _load("critic.ppo_micro_batch_size=32")
    assert rc.backend.critic.ppo_micro_batch_size_per_gpu == 4
    assert any(
        "critic.ppo_micro_batch_size=32" in w and "critic.ppo_micro_batch_size_per_gpu=4" in w for w in rc.warnings
    )


def test_deprecated_micro_batch_size_null_is_not_set():
    rc = _load("actor_rollout_ref.actor.ppo_micro_batch_size=null")
    assert rc.backend.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 1  # the recipe's own value
    assert not any("deprecated" in w for w in rc.warnings)


@pytest.mark.parametrize(
    "old,new",
    [
        ("actor.ppo_micro_batch_size", "actor.ppo_micro_batch_size_per_gpu"),
        ("rollout.log_prob_micro_batch_size", "rollout.log_prob_micro_batch_size_per_gpu"),
        ("ref.log_prob_micro_batch_size", "ref.log_prob_micro_batch_size_per_gpu"),
    ],
)
def test_deprecated_and_new_key_both_set_are_refused(old, new):
    with pytest.raises(ConfigErrors) as info:
        _load(f"actor_rollout_ref.{old}=16", f"actor_rollout_ref.{new}=2")  # even when they would agree
    (problem,) = [p for p in info.value.problems if "both set" in p.message]
    assert problem.key == A + old and new in problem.message and f"remove actor_rollout_ref.{old}" in problem.fix


def test_both_set_with_dynamic_batch_sizes_only_warns():
    """verl checks the pair only without use_dynamic_bsz (then it reads neither)."""
    rc = _load("actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_micro_batch_size=16")
    assert rc.backend.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 1  # the recipe's, untouched
    assert any(
        "actor_rollout_ref.actor.ppo_micro_batch_size (verl's deprecated key) is not read" in w for w in rc.warnings
    )


def test_deprecated_micro_batch_size_below_one_per_device_is_refused():
    with pytest.raises(ConfigErrors) as info:
        _load("~actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.actor.ppo_micro_batch_size=4")
    assert [p.key for p in info.value.problems] == [A + "actor.ppo_micro_batch_size"]  # once, not again as unset
    assert "0 responses per device" in info.value.problems[0].message


def test_remove_previous_ckpt_in_save():
    rc = _load("trainer.remove_previous_ckpt_in_save=true")
    assert rc.backend.trainer.max_actor_ckpt_to_keep == 1 and rc.backend.trainer.max_critic_ckpt_to_keep == 1
    assert any(
        "trainer.remove_previous_ckpt_in_save=true" in w and "trainer.max_actor_ckpt_to_keep=1" in w
        for w in rc.warnings
    )
    off = _load("trainer.remove_previous_ckpt_in_save=false")
    assert off.backend.trainer.max_actor_ckpt_to_keep is None
    agree = _load("trainer.remove_previous_ckpt_in_save=true", "trainer.max_critic_ckpt_to_keep=1")
    assert agree.backend.trainer.max_critic_ckpt_to_keep == 1
    with pytest.raises(ConfigErrors) as info:
        _load("trainer.remove_previous_ckpt_in_save=true", "trainer.max_critic_ckpt_to_keep=2")
    assert info.value.problems[0].key == "backend_config.trainer.remove_previous_ckpt_in_save"
    assert "max_critic_ckpt_to_keep is 2" in info.value.problems[0].message


def test_deprecated_key_in_a_recipe_file(tmp_path):
    recipe = tmp_path / "r.yaml"
    text = (REPO / "recipes" / "qwen25vl_geo3k.yaml").read_text()
    raw = yaml.safe_load(text)
    actor = raw["backend_config"]["actor_rollout_ref"]["actor"]
    actor.pop("ppo_micro_batch_size_per_gpu")
    actor["ppo_micro_batch_size"] = 8
    recipe.write_text(yaml.safe_dump(raw))
    rc = load_recipe(recipe, FILLED)
    assert rc.backend.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 1


# ------------------------------------------------------------------ keys added with +
def test_plus_key_nothing_reads_is_ignored_with_one_warning():
    rc = _load("+trainer.fork_only_knob=3", "+data.max_promt_length=5", "++myfork.opt=true")
    assert set(rc.ignored) == {
        "backend_config.trainer.fork_only_knob",
        "backend_config.data.max_promt_length",
        "myfork.opt",
    }
    warnings = [w for w in rc.warnings if w.startswith("added with +, read by nothing here: ignored")]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "trainer.fork_only_knob=3" in warnings[0] and "myfork.opt=true" in warnings[0]
    assert "data.max_promt_length=5 (did you mean data.max_prompt_length?)" in warnings[0]
    assert "max_promt_length" not in rc.backend.data and "fork_only_knob" not in rc.backend.trainer


def test_plus_key_is_listed_in_exp_config_and_the_file_loads_again(tmp_path):
    rc = _load("+trainer.fork_only_knob=3")
    text = rc.to_yaml()
    assert "# ignored: added with + on the command line, read by nothing here" in text
    assert "#   trainer.fork_only_knob=3" in text
    assert "fork_only_knob" not in yaml.safe_dump(yaml.safe_load(text))  # a comment, not a key
    path = tmp_path / "exp-config.yaml"
    path.write_text(text)
    assert OmegaConf.to_container(load_recipe(path).cfg) == OmegaConf.to_container(rc.cfg)


def test_plus_on_a_known_key_sets_it_and_ignores_nothing():
    rc = _load("+data.max_prompt_length=256", "+actor_rollout_ref.rollout.max_num_batched_tokens=8192")
    assert rc.backend.data.max_prompt_length == 256 and rc.ignored == {}
    assert not any(w.startswith("added with +") for w in rc.warnings)


def test_unknown_key_without_plus_stays_an_error():
    with pytest.raises(ConfigErrors) as info:
        _load("trainer.fork_only_knob=3")
    assert info.value.problems[0].key == "backend_config.trainer.fork_only_knob"
    assert "unknown key" in info.value.problems[0].message


def test_tilde_removes_an_ignored_plus_key():
    rc = _load("+trainer.fork_only_knob=3", "~trainer.fork_only_knob")
    assert rc.ignored == {}


def _cli(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "verl_npu.cli", *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=120
    )


def test_validate_warns_and_strict_refuses_plus_keys():
    args = ["validate", "tiny_geo3k", "+trainer.fork_only_knob=3", "+data.max_promt_length=5"]
    ok = _cli(*args)
    assert ok.returncode == 0, ok.stderr
    assert (
        "added with +, read by nothing here: ignored" in ok.stderr
        and "did you mean data.max_prompt_length" in ok.stderr
    )
    strict = _cli(*args, "--strict")
    assert strict.returncode == 1
    assert "trainer.fork_only_knob" in strict.stderr and "data.max_promt_length" in strict.stderr
    assert "Traceback" not in strict.stderr
    clean = _cli("validate", "tiny_geo3k", "--strict")
    assert clean.returncode == 0, clean.stderr


def test_explain_a_deprecated_key_verl_still_reads():
    out = _cli("explain", "actor_rollout_ref.rollout.log_prob_micro_batch_size")
    assert out.returncode == 0 and "log_prob_micro_batch_size_per_gpu" in out.stdout
    refused = _cli("explain", "reward_model.micro_batch_size")
    assert refused.returncode == 1 and "reward_model.micro_batch_size_per_gpu" in refused.stderr


def test_deprecated_optimizer_grad_clip_added_with_plus_is_read():
    """verl 0.9.1's optimizer config still takes `grad_clip` (deprecated; copied to clip_grad): verl reads
    it, so it is mapped, not ignored as a +key that nothing reads."""
    rc = _load("+actor_rollout_ref.actor.optim.grad_clip=0.5", "+critic.optim.grad_clip=0.25")
    assert rc.backend.actor_rollout_ref.actor.grad_clip == 0.5 and rc.backend.critic.grad_clip == 0.25
    assert rc.ignored == {}
    assert any(
        "actor_rollout_ref.actor.optim.grad_clip=0.5 is verl's deprecated key" in w
        and "actor_rollout_ref.actor.grad_clip=0.5" in w
        for w in rc.warnings
    )
    with pytest.raises(ConfigErrors) as info:
        _load("+actor_rollout_ref.actor.optim.grad_clip=0.5", "actor_rollout_ref.actor.optim.clip_grad=2.0")
    assert info.value.problems[0].key == A + "actor.optim.grad_clip"
    assert "actor_rollout_ref.actor.optim.clip_grad is 2.0" in info.value.problems[0].message
    with pytest.raises(ConfigErrors) as info:
        _load("+actor_rollout_ref.actor.optim.grad_clip=-1")
    assert (
        info.value.problems[0].key == A + "actor.optim.grad_clip" and "out of range" in info.value.problems[0].message
    )
