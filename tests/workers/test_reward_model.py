"""The reward model role (`reward_model.enable`): its scores against a direct transformers forward
(padded batches, micro batches, dynamic batch size, max_length, re-tokenisation), a tiny GRPO run
scored by it, 2 Ray workers against 1, and the config checks."""

from __future__ import annotations

import json

import pytest
import torch

from verl_npu.config import load_recipe
from verl_npu.errors import ConfigErrors

RM = "tiny://qwen2rm"


def rm_recipe(*extra: str):
    return load_recipe("tiny_gsm8k", ["reward_model.enable=true", f"reward_model.model.path={RM}", *extra])


def make_worker(*extra: str):
    from verl_npu.device import detect_device
    from verl_npu.workers.reward_model import RewardModelWorker

    worker = RewardModelWorker(rm_recipe(*extra).typed, 1, detect_device("cpu"))
    worker.init_model()
    return worker


def padded_batch(rows: list[tuple[list[int], list[int]]], prompt_len: int, response_len: int, pad: int):
    """A rollout batch: prompts left-padded to prompt_len, responses right-padded to response_len."""
    from verl_npu.batch import Batch

    n = len(rows)
    ids = torch.full((n, prompt_len + response_len), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(rows):
        ids[i, prompt_len - len(p) : prompt_len] = torch.tensor(p)
        mask[i, prompt_len - len(p) : prompt_len] = 1
        ids[i, prompt_len : prompt_len + len(r)] = torch.tensor(r)
        mask[i, prompt_len : prompt_len + len(r)] = 1
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "responses": ids[:, prompt_len:],
            "response_mask": mask[:, prompt_len:],
        }
    )


@pytest.fixture(scope="module")
def rm_path(tiny_cache):
    from verl_npu.models.tiny import materialize

    return materialize(RM, cache_dir=tiny_cache)


@pytest.fixture(scope="module")
def hf_rm(rm_path):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(str(rm_path), dtype=torch.float32).eval()


def hf_score(model, ids: list[int]) -> float:
    """The sequence-classification model's own score of one unpadded sequence."""
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, 0])


def sample_rows(seed: int = 0, n: int = 6, pad: int = 0):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        p = torch.randint(10, 200, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
        r = torch.randint(10, 200, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist()
        rows.append((p, r))
    assert all(pad not in p + r for p, r in rows)
    return rows


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["reward_model.micro_batch_size_per_gpu=2"],
        ["reward_model.use_dynamic_bsz=true", "reward_model.forward_max_token_len_per_gpu=20000"],
    ],
    ids=["one-batch", "micro-2", "dynamic"],
)
def test_scores_equal_a_direct_forward_at_the_last_valid_token(rm_path, hf_rm, extra):
    worker = make_worker(*extra)
    pad = worker.tokenizer.pad_token_id
    rows = sample_rows(pad=pad)
    batch = padded_batch(rows, prompt_len=10, response_len=6, pad=pad)
    out = worker.compute_rm_score(batch)["rm_scores"]
    assert out.shape == (6, 6)
    for i, (p, r) in enumerate(rows):
        assert out[i, len(r) - 1].item() == pytest.approx(hf_score(hf_rm, p + r), abs=1e-4), i
        assert int((out[i] != 0).sum()) == 1  # the score sits on the last response token only
    assert len({round(float(x), 4) for x in out.sum(-1)}) > 3  # the rows get different scores


def test_dynamic_batches_are_really_split(rm_path, hf_rm):
    """A token budget smaller than the batch's tokens: several micro batches, the same scores."""
    from verl_npu.workers.micro import micro_batch_indices

    rows = sample_rows(seed=1)
    batch = padded_batch(rows, prompt_len=10, response_len=6, pad=0)
    assert len(micro_batch_indices(batch["attention_mask"], max_token_len=16)) > 2
    worker = make_worker(
        "reward_model.use_dynamic_bsz=true",
        "data.max_prompt_length=10",
        "data.max_response_length=6",
        "reward_model.forward_max_token_len_per_gpu=16",
    )
    out = worker.compute_rm_score(batch)["rm_scores"].sum(-1)
    expected = [hf_score(hf_rm, p + r) for p, r in rows]
    assert out.tolist() == pytest.approx(expected, abs=1e-4)


