"""One broken config per validation rule: exit code 1 and a message naming the right key."""

from __future__ import annotations

import json

import pytest
from run_helpers import FLAGSHIP_FILLED as FILLED

from verl_npu.cli import main
from verl_npu.config import load_recipe
from verl_npu.errors import ConfigErrors


@pytest.fixture(autouse=True)
def _validated_as_on_npus(monkeypatch):
    """These checks validate the flagship recipe as on its target machine (NPUs, trainer.device
    null): a few vLLM settings are derived differently on a CPU (chunked prefill off, see
    tests/config/test_vllm_cpu_prefill_config.py), and this machine may be one."""
    import verl_npu.device as device

    monkeypatch.setattr(device, "configured_device", lambda requested=None: device.DeviceInfo("npu"))


# The flagship recipe (8 devices, n=4, train batch 32, mini 8, micro 1) with its placeholders filled.
A = "backend_config.actor_rollout_ref."
A_RO = "actor_rollout_ref.rollout."
# prompt + response = 512: rollout.max_num_batched_tokens=512 passes the length rule, not vLLM's max_num_seqs rule
SHORT = ["data.max_prompt_length=256", "data.max_response_length=256"]

# (overrides, full key that must be named, fragment of the message)
BROKEN = [
    # required fields and placeholders
    (["af_output_dir=null"], "af_output_dir", "required"),
    (["data.train_files=EDIT_ME: train"], "backend_config.data.train_files", "placeholder"),
    # types and ranges
    (["data.train_batch_size=abc"], "backend_config.data.train_batch_size", "must be an int"),
    (["data.shuffle=3"], "backend_config.data.shuffle", "must be a bool"),
    (["actor_rollout_ref.rollout.gpu_memory_utilization=1.5"], A + "rollout.gpu_memory_utilization", "out of range"),
    (["actor_rollout_ref.actor.optim.lr=-1.0"], A + "actor.optim.lr", "out of range"),
    (["data.max_prompt_length=0"], "backend_config.data.max_prompt_length", "out of range"),
    # enums
    (["algorithm.adv_estimator=foo"], "backend_config.algorithm.adv_estimator", "not one of"),
    (["actor_rollout_ref.actor.kl_loss_type=bar"], A + "actor.kl_loss_type", "not one of"),
    (["algorithm.kl_penalty=bar"], "backend_config.algorithm.kl_penalty", "not one of"),
    (["actor_rollout_ref.actor.loss_agg_mode=sum"], A + "actor.loss_agg_mode", "not one of"),
    (["data.truncation=cut"], "backend_config.data.truncation", "not one of"),
    (["trainer.resume_mode=always"], "backend_config.trainer.resume_mode", "not one of"),
    (["trainer.logger=[console,foo]"], "backend_config.trainer.logger", "not one of"),
    (["actor_rollout_ref.rollout.name=tgi"], A + "rollout.name", "not one of"),
    (["actor_rollout_ref.actor.strategy=deepspeed"], A + "actor.strategy", "not one of"),
    (["actor_rollout_ref.actor.optim.warmup_style=linear"], A + "actor.optim.warmup_style", "not one of"),
    # known to verl, not supported by verl-npu
    (
        ["algorithm.gdpo_reward_keys=[a,b]", "algorithm.gdpo_reward_weights=[1.0]"],
        "backend_config.algorithm.gdpo_reward_weights",
        "has 1 weight(s) for 2 reward component(s)",
    ),
    (
        ["algorithm.adv_estimator=optimal_token_baseline"],
        A + "actor.calculate_sum_pi_squared",
        "weights its baseline by the actor's sum of squared token probabilities",
    ),
    (["actor_rollout_ref.rollout.name=sglang"], A + "rollout.name", "does not support"),
    (["trainer.logger=[console,clearml]"], "backend_config.trainer.logger", "does not support"),
    (["trainer.logger=[console,tracking]"], "backend_config.trainer.logger", "deprecated name for 'wandb'"),
    (["actor_rollout_ref.actor.strategy=megatron"], A + "actor.strategy", "does not support"),
    (["actor_rollout_ref.model.lora_rank=-1"], A + "model.lora_rank", ">= 0"),
    (["reward_model.enable=true"], "backend_config.reward_model.model.path", "is required with reward_model.enable"),
    (
        ["critic.model.tokenizer_path=/t"],
        "backend_config.critic.model.tokenizer_path",
        "does not support this critic option",
    ),
    (["algorithm.adv_estimator=gae", "critic.enable=false"], "backend_config.critic.enable", "needs a critic"),
    (
        ["algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=100000"],
        "backend_config.critic.ppo_mini_batch_size",
        "larger than data.train_batch_size",
    ),
    (
        ["critic.model.fsdp_config.optimizer_offload=true"],
        "backend_config.critic.model.fsdp_config.optimizer_offload",
        "also set critic.model.fsdp_config.param_offload=true",
    ),
    (["trainer.default_hdfs_dir=hdfs://x"], "backend_config.trainer.default_hdfs_dir", "does not support HDFS"),
    (["data.custom_cls.path=my.py"], "backend_config.data.custom_cls.path", "does not support custom dataset"),
    (["data.video_key=videos"], "backend_config.data.video_key", "does not support video"),
    (
        ["actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode"],
        A + "actor.policy_loss.loss_mode",
        "set algorithm.rollout_correction.bypass_mode=true",
    ),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=dro"], A + "actor.policy_loss.dro_beta", "is required"),
    (
        ["actor_rollout_ref.actor.policy_loss.loss_mode=dro", "actor_rollout_ref.actor.policy_loss.dro_beta=0"],
        A + "actor.policy_loss.dro_beta",
        "out of range",
    ),
    (["actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0"], A + "actor.policy_loss.clip_cov_ratio", "out of range"),
    (["actor_rollout_ref.actor.policy_loss.kl_cov_ratio=1.5"], A + "actor.policy_loss.kl_cov_ratio", "out of range"),
    (["actor_rollout_ref.actor.policy_loss.ppo_kl_coef=-1"], A + "actor.policy_loss.ppo_kl_coef", "out of range"),
    (["actor_rollout_ref.actor.tau_neg=0"], A + "actor.tau_neg", "out of range"),
    (["actor_rollout_ref.rollout.multi_turn.max_turns=3"], A + "rollout.multi_turn.max_turns", "does not support"),
    # verl's deprecated keys set together with the key that replaces them (the recipe sets the *_per_gpu ones)
    (
        ["actor_rollout_ref.actor.ppo_micro_batch_size=8"],
        A + "actor.ppo_micro_batch_size",
        "ppo_micro_batch_size_per_gpu",
    ),
    (
        ["actor_rollout_ref.rollout.log_prob_micro_batch_size=8"],
        A + "rollout.log_prob_micro_batch_size",
        "log_prob_micro_batch_size_per_gpu",
    ),
    (
        ["actor_rollout_ref.ref.log_prob_micro_batch_size=8"],
        A + "ref.log_prob_micro_batch_size",
        "log_prob_micro_batch_size_per_gpu",
    ),
    (
        ["trainer.remove_previous_ckpt_in_save=true", "trainer.max_actor_ckpt_to_keep=3"],
        "backend_config.trainer.remove_previous_ckpt_in_save",
        "max_actor_ckpt_to_keep",
    ),
    (
        ["critic.ppo_micro_batch_size=8", "critic.ppo_micro_batch_size_per_gpu=1"],
        "backend_config.critic.ppo_micro_batch_size",
        "critic.ppo_micro_batch_size_per_gpu are both set",
    ),
    # a deprecated verl key that verl 0.9.1 no longer reads stays refused, naming its replacement
    (["reward_model.micro_batch_size=8"], "backend_config.reward_model.micro_batch_size", "micro_batch_size_per_gpu"),
    # unknown keys, with a suggestion
    (
        ["data.max_promt_length=5"],
        "backend_config.data.max_promt_length",
        "did you mean backend_config.data.max_prompt_length",
    ),
    (
        ["data.ppo_mini_batch_size=5"],
        "backend_config.data.ppo_mini_batch_size",
        "did you mean backend_config.actor_rollout_ref.actor.ppo_mini_batch_size",
    ),
    (["foo.bar=1"], "foo.bar", "unknown top-level key"),
    # batch relations
    (["data.train_batch_size=4"], A + "actor.ppo_mini_batch_size", "larger than data.train_batch_size"),
    (["data.train_batch_size=33"], "backend_config.data.train_batch_size", "cannot be split evenly"),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=9"], A + "actor.ppo_mini_batch_size", "cannot be split evenly"),
    (
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
        A + "actor.ppo_micro_batch_size_per_gpu",
        "not divisible by 3",
    ),
    (
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"],
        A + "actor.ppo_micro_batch_size_per_gpu",
        "use_dynamic_bsz is false",
    ),
    (
        ["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null"],
        A + "ref.log_prob_micro_batch_size_per_gpu",
        "use_dynamic_bsz is false",
    ),
    (
        ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1000"],
        A + "actor.ppo_max_token_len_per_gpu",
        "cannot hold one sequence",
    ),
    (
        ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=100"],
        A + "ref.log_prob_max_token_len_per_gpu",
        "cannot hold one sequence",
    ),
    (
        ["actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true"],
        A + "rollout.log_prob_use_dynamic_bsz",
        "actor.use_dynamic_bsz is False",
    ),
    # group estimators, sampling
    (["actor_rollout_ref.rollout.n=1"], A + "rollout.n", "needs at least 2"),
    (["algorithm.adv_estimator=rloo", "actor_rollout_ref.rollout.n=1"], A + "rollout.n", "needs at least 2"),
    (["actor_rollout_ref.rollout.temperature=0"], A + "rollout.temperature", "do_sample is true"),
    (
        ["actor_rollout_ref.rollout.val_kwargs.do_sample=true"],
        A + "rollout.val_kwargs.temperature",
        "do_sample is true",
    ),
    # resume
    (["trainer.resume_mode=resume_path"], "backend_config.trainer.resume_from_path", "global_step_N"),
    (
        ["trainer.resume_mode=resume_path", "trainer.resume_from_path=/ckpt/latest"],
        "backend_config.trainer.resume_from_path",
        "global_step_N",
    ),
    # parallel sizes
    (
        ["actor_rollout_ref.rollout.tensor_model_parallel_size=3"],
        A + "rollout.tensor_model_parallel_size",
        "not one of 1, 2, 4, 8",
    ),
    (
        ["actor_rollout_ref.rollout.tensor_model_parallel_size=16", "trainer.n_gpus_per_node=16"],
        A + "rollout.tensor_model_parallel_size",
        "not one of 1, 2, 4, 8",
    ),
    # 4 divides the 8 devices, but not the 2 of one node: a TP group would span nodes
    (
        ["trainer.nnodes=4", "trainer.n_gpus_per_node=2"],
        A + "rollout.tensor_model_parallel_size",
        "does not divide trainer.n_gpus_per_node=2",
    ),
    # 2 prompts x n=4 fill the 8 devices, but TP 1 means 8 rollout groups for 2 prompts (TP 2: 4 groups)
    (
        [
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        ],
        "backend_config.data.train_batch_size",
        "over the 8 rollout groups",
    ),
    (
        [
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        ],
        "backend_config.data.train_batch_size",
        "multiple of 4",
    ),
    (
        ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
        A + "rollout.tensor_model_parallel_size",
        "hf rollout",
    ),
    (
        ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=3"],
        A + "actor.ulysses_sequence_parallel_size",
        "does not divide",
    ),
    (
        ["actor_rollout_ref.ref.ulysses_sequence_parallel_size=3"],
        A + "ref.ulysses_sequence_parallel_size",
        "does not divide",
    ),
    (
        [
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.model.use_remove_padding=false",
        ],
        A + "model.use_remove_padding",
        "sequence parallelism",
    ),
    # engine lengths
    (
        ["actor_rollout_ref.rollout.max_num_batched_tokens=1000"],
        A + "rollout.max_num_batched_tokens",
        "below max_prompt_length + max_response_length = 2048",
    ),
    (["actor_rollout_ref.rollout.max_model_len=1000"], A + "rollout.max_model_len", "below"),
    (["actor_rollout_ref.rollout.response_length=7"], A + "rollout.response_length", "differs"),
    (["data.min_pixels=2000000"], "backend_config.data.min_pixels", "above max_pixels"),
    # vLLM engine arguments that vLLM refuses at engine start (engine_kwargs.vllm entries win)
    (
        SHORT + [A_RO + "max_num_batched_tokens=512"],
        A + "rollout.max_num_batched_tokens",
        "set actor_rollout_ref.rollout.max_num_seqs<=512 or raise actor_rollout_ref.rollout.max_num_batched_tokens",
    ),
    (
        ["engine_kwargs.vllm.max_num_batched_tokens=1000"],
        "engine_kwargs.vllm.max_num_batched_tokens",
        "below max_num_seqs 1024",
    ),
    (
        ["engine_kwargs.vllm.max_num_seqs=9000"],
        "engine_kwargs.vllm.max_num_seqs",
        "set engine_kwargs.vllm.max_num_seqs<=8192",
    ),
    (
        SHORT
        + [
            A_RO + "max_num_batched_tokens=512",
            A_RO + "max_num_seqs=256",
            A_RO + "engine_kwargs.vllm.max_num_seqs=1024",
        ],
        A + "rollout.max_num_batched_tokens",
        "max_num_seqs 1024 (actor_rollout_ref.rollout.engine_kwargs.vllm",
    ),
    (
        [A_RO + "enable_chunked_prefill=false", A_RO + "max_model_len=10000"],
        A + "rollout.max_num_batched_tokens",
        "below max_model_len 10000 with chunked prefill off",
    ),
    (
        [A_RO + "engine_kwargs.vllm.enable_chunked_prefill=false", "engine_kwargs.vllm.max_model_len=10000"],
        A + "rollout.max_num_batched_tokens",
        "actor_rollout_ref.rollout.engine_kwargs.vllm.enable_chunked_prefill=true",
    ),
    (
        ["engine_kwargs.vllm.max_model_len=1000"],
        "engine_kwargs.vllm.max_model_len",
        "below max_prompt_length + max_response_length = 2048",
    ),
    (
        ["engine_kwargs.vllm.max_num_active_seqs=2000"],
        "engine_kwargs.vllm.max_num_active_seqs",
        "above max_num_seqs 1024",
    ),
    (
        ["engine_kwargs.vllm.long_prefill_token_threshold=4096"],
        "engine_kwargs.vllm.long_prefill_token_threshold",
        "above max_model_len 2048",
    ),
    (
        ["engine_kwargs.vllm.tensor_parallel_size=2"],
        "engine_kwargs.vllm.tensor_parallel_size",
        "tensor_model_parallel_size=2",
    ),
    (
        [A_RO + "engine_kwargs.vllm.pipeline_parallel_size=2"],
        A + "rollout.engine_kwargs.vllm.pipeline_parallel_size",
        "no pipeline or data parallelism",
    ),
    (["engine_kwargs.vllm.gpu_memory_utilization=1.5"], "engine_kwargs.vllm.gpu_memory_utilization", "(0, 1]"),
    # the rollout keys of the weight sync
    ([A_RO + "update_weights_bucket_megabytes=0"], A + "rollout.update_weights_bucket_megabytes", "out of range"),
    ([A_RO + "max_probs_diff=0"], A + "rollout.max_probs_diff", "out of range"),
    ([A_RO + "multi_stage_wake_up=3"], A + "rollout.multi_stage_wake_up", "must be a bool"),
    # engine_kwargs set in two places with different values
    (
        ["engine_kwargs.vllm.enforce_eager=true", "actor_rollout_ref.rollout.engine_kwargs.vllm.enforce_eager=false"],
        "engine_kwargs.vllm.enforce_eager",
        "set it in one place",
    ),
]


