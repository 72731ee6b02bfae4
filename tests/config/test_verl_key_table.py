"""verl-npu's verl key table against verl 0.9.1's own schema (issue 23).

Both directions: no leaf key of verl 0.9.1's generated `ppo_trainer` schema is "unknown" here
(each is supported, a no-op, or refused by name), and every key verl-npu calls a verl key is one of
verl 0.9.1's, unless it is marked otherwise (a "verl-npu:" schema key, `OLDER_VERL`, `READ_WITH_PLUS`,
or a deprecated key refused as no longer read). The plain tests read the checked-in lists
(tests/fixtures/verl_*_keys.txt); the `verl_side` test reads verl 0.9.1's YAML in the side venv itself,
so a stale list fails too (tests/verl_side.sh)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from verl_npu.config import load_recipe
from verl_npu.config.compat import UNKNOWN, status
from verl_npu.config.schema import SCHEMA
from verl_npu.config.schema_deprecated import DEPRECATED, DEPRECATED_MAPPED, DEPRECATED_WARN_ONLY, UNSUPPORTED_PREFIXES
from verl_npu.config.schema_verl import ALIASES, OLDER_VERL, READ_WITH_PLUS, REFUSED_SUBTREES, VERL_ONLY

HERE = Path(__file__).resolve().parents[1]  # tests/
BC = "backend_config."


def _read(name: str) -> list[str]:
    text = (HERE / "fixtures" / name).read_text()
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def unknown_keys(leaves: list[str]) -> list[str]:
    """verl's leaf keys that verl-npu reports as unknown."""
    return [k for k in leaves if status(k).kind == UNKNOWN]


def _marked(path: str) -> bool:
    """A key verl-npu says is not (or not declared as) one of verl 0.9.1's schema keys."""
    if path in DEPRECATED:
        return True
    return any(path == p or path.startswith(p + ".") for p in (*OLDER_VERL, *READ_WITH_PLUS))


def claimed_verl_keys() -> dict[str, str]:
    """Every key (or `prefix` of a whole feature) verl-npu calls a verl 0.9.1 key: short path -> where."""
    out: dict[str, str] = {}
    for path, key in SCHEMA.items():
        if path.startswith(BC) and not key.doc.startswith("verl-npu:"):
            out[path] = "SCHEMA"
    out.update({p: "ALIASES" for p in ALIASES})
    out.update({p: "VERL_ONLY" for p in VERL_ONLY})
    out.update({p: "DEPRECATED_MAPPED" for p in DEPRECATED_MAPPED})
    out.update({p: "DEPRECATED_WARN_ONLY" for p in DEPRECATED_WARN_ONLY})
    out.update({p: "REFUSED_SUBTREES" for p in REFUSED_SUBTREES})
    out.update({p: "UNSUPPORTED_PREFIXES" for p in UNSUPPORTED_PREFIXES})
    return {p.removeprefix(BC): where for p, where in out.items() if not _marked(p)}


def not_in_verl(leaves: list[str]) -> list[str]:
    """Claimed verl keys verl 0.9.1 does not have: neither a leaf, nor a section holding leaves, nor
    inside a leaf whose value is free-form (a dict, list or null there)."""
    leaf_set = set(leaves)
    sections = {k.rsplit(".", i)[0] for k in leaves for i in range(1, k.count(".") + 1)}
    missing = []
    for key, where in claimed_verl_keys().items():
        parts = key.split(".")
        inside = any(".".join(parts[:i]) in leaf_set for i in range(1, len(parts)))
        if key not in leaf_set and key not in sections and not inside:
            missing.append(f"{key} ({where})")
    return sorted(missing)


def test_the_lists_are_verl_091s():
    main, engines = _read("verl_ppo_trainer_keys.txt"), _read("verl_engine_trainer_keys.txt")
    assert len(main) > 850 and len(set(main)) == len(main) and not set(main) & set(engines)
    assert "verl 0.9.1" in (HERE / "fixtures" / "verl_ppo_trainer_keys.txt").read_text().splitlines()[0]
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size" in engines


def test_no_verl_091_key_is_unknown():
    assert unknown_keys(_read("verl_ppo_trainer_keys.txt")) == []


def test_every_key_called_verl_s_is_in_verl_091():
    assert not_in_verl(_read("verl_ppo_trainer_keys.txt") + _read("verl_engine_trainer_keys.txt")) == []