def test_max_length_keeps_the_last_tokens(rm_path, hf_rm):
    rows = sample_rows(seed=2)
    batch = padded_batch(rows, prompt_len=10, response_len=6, pad=0)
    out = make_worker("reward_model.max_length=4").compute_rm_score(batch)["rm_scores"].sum(-1)
    expected = [hf_score(hf_rm, (p + r)[-4:]) for p, r in rows]
    assert out.tolist() == pytest.approx(expected, abs=1e-4)


def test_a_different_input_tokenizer_renders_the_chat_again(tmp_path, rm_path, hf_rm):
    """input_tokenizer with another chat template: prompt messages + response go through the reward
    model's own template; the same tokenizer reuses the ids."""
    from transformers import AutoTokenizer

    from verl_npu.batch import Batch

    same = make_worker(f"reward_model.model.input_tokenizer={RM}")
    assert same.input_tokenizer is None
    actor_tok = AutoTokenizer.from_pretrained(str(rm_path))
    actor_tok.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    actor_tok.save_pretrained(str(tmp_path / "actor_tok"))
    worker = make_worker(f"reward_model.model.input_tokenizer={tmp_path / 'actor_tok'}")
    assert worker.input_tokenizer is not None
    chats = [[{"role": "user", "content": "What is 2 plus 3?"}], [{"role": "user", "content": "Hi"}]]
    responses = ["5", "Hello there"]
    rows = []
    for chat, text in zip(chats, responses):
        prompt = actor_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        rows.append((actor_tok(prompt)["input_ids"], actor_tok(text)["input_ids"]))
    batch = padded_batch(rows, prompt_len=40, response_len=6, pad=actor_tok.pad_token_id)
    batch = Batch(dict(batch.tensors), {"raw_prompt": chats, "response_text": responses})  # the controller's decode
    out = worker.compute_rm_score(batch)["rm_scores"].sum(-1)
    rm_tok = worker.tokenizer
    for i, (chat, text) in enumerate(zip(chats, responses)):
        rendered = rm_tok.apply_chat_template(chat + [{"role": "assistant", "content": text}], tokenize=False)
        ids = rm_tok(rendered, add_special_tokens=False)["input_ids"]
        assert out[i].item() == pytest.approx(hf_score(hf_rm, ids), abs=1e-4)
        assert out[i].item() != pytest.approx(hf_score(hf_rm, rows[i][0] + rows[i][1]), abs=1e-4)


def test_the_reward_model_role_is_built_only_when_enabled_and_is_not_checkpointed():
    from omegaconf import OmegaConf

    from verl_npu.registry import ROLES
    from verl_npu.workers.roles import checkpointed_roles, roles_for

    cfg = OmegaConf.create(
        {"algorithm": {"adv_estimator": "grpo"}, "critic": {"enable": None}, "reward_model": {"enable": True}}
    )
    assert roles_for(cfg) == ["actor", "reward_model"]
    cfg.reward_model.enable = False
    assert roles_for(cfg) == ["actor"]
    assert checkpointed_roles(["actor", "critic", "reward_model"]) == ["actor", "critic"]
    assert ROLES.load("reward_model").__name__ == "RewardModelWorker"


# ---- config ------------------------------------------------------------------------------------
def problems(overrides):
    with pytest.raises(ConfigErrors) as info:
        load_recipe("tiny_gsm8k", overrides)
    return info.value.problems


