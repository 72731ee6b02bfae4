"""`verl-npu import trinity` (issue 39): the two configs of Trinity-RFT's "align with verl" guide give the
values of the verl commands they were converted from, key by key; every Trinity example of the corpus
(tests/fixtures/import/trinity) imports without a traceback, every input key has a row, and every recipe
written validates or the import names exactly what it lacks."""

from __future__ import annotations

from pathlib import Path

import pytest
from import_helpers import assert_every_key_is_in_the_table, assert_valid_or_names_what_it_lacks

from verl_npu.config import load_recipe
from verl_npu.config.overrides import parse_value
from verl_npu.config.tree import get
from verl_npu.errors import UserError
from verl_npu.importers import import_config, import_to
from verl_npu.importers.ledger import MAPPED, NOT_MAPPED, flatten_input

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "import" / "trinity"
HOME = "/home/verl"

#: verl's examples/ppo_trainer/run_qwen2-7b_rm.sh as the guide prints it (seed trinity-rft-vs-verl-mapping_zh.txt)
PPO_COMMAND = f"""
algorithm.adv_estimator=gae
data.train_files=['{HOME}/data/gsm8k/train.parquet','{HOME}/data/math/train.parquet']
data.val_files=['{HOME}/data/gsm8k/test.parquet','{HOME}/data/math/test.parquet']
data.train_batch_size=1024 data.max_prompt_length=1024 data.max_response_length=512
data.filter_overlong_prompts=True data.truncation='error' data.return_raw_chat=True
actor_rollout_ref.model.path={HOME}/models/Qwen2-7B-Instruct actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1
actor_rollout_ref.actor.ppo_mini_batch_size=256 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 actor_rollout_ref.rollout.tensor_model_parallel_size=1
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.6
critic.optim.lr=1e-5 critic.model.use_remove_padding=True critic.optim.lr_warmup_steps_ratio=0.05
critic.model.path={HOME}/models/Qwen2-7B-Instruct critic.model.enable_gradient_checkpointing=True
critic.ppo_micro_batch_size_per_gpu=32 critic.model.fsdp_config.param_offload=False
critic.model.fsdp_config.optimizer_offload=False reward_model.enable=True
reward_model.model.path={HOME}/models/FsfairX-LLaMA3-RM-v0.1 reward_model.model.use_remove_padding=True
reward_model.model.fsdp_config.param_offload=True reward_model.micro_batch_size_per_gpu=32
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger=["console","wandb"]
trainer.project_name='verl_example' trainer.val_before_train=False trainer.experiment_name='Qwen2-7B-Instruct_hybrid_rm'
trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15
"""
#: verl's examples/grpo_trainer/run_deepseek7b_llm_seq_balance.sh as the guide prints it
GRPO_COMMAND = f"""
algorithm.adv_estimator=grpo data.train_files={HOME}/data/gsm8k/train.parquet
data.val_files={HOME}/data/gsm8k/test.parquet data.train_batch_size=1024 data.max_prompt_length=512
data.max_response_length=512 data.filter_overlong_prompts=True data.truncation='error'
actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.ppo_mini_batch_size=256
actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000
actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0
actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.rollout.tensor_model_parallel_size=2
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.6
actor_rollout_ref.rollout.n=8 actor_rollout_ref.ref.fsdp_config.param_offload=True
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger=["console","wandb"]
trainer.project_name='verl_grpo_example_gsm8k' trainer.experiment_name='deepseek_llm_7b_function_rm_seq_packing'
trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15
"""
#: keys of the verl commands that the Trinity configs have no field for (Trinity's guide keeps them out
#: of its conversion): the import writes nothing for them, and the recipe holds verl-npu's default
NO_TRINITY_FIELD = {
    "reward_model.model.use_remove_padding": "Trinity's auxiliary models run in vLLM (no such option)",
    "reward_model.model.fsdp_config.param_offload": "Trinity's auxiliary models run in vLLM (no FSDP)",
    "reward_model.micro_batch_size_per_gpu": "Trinity's auxiliary models run in vLLM (no micro batches)",
}