@pytest.mark.parametrize("overrides,key,fragment", BROKEN, ids=[" ".join(b[0])[:60] for b in BROKEN])
def test_broken_config_is_refused_naming_the_key(overrides, key, fragment, capsys):
    with pytest.raises(ConfigErrors) as info:
        load_recipe("qwen25vl_geo3k", FILLED + overrides)
    named = [p for p in info.value.problems if p.key == key]
    assert named, f"no problem names {key}: {info.value}"
    assert any(fragment in f"{p.message} {p.fix}" for p in named), str(info.value)
    # the same mistake through the CLI: exit 1, key named, no traceback
    assert main(["validate", "qwen25vl_geo3k", *FILLED, *overrides]) == 1
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err


def test_filled_flagship_is_valid():
    rc = load_recipe("qwen25vl_geo3k", FILLED)
    assert rc.world_size == 8


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigErrors) as info:
        load_recipe("qwen25vl_geo3k", ["data.truncation=cut", "actor_rollout_ref.rollout.n=1", "data.foo=1"])
    keys = {p.key for p in info.value.problems}
    assert {
        "backend_config.data.truncation",
        A + "rollout.n",
        "backend_config.data.foo",
        "af_output_dir",
        "backend_config.data.train_files",
        "backend_config.data.val_files",
        A + "model.path",
    } <= keys