def test_reward_model_keys_load_and_unsupported_ones_are_refused_by_name():
    b = rm_recipe(
        "reward_model.micro_batch_size_per_gpu=4",
        "reward_model.max_length=64",
        "reward_model.model.fsdp_config.param_offload=false",
    ).backend
    assert b.reward_model.enable and b.reward_model.micro_batch_size_per_gpu == 4
    refused = {
        "reward_model.rollout.name=vllm": "generative reward models",
        "reward_model.use_reward_loop=true": "reward loop",
        "reward_model.enable_resource_pool=true": "separate resource pool",
        "reward_model.sandbox_fusion.url=http://x": "sandbox",
    }
    for override, what in refused.items():
        [p] = problems([override])
        assert p.key == "backend_config." + override.split("=")[0] and what in p.message, (override, p)
    [p] = problems(["reward_model.micro_batch_size=8"])
    assert "deprecated" in p.message and "micro_batch_size_per_gpu" in p.fix
    [p] = problems(["reward_model.enable=true"])
    assert p.key == "backend_config.reward_model.model.path" and "required" in p.message
    [p] = problems(
        [
            "reward_model.enable=true",
            f"reward_model.model.path={RM}",
            "reward_model.use_dynamic_bsz=true",
            "reward_model.forward_max_token_len_per_gpu=8",
        ]
    )
    assert p.key.endswith("forward_max_token_len_per_gpu")


def test_a_bad_reward_model_path_is_a_clean_error_before_anything_starts(tmp_path, tiny_lm_path):
    import subprocess
    import sys

    from verl_npu.config import check_paths

    rc = load_recipe("tiny_gsm8k", ["reward_model.enable=true", f"reward_model.model.path={tmp_path / 'nope'}"])
    [p] = [p for p in check_paths(rc) if "reward_model" in p.key]
    assert "does not exist" in p.message
    rc = load_recipe("tiny_gsm8k", ["reward_model.enable=true", f"reward_model.model.path={tiny_lm_path}"])
    [p] = [p for p in check_paths(rc) if "reward_model" in p.key]
    assert "not a sequence-classification model" in p.message and "Qwen2ForCausalLM" in p.message
    # a disabled reward model's path is not checked
    rc = load_recipe("tiny_gsm8k", [f"reward_model.model.path={tmp_path / 'nope'}"])
    assert not [p for p in check_paths(rc) if "reward_model" in p.key]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl_npu.cli",
            "validate",
            "tiny_gsm8k",
            "--check-paths",
            "reward_model.enable=true",
            f"reward_model.model.path={tmp_path / 'nope'}",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr and "reward_model.model.path" in out.stderr


# ---- tiny runs -------------------------------------------------------------------------------------
def run_overrides(out, data, gpus: int = 1, **extra) -> list[str]:
    """The text run of run_helpers.text_run_overrides scored by the tiny reward model, validated at step 2."""
    from run_helpers import text_run_overrides

    return text_run_overrides(
        out,
        data,
        **{
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
            "reward_model.enable": "true",
            "reward_model.model.path": RM,
            "reward_model.micro_batch_size_per_gpu": 2,
            "trainer.n_gpus_per_node": gpus,
            "trainer.save_freq": 2,
            "trainer.test_freq": 2,
            "trainer.rollout_data_dir": out / "rollouts",
            "ray_init.num_cpus": 2,
            **extra,
        },
    )


@pytest.fixture(scope="module")
def rm_data(tmp_path_factory):
    from run_helpers import text_data

    return text_data(tmp_path_factory.mktemp("rm_data"))


