"""Custom agent loops (`rollout.agent.agent_loop_config_path`, verl 0.9.1's interface): a loop file written
against verl (tests/toys/toy_agent_loop.py, importing `verl.experimental.agent_loop` while verl is not
installed here) runs over the hf engine's batched turns with a tiny real Qwen2; its rows are checked token by
token; a batch mixing built-in and custom rows keeps its order; failing loops become error trajectories, bad
files named errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from verl_npu.config.typed import section
from verl_npu.errors import UserError
from verl_npu.rollout.agent_loop import MULTI_TURN, AgentLoop, custom_call
from verl_npu.rollout.base import SamplingParams
from verl_npu.rollout.custom_loops import CustomLoopRunner, class_problems, load_agent_loops
from verl_npu.rollout.hf import HFRollout

TOYS = Path(__file__).resolve().parents[1] / "toys"
P, R = 48, 40


@pytest.fixture(scope="module")
def engine():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_npu.models.tiny import materialize

    path = materialize("tiny://qwen2")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path).float().eval()
    return HFRollout(model, AutoTokenizer.from_pretrained(path), seed=0)


def config():
    from verl_npu.config.schema import defaults_tree

    tree = defaults_tree()
    rollout = tree["backend_config"]["actor_rollout_ref"]["rollout"]
    rollout.update(prompt_length=P, response_length=R)
    return section("backend_config", tree["backend_config"])


def loop_over(engine, path: Path) -> AgentLoop:
    loop = AgentLoop(
        engine.module,
        engine.tokenizer,
        {},
        section(MULTI_TURN, {}),
        eos_ids=engine.eos_ids,
        pad_id=engine.pad_id,
        seed=0,
        default_agent="single_turn_agent",
    )
    loop.custom = CustomLoopRunner(load_agent_loops(path), config(), engine.tokenizer, engine.eos_ids, custom_call)
    return loop


def prompt_rows(tokenizer, pad_id: int, agents: list[str]):
    from verl_npu.batch import Batch

    chats = [[{"role": "user", "content": f"What is {k} + {k}?"}] for k in range(len(agents))]
    rows = [tokenizer.apply_chat_template(c, tokenize=True, add_generation_prompt=True) for c in chats]
    rows = [list(r["input_ids"]) if hasattr(r, "keys") else list(r) for r in rows]
    ids = torch.full((len(rows), P), pad_id)
    mask = torch.zeros((len(rows), P), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r) :] = torch.tensor(r)
        mask[i, P - len(r) :] = 1
    return Batch(
        {"input_ids": ids, "attention_mask": mask},
        {
            "raw_prompt_ids": rows,
            "raw_prompt": chats,
            "uid": [f"u{i}" for i in range(len(rows))],
            "agent_name": agents,
            "extra_info": [{} for _ in rows],
            "data_source": ["toy"] * len(rows),
            "ground_truth": ["2"] * len(rows),
        },
    ), rows


def test_a_verl_written_loop_gives_rows_token_by_token_and_keeps_the_batch_order(engine):
    tok = engine.tokenizer
    loop = loop_over(engine, TOYS / "agent_loops.yaml")
    assert "verl" not in sys.modules or not hasattr(sys.modules["verl"], "experimental")  # the alias is gone
    prompts, rows = prompt_rows(tok, engine.pad_id, ["two_turn_toy", "single_turn_agent", "two_turn_toy"])
    out = loop.run(prompts, SamplingParams(n=2, max_new_tokens=R, temperature=1.0), record_log_probs=True)
    assert (
        len(out) == 6 and out["agent_name"] == ["two_turn_toy"] * 2 + ["single_turn_agent"] * 2 + ["two_turn_toy"] * 2
    )
    user = tok(
        "\n<|im_start|>user\nCheck your answer once more.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )["input_ids"]
    for r in (0, 1, 4, 5):
        prompt = rows[r // 2]
        assert out["prompts"][r][out["attention_mask"][r, :P].bool()].tolist() == prompt
        mask = out["response_mask"][r].tolist()
        filled = out["attention_mask"][r, P:].tolist()
        resp = out["responses"][r].tolist()
        n = sum(filled)
        # model turn (1s, at most first_turn_tokens), the follow-up user turn (0s), the second model turn (1s)
        first = mask.index(0)
        assert 1 <= first <= 6 and all(mask[:first])
        tail = resp[first : first + len(user) + 1]
        zeros = len(user) + (0 if tail[: len(user)] == user else 1)  # "<|im_end|>" added when turn 1 was cut
        assert mask[first : first + zeros] == [0] * zeros and mask[first + zeros : n] == [1] * (n - first - zeros)
        assert resp[first + zeros - len(user) : first + zeros] == user
        assert out["tool_mask"][r].tolist()[:n] == [1 - m for m in mask[:n]]
        lps = out["rollout_log_probs"][r]
        assert (lps[:n][torch.tensor(mask[:n]) == 0] == 0).all() and (lps[:first] < 0).all()
        assert out["__num_turns__"][r] == 4 and out["agent_extra_fields"][r]["follow_up_tokens"] in (
            len(user),
            len(user) + 1,
        )
    # the built-in rows are the single-turn loop's: all model tokens
    for r in (2, 3):
        n = int(out["attention_mask"][r, P:].sum())
        assert out["response_mask"][r, :n].tolist() == [1] * n and out["agent_reward_score"][r] is None
    # a trajectory's samples do not depend on the batch (seeded by uid and call)
    alone, _ = prompt_rows(tok, engine.pad_id, ["two_turn_toy"])
    again = loop.run(alone, SamplingParams(n=2, max_new_tokens=R, temperature=1.0), record_log_probs=True)
    assert torch.equal(again["responses"][:2], out["responses"][:2])


def test_failing_loops_become_error_trajectories(engine, tmp_path):
    cfg = tmp_path / "loops.yaml"
    cfg.write_text(
        f"- name: boom\n  _target_: {TOYS / 'toy_agent_loop.py'}:RaisingLoop\n"
        f"- name: bad\n  _target_: {TOYS / 'toy_agent_loop.py'}:BadOutputLoop\n"
    )
    loop = loop_over(engine, cfg)
    prompts, rows = prompt_rows(engine.tokenizer, engine.pad_id, ["boom", "bad"])
    out = loop.run(prompts, SamplingParams(n=1, max_new_tokens=R), record_log_probs=False)
    for r, words in ((0, "the environment crashed"), (1, "response_mask has 2 entries for 3")):
        assert out["response_mask"][r].sum() == 0 and out["attention_mask"][r, P:].sum() == 1
        assert out["responses"][r, 0] == engine.eos_ids[0]
        turn = out["agent_turns"][r][0]
        assert turn["role"] == "error" and words in turn["text"]


@pytest.mark.parametrize(
    "target, words",
    [
        ("toy_agent_loop.Missing", "has no class 'Missing'"),
        ("toy_agent_loop.NotALoop", "must subclass AgentLoopBase"),
        ("no_such_module_x.Loop", "importing 'no_such_module_x' failed: ModuleNotFoundError"),
    ],
)
def test_bad_loop_files_are_named_errors(tmp_path, target, words):
    cfg = tmp_path / "loops.yaml"
    cfg.write_text(f"- name: x\n  _target_: {target}\n")
    (tmp_path / "toy_agent_loop.py").write_text((TOYS / "toy_agent_loop.py").read_text())
    with pytest.raises(UserError, match="loops.yaml: \\[0\\]._target_") as err:
        load_agent_loops(cfg)
    assert words in str(err.value)
    rows = class_problems(str(cfg))  # what validate --check-paths reports, by key
    assert rows and rows[0][0] == "actor_rollout_ref.rollout.agent.agent_loop_config_path" and words in rows[0][1]


def test_an_import_error_of_verl_other_modules_is_named(tmp_path):
    (tmp_path / "uses_verl.py").write_text("from verl.utils.profiler import simple_timer\n")
    cfg = tmp_path / "loops.yaml"
    cfg.write_text("- name: x\n  _target_: uses_verl.Loop\n")
    with pytest.raises(UserError, match="nothing else of verl is"):
        load_agent_loops(cfg)
    assert "verl" not in sys.modules or not hasattr(sys.modules["verl"], "experimental")


def test_a_loops_reward_score_and_extra_fields_reach_the_reward():
    from verl_npu.batch import Batch
    from verl_npu.trainer.ppo import multi_turn_extra_info, with_agent_scores

    rows = Batch(
        lists={
            "agent_reward_score": [None, 0.25],
            "agent_extra_fields": [None, {"steps": 3}],
            "extra_info": [{"a": 1}, {"a": 2}],
            "agent_turns": [[], []],
            "__num_turns__": [2, 4],
        }
    )
    assert with_agent_scores([1.0, 1.0], rows) == [1.0, 0.25]
    assert with_agent_scores([1.0], Batch(lists={"x": [0]})) == [1.0]
    extra = multi_turn_extra_info(rows)
    assert extra[0] == {"a": 1, "num_turns": 2} and extra[1] == {"a": 2, "num_turns": 4, "steps": 3}