def test_marked_keys_are_really_not_in_the_schema():
    """OLDER_VERL and READ_WITH_PLUS hold only keys verl 0.9.1's schema does not declare (a key that is
    in it needs no mark), and each of them is one verl-npu knows (a schema key, an alias, a no-op, ...)."""
    leaves = set(_read("verl_ppo_trainer_keys.txt") + _read("verl_engine_trainer_keys.txt"))
    for path in (*OLDER_VERL, *READ_WITH_PLUS):
        short = path.removeprefix(BC)
        assert short not in leaves and not any(k.startswith(short + ".") for k in leaves), short
        known = [*SCHEMA, *ALIASES, *VERL_ONLY, *REFUSED_SUBTREES, *DEPRECATED_MAPPED, *UNSUPPORTED_PREFIXES]
        assert status(path).kind != UNKNOWN or any(k.startswith(path + ".") for k in known), short


@pytest.fixture(autouse=True)
def _validated_as_on_npus(monkeypatch):
    import verl_npu.device as device

    monkeypatch.setattr(device, "configured_device", lambda requested=None: device.DeviceInfo("npu"))


def test_verl_091_spellings_load_and_reach_the_keys_verl_npu_reads():
    rc = load_recipe(
        "tiny_gsm8k",
        [
            "reward.reward_manager.name=dapo",
            "reward.custom_reward_function.name=my_score",
            "critic.fsdp.param_offload=true",
            "critic.fsdp.ulysses_sequence_parallel_size=1",
            "actor_rollout_ref.actor.fsdp_config.entropy_from_logits_chunk_size=512",
            "actor_rollout_ref.actor.optim.zero_indexed_step=false",
            "trainer.use_v1=true",
            "trainer.v1.trainer_mode=sync",
            "distillation.enabled=false",
            "skip.rollout.enable=false",
            "data.audio_key=audios",
            "reward.num_workers=4",
            "global_profiler.relocate_results=true",
            "actor_rollout_ref.rollout.n_gpus_per_node=8",
            "reward._target_=verl.workers.config.RewardConfig",
        ],
    )
    b = rc.backend
    assert b.reward_model.reward_manager == "dapo" and b.custom_reward_function.name == "my_score"
    assert b.critic.model.fsdp_config.param_offload is True
    assert b.actor_rollout_ref.actor.entropy_from_logits_chunk_size == 512
    assert b.actor_rollout_ref.actor.optim.zero_indexed_step is False
    assert BC + "trainer.use_v1" in {d.key for d in rc.noop}


@pytest.mark.parametrize(
    "override,words",
    [
        ("trainer.v1.trainer_mode=colocate_async", "trainer_mode=colocate_async"),
        ("trainer.v1.separate_async.hybrid_rollout.enable_switch=true", "hybrid_rollout"),
        ("distillation.teacher_models.teacher_model2.model_path=/m", "several teacher models"),  # one teacher is read
        ("skip.rollout.enable=true", "dumped rollouts"),
        ("actor_rollout_ref.actor.fsdp_config.qat.enable=true", "quantization-aware training"),
        ("actor_rollout_ref.actor.pad_to_length=true", "fixed length buckets"),
        ("actor_rollout_ref.rollout.nnodes=2", "standalone rollout pool"),
        ("actor_rollout_ref.model.lora.rank=16", "Megatron LoRA"),
        ("reward.reward_model.rollout.name=vllm", "generative reward models"),
        ("data.mm_processor_kwargs={max_pixels: 100}", "multimodal processor"),
        ("global_profiler.finish_hook_cmd=upload.sh", "shell command"),
        ("trainer.checkpoint_callback_class=my.Callback", "callback"),
    ],
)
def test_verl_091_features_are_refused_by_key_with_a_fix(override, words):
    from verl_npu.errors import ConfigErrors

    with pytest.raises(ConfigErrors) as info:
        load_recipe("tiny_gsm8k", [override])
    key = BC + override.split("=", 1)[0]
    (problem,) = [p for p in info.value.problems if p.key == key]
    assert words in problem.message and problem.fix, str(problem)


# ------------------------------------------------------------------ against verl 0.9.1 itself
def _side(code: str) -> str:
    python = os.environ.get("VERL_SIDE_PYTHON")
    if not python:
        pytest.skip("VERL_SIDE_PYTHON is not set (tests/verl_side.sh sets it)")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, cwd=HERE.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.verl_side