@pytest.mark.slow
def test_a_grpo_run_is_scored_by_the_reward_model(tmp_path, rm_data, rm_path):
    from run_helpers import VARIED_REWARD, step_metrics

    from verl_npu.trainer.entry import run_training

    out = tmp_path / "out"
    assert run_training(load_recipe("tiny_geo3k", run_overrides(out, rm_data))) == 0
    rows = step_metrics(out)
    assert sorted(rows) == [1, 2]
    namespace: dict = {}
    exec(VARIED_REWARD, namespace)  # the rule reward of the run, to tell it apart from the model's
    for step, row in rows.items():
        dumped = [json.loads(x) for x in (out / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
        scores = [d["score"] for d in dumped]
        rule = [namespace["compute_score"](d["data_source"], d["response"], d["ground_truth"]) for d in dumped]
        assert row["critic/score/mean"] == pytest.approx(sum(scores) / len(scores), abs=1e-5)
        assert row["critic/score/rule_reward/mean"] == pytest.approx(sum(rule) / len(rule), abs=1e-5)
        assert scores != pytest.approx(rule, abs=1e-3)  # the model's scores, not the rule's
    assert any(k.startswith("val-core/") for k in rows[2]) and any("rule_reward" in k for k in rows[2])
    step2 = out / "checkpoints" / "global_step_2"
    assert sorted(p.name for p in step2.iterdir() if p.is_dir()) == ["actor"]  # the frozen RM is not saved
    # resuming needs no reward model folder: it is loaded again from reward_model.model.path
    longer = run_overrides(out, rm_data, **{"trainer.total_training_steps": 3})
    assert run_training(load_recipe("tiny_geo3k", longer)) == 0
    assert sorted(step_metrics(out)) == [1, 2, 3]
    assert "resumed from" in (out / "logs" / "run.log").read_text()


@pytest.mark.slow
def test_two_workers_score_like_one(tmp_path, rm_data, rm_path, hf_rm):
    """Two Ray workers (gloo, FSDP2 shards of the reward model): every rank scores a fixed batch as
    a direct transformers forward does, and the run's scores match a one-worker run."""
    from run_helpers import step_metrics

    from verl_npu.trainer.entry import run_training

    rows = sample_rows(seed=3, n=4)
    batch = padded_batch(rows, prompt_len=10, response_len=6, pad=0)
    expected = [hf_score(hf_rm, p + r) for p, r in rows]
    seen, uneven = [], []

    def every_rank(workers):
        seen.extend(workers.scatter("compute_rm_score", [batch] * workers.world_size, role="reward_model"))
        # 3 rows over 2 ranks: the group pads with a copy of row 0 and drops its score again
        uneven.append(workers.compute_rm_score(batch.select([0, 1, 2]))["rm_scores"])

    one, two = tmp_path / "one", tmp_path / "two"
    assert run_training(load_recipe("tiny_geo3k", run_overrides(one, rm_data, 1)), after_fit=every_rank) == 0
    assert run_training(load_recipe("tiny_geo3k", run_overrides(two, rm_data, 2)), after_fit=every_rank) == 0
    assert len(seen) == 3 and len(uneven) == 2
    for result in uneven:
        assert result.shape[0] == 3 and result.sum(-1).tolist() == pytest.approx(expected[:3], abs=1e-4)
    for result in seen:
        assert result["rm_scores"].sum(-1).tolist() == pytest.approx(expected, abs=1e-4)
    m1, m2 = step_metrics(one), step_metrics(two)
    for step in (1, 2):
        assert m2[step]["critic/score/mean"] == pytest.approx(m1[step]["critic/score/mean"], abs=1e-4)


def test_a_causal_lm_is_refused_as_a_reward_model_when_loaded(tiny_lm_path):
    """The worker's own check (for paths the config check cannot read, e.g. tiny:// or hub ids):
    a model without a score head is a UserError naming the key."""
    from verl_npu.errors import UserError
    from verl_npu.workers.reward_model import load_reward_model

    with pytest.raises(UserError, match=r"reward_model.model.path=.*Qwen2ForCausalLM, not a sequence-classification"):
        load_reward_model(
            str(tiny_lm_path),
            dtype=torch.float32,
            attn_implementation="sdpa",
            override_config=None,
            trust_remote_code=False,
        )