def _command(text: str) -> dict:
    pairs = [item.split("=", 1) for item in text.split()]
    return {k: parse_value(v) for k, v in pairs}


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(float(a) - float(b)) < 1e-12
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("name, command", [("ppo_example.yaml", PPO_COMMAND), ("grpo_example.yaml", GRPO_COMMAND)])
def test_the_guide_examples_give_the_verl_commands_values_key_by_key(name, command, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", HOME)
    result, out = import_to("trinity", DATA / name, tmp_path / "recipe.yaml")
    # the examples set synchronizer.sync_offset: 1 (the explorer one explore step ahead), which the guide's own text
    # says must be 0 for the synchronous verl run: the import maps it onto the one-step-off pipeline and says how
    # to get the synchronous run, which is what the recipe is read as here
    assert result.recipe["backend_config.trainer.v1.sampler.max_off_policy_threshold"] == 1
    assert any("trainer.v1.trainer_mode=sync" in note for note in result.notes)
    sync = ["trainer.v1.trainer_mode=sync", "actor_rollout_ref.rollout.nnodes=0"]
    # wandb is not installed here: the loader would refuse the logger the command names; everything else is read
    cfg = load_recipe(out, ["trainer.logger=[console]", *sync]).cfg
    expected = _command(command)
    compared = 0
    for key, value in expected.items():
        full = f"backend_config.{key}"
        if key in NO_TRINITY_FIELD:
            assert full not in result.recipe, (key, "has no Trinity field: the import must not invent it")
            continue
        actual = result.recipe[full] if full in result.recipe else get(cfg, full)
        assert _same(actual, value), f"{name}: {key} = {actual!r}, the verl command has {value!r}"
        compared += 1
    assert compared >= len(expected) - len(NO_TRINITY_FIELD)
    # the arithmetic of the guide, spelled out in the recipe's comments
    assert "256 x 4" in result.origin["backend_config.data.train_batch_size"]


def test_the_batch_arithmetic_follows_the_units_tasks_experiences_and_sync_interval(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "model: {model_path: m}\nalgorithm: {repeat_times: 4}\n"
        "buffer: {batch_size: 8, train_batch_size: 16}\nsynchronizer: {sync_interval: 3}\n"
    )
    r = import_config("trinity", cfg)
    # 8 tasks per explore step x 3 explore steps per sync = 24 prompts per verl step; a gradient step
    # takes 16 experiences = 4 prompts of 4 responses
    assert r.recipe["backend_config.data.train_batch_size"] == 24
    assert r.recipe["backend_config.actor_rollout_ref.actor.ppo_mini_batch_size"] == 4
    assert r.recipe["backend_config.actor_rollout_ref.rollout.n"] == 4
    # Trinity's default kl_loss_fn (k2) differs from verl's use_kl_loss=false: written out
    assert r.recipe["backend_config.actor_rollout_ref.actor.use_kl_loss"] is True
    assert r.recipe["backend_config.actor_rollout_ref.actor.kl_loss_type"] == "mse"


CORPUS = sorted(p.name for p in DATA.glob("*.yaml"))
REFUSED = {"dpo_humanlike.yaml": "dpo"}


def test_the_corpus_covers_the_kinds_the_issue_names():
    assert len(CORPUS) >= 10
    text = " ".join((DATA / n).read_text() for n in CORPUS)
    for marker in (
        "algorithm_type: grpo",
        "algorithm_type: ppo",
        "lora_configs",
        "algorithm_type: dapo",
        "alfworld_workflow",
        "mode: explore",
        "algorithm_type: sft",
        "stages:",
        "trainer_config_path",
    ):
        assert marker in text, marker


@pytest.mark.parametrize("name", CORPUS)
def test_every_corpus_config_imports_with_every_key_in_the_table(name, tmp_path):
    path = DATA / name
    if name.startswith("legacy_"):
        with pytest.raises(UserError, match="older config schema .*trainer.trainer_config_path"):
            import_config("trinity", path)
        return
    result, out = import_to("trinity", path, tmp_path / "recipe.yaml")
    from verl_npu.importers.hydra import read_yaml, resolve

    assert_every_key_is_in_the_table(result, set(flatten_input(resolve(read_yaml(path), path))))
    if name in REFUSED:
        assert out is None and REFUSED[name] in result.refused
        return
    assert out.exists()
    assert_valid_or_names_what_it_lacks(result)
    assert "# trinity: model.model_path" in out.read_text()


def _import(tmp_path, text: str):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    return import_to("trinity", cfg, tmp_path / "r.yaml")[0]


ONE_DEVICE = (
    "model: {model_path: tiny://qwen2, max_prompt_tokens: 64, max_response_tokens: 16}\n"
    "cluster: {node_num: 1, gpu_per_node: 1}\nalgorithm: {algorithm_type: grpo, repeat_times: 2}\n"
    "explorer: {rollout_model: {tensor_parallel_size: 1}}\n"
    "buffer: {batch_size: 4, explorer_input: {taskset: {path: d, split: train}, "
    "eval_tasksets: [{path: d, split: test}]}}\n"
)


def test_sync_offset_and_interval_map_onto_separate_async_with_its_bound(tmp_path):
    r = _import(tmp_path, ONE_DEVICE + "synchronizer: {sync_offset: 1, sync_interval: 2, sync_method: nccl}\n")
    rec = {k.removeprefix("backend_config."): v for k, v in r.recipe.items()}
    assert rec["trainer.v1.trainer_mode"] == "separate_async"
    # 1 explore step ahead, 2 explore steps per model version: ceil(1/2) = 1 version (one-step-off)
    assert rec["trainer.v1.sampler.max_off_policy_threshold"] == 1
    # data.train_batch_size = 4 x 2, ppo_mini_batch_size = 4: verl's parameter_sync_step rule
    assert (rec["data.train_batch_size"], rec["actor_rollout_ref.actor.ppo_mini_batch_size"]) == (8, 4)
    assert rec["trainer.v1.separate_async.parameter_sync_step"] == 2
    assert rec["actor_rollout_ref.rollout.nnodes"] == rec["actor_rollout_ref.rollout.n_gpus_per_node"] == 1
    rows = {row.key: row for row in r.rows}
    assert rows["synchronizer.sync_offset"].status == MAPPED
    assert rows["synchronizer.sync_method"].status == NOT_MAPPED and "gloo" in rows["synchronizer.sync_method"].note
    # Trinity's explorer is vLLM, which separate_async runs as its rollout side (partial rollout): nothing lacking
    assert r.problems == [], r.problems
    three = _import(tmp_path, ONE_DEVICE + "synchronizer: {sync_offset: 3, sync_interval: 1}\n")
    assert three.recipe["backend_config.trainer.v1.sampler.max_off_policy_threshold"] == 3
    sync = _import(tmp_path, ONE_DEVICE + "synchronizer: {sync_offset: 0, sync_interval: 2}\n")
    assert not any(".v1." in k for k in sync.recipe) and sync.validated, sync.problems


def test_an_sft_config_becomes_an_sft_recipe(tmp_path):
    result, out = import_to("trinity", DATA / "sft_mot.yaml", tmp_path / "r.yaml")
    assert result.kind == "sft" and "an SFT recipe (`verl-npu sft`" in out.read_text()
    rec = {k.removeprefix("backend_config."): v for k, v in result.recipe.items()}
    assert rec["model.path"] == "Qwen/Qwen2.5-1.5B-Instruct" and rec["optim.lr"] == 1e-5
    assert (rec["data.train_batch_size"], rec["data.max_length"]) == (64, 10752)
    assert rec["data.train_files"] == "open-r1/Mixture-of-Thoughts/math/train.parquet"
    assert "hf_model" in rec["checkpoint.save_contents"]
    assert any("foreign_json.py trinity --sft" in n for n in result.notes)
    # exactly what verl-npu's SFT trainer lacks: token-budget micro batches over 8 workers
    assert [p.split(":")[0] for p in result.problems] == ["backend_config.data.use_dynamic_bsz"], result.problems


def test_stages_become_an_sft_recipe_and_a_stages_recipe_beside_the_rl_one(tmp_path):
    result, out = import_to("trinity", DATA / "grpo_gsm8k_stages.yaml", tmp_path / "r.yaml")
    rows = {row.key: row for row in result.rows}
    assert rows["stages[0].buffer.train_batch_size"].status == MAPPED
    assert rows["stages[0].buffer.train_batch_size"].target == "SFT stage: data.train_batch_size"
    sft = (tmp_path / "r.sft.yaml").read_text()
    assert "train_batch_size: 128   # trinity: buffer.train_batch_size" in sft and "total_training_steps: 10" in sft
    assert "path: Qwen/Qwen2.5-1.5B-Instruct" in sft  # the top-level model, under the stage's fields
    stages = (tmp_path / "r.stages.yaml").read_text()
    assert "recipe: r.sft.yaml" in stages and "recipe: r.yaml" in stages
    # the RL recipe validates; the SFT stage names what it lacks (token-budget batches over 8 workers)
    assert (
        result.problems
        == [p for p in result.problems if p.startswith("r.stages.yaml: sft: backend_config.data.use_dynamic_bsz")]
        and result.problems
    )


def test_the_cli_prints_the_table_and_exits_1_on_a_refusal(tmp_path, capsys):
    from verl_npu.cli import main

    assert main(["import", "trinity", str(DATA / "dpo_humanlike.yaml"), "-o", str(tmp_path / "r.yaml")]) == 1
    out = capsys.readouterr().out
    assert "algorithm.algorithm_type" in out and "no recipe written" in out
    assert not (tmp_path / "r.yaml").exists()
    assert main(["import", "trinity", str(DATA / "legacy_grpo_gsm8k.yaml")]) == 1
    assert "older config schema" in capsys.readouterr().err


def test_an_inline_agent_loop_config_path_maps_and_workflows_point_at_custom_loops(tmp_path):
    """trainer.trainer_config's rollout.agent keys are verl's (issue 39: custom agent loops are built), and a
    workflow's row says how to port it."""
    loops = Path(__file__).resolve().parents[1] / "toys" / "agent_loops.yaml"
    text = ONE_DEVICE.replace(
        "explorer_input: {taskset: {path: d, split: train}",
        "explorer_input: {taskset: {path: d, split: train, default_workflow_type: math_workflow}",
    )
    agent = f"{{agent_loop_config_path: {loops}, default_agent_loop: two_turn_toy}}"
    r = _import(
        tmp_path, text + f"trainer: {{trainer_config: {{actor_rollout_ref: {{rollout: {{agent: {agent}}}}}}}}}\n"
    )
    rec = {k.removeprefix("backend_config."): v for k, v in r.recipe.items()}
    assert rec["actor_rollout_ref.rollout.agent.agent_loop_config_path"] == str(loops)
    assert rec["actor_rollout_ref.rollout.agent.default_agent_loop"] == "two_turn_toy"
    rows = {row.key: row for row in r.rows}
    key = "trainer.trainer_config.actor_rollout_ref.rollout.agent.agent_loop_config_path"
    assert rows[key].status == MAPPED
    workflow = rows["buffer.explorer_input.taskset.default_workflow_type"]
    assert workflow.status == NOT_MAPPED and "agent_loop_config_path" in workflow.note
    assert not any("agent" in p for p in r.problems), r.problems