def test_a_bad_value_is_reported_once_not_again_by_relations():
    with pytest.raises(ConfigErrors) as info:
        load_recipe("qwen25vl_geo3k", FILLED + ["data.train_batch_size=abc"])
    assert [p.key for p in info.value.problems] == ["backend_config.data.train_batch_size"]


def test_harmless_unsupported_values_are_accepted():
    rc = load_recipe(
        "qwen25vl_geo3k",
        FILLED
        + [
            "critic.enable=false",
            "reward_model.enable=false",
            "actor_rollout_ref.model.lora_rank=0",
            "actor_rollout_ref.rollout.multi_turn.enable=false",
        ],
    )
    assert rc.backend.reward_model.enable is False


def test_val_batch_size_only_warns():
    rc = load_recipe("qwen25vl_geo3k", FILLED + ["data.val_batch_size=64"])
    assert any("val_batch_size" in w for w in rc.warnings)


def test_sequence_parallel_must_fit_the_attention_heads(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"text_config": {"num_attention_heads": 28, "num_key_value_heads": 4}})
    )
    overrides = FILLED + [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=8",
    ]
    with pytest.raises(ConfigErrors) as info:
        load_recipe("qwen25vl_geo3k", overrides)
    assert any(
        p.key == A + "actor.ulysses_sequence_parallel_size" and "28 attention" in p.message for p in info.value.problems
    )