def test_against_verl_091s_own_yaml():
    """verl 0.9.1's YAML read in the side venv: the checked-in lists are current, no leaf is unknown,
    every key called verl's is verl 0.9.1's, and every READ_WITH_PLUS key's name is read in verl's code."""
    found = json.loads(
        _side(
            "import runpy, sys; sys.argv = ['x', '--print']; "
            "runpy.run_path('tests/helpers/verl_keys_from_yaml.py', run_name='__main__')"
        )
    )
    assert found["version"] == "0.9.1"
    assert found["ppo_trainer"] == _read("verl_ppo_trainer_keys.txt")
    assert found["engines"] == _read("verl_engine_trainer_keys.txt")
    assert unknown_keys(found["ppo_trainer"]) == []
    assert not_in_verl(found["ppo_trainer"] + found["engines"]) == []
    names = sorted({p.rsplit(".", 1)[-1] for p in READ_WITH_PLUS})
    hits = json.loads(
        _side(
            "import importlib.util, json, pathlib\n"
            "root = pathlib.Path(list(importlib.util.find_spec('verl').submodule_search_locations)[0])\n"
            "text = '\\n'.join(p.read_text(errors='ignore') for p in root.rglob('*.py'))\n"
            f"print(json.dumps({{n: n in text for n in {names!r}}}))"
        )
    )
    assert all(hits.values()), hits


def test_token_budget_is_per_device_with_ulysses():
    """verl's *_max_token_len_per_gpu is per device: with Ulysses over sp ranks a micro batch packs budget x sp
    tokens (each rank holds 1/sp of it), so verl's long-sequence scripts set (prompt + response) / sp."""
    from verl_npu.workers.engine import micro_batching

    assert micro_batching(True, 5632, None, sp=4) == {"max_token_len": 22528}
    assert micro_batching(False, 5632, 2, sp=4) == {"micro_batch_size": 2}
    dyn = [
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "data.max_prompt_length=1024",
        "data.max_response_length=3072",
        "trainer.n_gpus_per_node=8",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.model.use_remove_padding=true",
    ]
    budgets = [
        f"actor_rollout_ref.{k}=1024"
        for k in (
            "actor.ppo_max_token_len_per_gpu",
            "rollout.log_prob_max_token_len_per_gpu",
            "ref.log_prob_max_token_len_per_gpu",
        )
    ]
    load_recipe("tiny_gsm8k", [*dyn, *budgets, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4"])
    from verl_npu.errors import ConfigErrors

    with pytest.raises(ConfigErrors) as info:
        load_recipe("tiny_gsm8k", [*dyn, *budgets, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"])
    problem = next(p for p in info.value.problems if p.key.endswith("actor.ppo_max_token_len_per_gpu"))
    assert "x 2 Ulysses ranks" in problem.message and "at least 2048" in problem.fix


def test_verl_091_reward_spellings_added_with_plus_are_read_not_ignored(tmp_path):
    """verl 0.9.1's scripts write the dapo manager's settings and the reward function's arguments under
    `reward.` with `+` (verl's schema does not declare them): they reach the keys verl-npu reads."""
    reward = tmp_path / "r.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n    return bonus\n"
    )
    rc = load_recipe(
        "tiny_gsm8k",
        [
            "reward.reward_manager.name=dapo",
            f"reward.custom_reward_function.path={reward}",
            "+reward.custom_reward_function.reward_kwargs.bonus=0.25",
            "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward.reward_kwargs.overlong_buffer_cfg.len=2",
            "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
            "+reward.reward_kwargs.overlong_buffer_cfg.log=False",
            "+reward.reward_kwargs.max_resp_len=8",
        ],
    )
    assert rc.ignored == {}
    b = rc.backend
    assert dict(b.custom_reward_function.reward_kwargs) == {"bonus": 0.25}
    cfg = b.reward_model.reward_kwargs
    assert cfg.overlong_buffer_cfg.enable is True and cfg.overlong_buffer_cfg.len == 2 and cfg.max_resp_len == 8
    rc = load_recipe(
        "tiny_gsm8k",
        [
            f"reward.custom_reward_function.path={reward}",
            "+reward.custom_reward_function.reward_kwargs.bonus=0.25",
            "~reward.custom_reward_function.reward_kwargs.bonus",
        ],
    )
    assert dict(rc.backend.custom_reward_function.reward_kwargs) == {}