@pytest.mark.parametrize(
    "overrides",
    [
        # the engine_kwargs entry wins over the rollout key, in both directions
        SHORT + [A_RO + "max_num_batched_tokens=512", "engine_kwargs.vllm.max_num_seqs=256"],
        SHORT + [A_RO + "max_num_batched_tokens=512", A_RO + "engine_kwargs.vllm.max_num_seqs=512"],
        [
            A_RO + "max_num_batched_tokens=2048",
            "engine_kwargs.vllm.max_num_batched_tokens=4096",
            A_RO + "max_num_seqs=4096",
        ],
        [
            A_RO + "enable_chunked_prefill=false",
            A_RO + "max_model_len=10000",
            "engine_kwargs.vllm.enable_chunked_prefill=true",
        ],
        [
            A_RO + "enable_chunked_prefill=false",
            A_RO + "max_model_len=10000",
            A_RO + "engine_kwargs.vllm.max_num_batched_tokens=10000",
        ],
        ["engine_kwargs.vllm.tensor_parallel_size=4", "engine_kwargs.vllm.max_num_seqs=8192"],
        # vLLM's rules do not apply to the hf rollout
        [A_RO + "name=hf", A_RO + "tensor_model_parallel_size=1", "engine_kwargs.vllm.max_num_batched_tokens=10"],
        # 2 prompts over 8 devices / TP 4 = 2 rollout groups
        ["data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2"],
        # the weight-sync keys: null disables the probability check
        [A_RO + "max_probs_diff=null", A_RO + "update_weights_bucket_megabytes=64", A_RO + "multi_stage_wake_up=true"],
    ],
    ids=lambda o: " ".join(o)[:70],
)
def test_vllm_rules_take_engine_kwargs_into_account(overrides):
    rc = load_recipe("qwen25vl_geo3k", FILLED + overrides)
    assert rc.world_size == 8


def test_every_vllm_rule_names_the_rollout_engine_key():
    """The vllm rules run only with rollout.name=vllm (rules._vllm_rule), so each lists that key: `verl-npu
    explain actor_rollout_ref.rollout.name` shows them."""
    from verl_npu.config.rules import RULES

    vllm_rules = [r for r in RULES if r.name.startswith("vllm_")]
    assert len(vllm_rules) == 5
    assert all(A + "rollout.name" in r.keys for r in vllm_rules), [r.name for r in vllm_rules]


def test_weight_sync_keys_have_their_defaults():
    rollout = load_recipe("qwen25vl_geo3k", FILLED).backend.actor_rollout_ref.rollout
    assert rollout.update_weights_bucket_megabytes == 512
    assert rollout.max_probs_diff == pytest.approx(0.05) and rollout.multi_stage_wake_up is False


def _model(tmp_path, **config):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    return f"actor_rollout_ref.model.path={model}"


@pytest.mark.parametrize(
    "heads,kv,tp,ok", [(28, 4, 4, True), (28, 4, 8, False), (24, 6, 4, False), (32, 2, 8, True), (24, 6, 2, True)]
)
def test_rollout_tp_must_fit_the_attention_heads(tmp_path, heads, kv, tp, ok):
    overrides = FILLED + [
        _model(tmp_path, text_config={"num_attention_heads": heads, "num_key_value_heads": kv}),
        f"{A_RO}tensor_model_parallel_size={tp}",
    ]
    if ok:
        assert (
            load_recipe("qwen25vl_geo3k", overrides).backend.actor_rollout_ref.rollout.tensor_model_parallel_size == tp
        )
        return
    with pytest.raises(ConfigErrors) as info:
        load_recipe("qwen25vl_geo3k", overrides)
    [problem] = info.value.problems
    assert problem.key == A + "rollout.tensor_model_parallel_size"
    assert f"{heads} attention / {kv} key-value heads" in problem.message and "use one of" in problem.fix


def test_engine_max_model_len_must_fit_the_model(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    model = _model(tmp_path, max_position_embeddings=32768, num_attention_heads=28, num_key_value_heads=4)
    long = FILLED + [model, "data.max_response_length=32768"]  # 1024 + 32768 > 32768
    with pytest.raises(ConfigErrors) as info:
        load_recipe("qwen25vl_geo3k", long)
    [problem] = info.value.problems
    assert problem.key == "backend_config.data.max_response_length"
    assert "max_position_embeddings=32768" in problem.message and "at most 32768" in problem.fix
    # an explicit max_model_len (rollout key or engine_kwargs) is named itself
    for key in (A + "rollout.max_model_len", "engine_kwargs.vllm.max_model_len"):
        with pytest.raises(ConfigErrors) as info:
            load_recipe("qwen25vl_geo3k", FILLED + [model, f"{key}=40000"])
        assert [p.key for p in info.value.problems] == [key]
    assert load_recipe("qwen25vl_geo3k", FILLED + [model, "data.max_response_length=31744"])  # exactly 32768
    assert load_recipe("qwen25vl_geo3k", long + [A_RO + "name=hf", A_RO + "tensor_model_parallel_size=1"])
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    assert load_recipe("qwen25vl_geo3k", long)


def test_rope_scaling_raises_the_model_length_limit(tmp_path):
    model = _model(
        tmp_path,
        max_position_embeddings=32768,
        rope_scaling={"type": "yarn", "factor": 4.0},
        num_attention_heads=28,
        num_key_value_heads=4,
    )
    rc = load_recipe("qwen25vl_geo3k", FILLED + [model, "data.max_response_length=65536"])
    assert rc.backend.actor_rollout_ref.rollout.max_model_len == 1024 + 65536


def test_rollout_engine_names_come_from_the_registry():
    from verl_npu.config import SCHEMA
    from verl_npu.registry import ROLLOUT_ENGINES

    key = SCHEMA[A + "rollout.name"]
    assert key.choices == tuple(ROLLOUT_ENGINES.specs) and key.unsupported == ("sglang", "trtllm")
    assert key.default in key.choices


def test_adv_estimator_choices_match_the_algorithm_registry():
    """The schema's choices are the registry's names (read from the decorators' source, no torch); the tensor
    functions are bound under exactly those names."""
    from verl_npu.algorithms import ADVANTAGE_ESTIMATORS
    from verl_npu.config import SCHEMA
    from verl_npu.registry import ADVANTAGE_ESTIMATORS as ESTIMATORS

    key = SCHEMA["backend_config.algorithm.adv_estimator"]
    assert key.choices == tuple(ESTIMATORS.specs) and set(ESTIMATORS.specs) == set(ADVANTAGE_ESTIMATORS)
    assert "reinforce_plus_plus_baseline" in key.choices and not set(ESTIMATORS.unsupported) & set(key.choices)
    assert not ESTIMATORS.unsupported  # every estimator of verl 0.9.1 is implemented
