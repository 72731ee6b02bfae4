"""The multi-turn agent loop on the hf engine's decode, with a tiny real Qwen2 (built locally) and real tools.

A scripted trajectory (the tokens of each model turn are chosen by a `pick_factory`; the model, the chat
template, the tools and the decode loop are the real ones) proves the response mask token by token, that
the recorded log-probs of the trained tokens equal those of one forward pass over the whole text, and that
tool tokens take no part in the loss, KL, entropy and response-length metrics.
"""

from __future__ import annotations

import json

import pytest
import torch
from gloo_workers import gloo_group, spawn_gloo

from verl_npu import algorithms
from verl_npu.batch import Batch
from verl_npu.config.typed import section
from verl_npu.rollout.agent_loop import MULTI_TURN, AgentLoop, parse_hermes
from verl_npu.rollout.base import SamplingParams
from verl_npu.rollout.hf import HFRollout
from verl_npu.rollout.tool_turns import truncate
from verl_npu.tools.base import BaseTool, ToolResponse
from verl_npu.tools.gsm8k import Gsm8kTool

P, R = 48, 120
TRUTH = {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "5"}}}


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_npu.models.tiny import materialize

    path = materialize("tiny://qwen2")
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path).float().eval(), AutoTokenizer.from_pretrained(path)


class Boom(BaseTool):
    """A tool that raises: the loop must turn it into an error message."""

    def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("disk on fire")


class AsyncEcho(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="echo:" + parameters.get("text", "") * 100), 0.5, {}


def schema(name: str) -> dict:
    return {
        "type": "function",
        "function": {"name": name, "description": "d", "parameters": {"type": "object", "properties": {}}},
    }


def tools() -> dict:
    return {"calc_gsm8k_reward": Gsm8kTool({}), "boom": Boom({}, schema("boom")), "echo": AsyncEcho({}, schema("echo"))}


def left_padded(rows: list[list[int]], pad_id: int, width: int, **lists) -> Batch:
    """A prompt batch: token-id `rows` left-padded to `width` (input_ids, attention_mask), `raw_prompt_ids`
    and the list columns `lists`."""
    ids = torch.full((len(rows), width), pad_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return Batch({"input_ids": ids, "attention_mask": mask}, {"raw_prompt_ids": rows, **lists})


def prompts(tokenizer, pad_id: int, questions: list[str], uids: list[str]) -> Batch:
    rows = [
        tokenizer(
            tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )["input_ids"]
        for q in questions
    ]
    return left_padded(rows, pad_id, P, uid=uids, extra_info=[{"tools_kwargs": TRUTH} for _ in rows])


def scripted(tokenizer, eos: int, scripts: dict[str, list[str]], with_eos: bool = True):
    """pick_factory: trajectory `uid#j` writes scripts[uid][turn] then (`with_eos`) the end-of-turn token.
    (The other agent-loop tests, test_agent_images and test_interactions, script their turns with it too.)"""

    def factory(active, steps):
        plan = [
            tokenizer(scripts[t.uid.split("#")[0]][t.assistant_turns], add_special_tokens=False)["input_ids"]
            + ([eos] if with_eos else [])
            for t in active
        ]

        def pick(scores, t):
            return torch.tensor([p[t] if t < len(p) else eos for p in plan], device=scores.device)

        return pick

    return factory


def loop_for(model, tokenizer, scripts, **settings):
    eng = HFRollout(model, tokenizer, seed=0)
    return eng, AgentLoop(
        model,
        tokenizer,
        tools(),
        section(MULTI_TURN, settings),
        eos_ids=eng.eos_ids,
        pad_id=eng.pad_id,
        suppress_ids=eng.suppress_ids,
        pick_factory=scripted(tokenizer, eng.eos_ids[0], scripts) if scripts else None,
    )


CALL = '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "5"}}</tool_call>'


def test_parse_hermes_reads_calls_and_names_malformed_ones():
    calls = parse_hermes(
        'x <tool_call>{"name": "a", "arguments": {"k": 1}}</tool_call> y '
        '<tool_call>{"name": "b", "arguments": "{\\"k\\": 2}"}</tool_call>'
        '<tool_call>{not json}</tool_call><tool_call>{"name": 3}</tool_call>'
    )
    assert [(c.name, c.arguments) for c in calls[:2]] == [("a", {"k": 1}), ("b", {"k": 2})]
    assert "not valid JSON" in calls[2].error and '"arguments"' in calls[3].error
    assert parse_hermes("no call here") == []


def test_truncate_keeps_the_side_it_is_told():
    text = "A" * 10 + "B" * 10
    assert truncate(text, 4, "right") == "AAAA...(truncated)"
    assert truncate(text, 4, "left") == "(truncated)...BBBB"
    assert truncate(text, 4, "middle") == "AA...(truncated)...BB"
    assert truncate("short", 40, "middle") == "short"


def test_scripted_trajectory_mask_token_by_token_and_log_probs_of_one_forward(model_and_tokenizer):
    from verl_npu.models.forward import response_log_probs

    model, tok = model_and_tokenizer
    scripts = {
        "q0": [CALL, "#### 5"],  # tool call, then the answer
        "q1": ['<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "sorry"],  # unknown tool
        "q2": ["The answer is 7."],
    }  # no call: one turn
    eng, loop = loop_for(model, tok, scripts, max_assistant_turns=4)
    batch = prompts(
        tok, eng.pad_id, ["What is 2 plus 3?", "What is 1 plus 1?", "What is 3 plus 4?"], ["q0", "q1", "q2"]
    )
    out = loop.run(batch, SamplingParams(n=1, max_new_tokens=R), record_log_probs=True)

    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    turn1, turn2 = ids(CALL) + [eng.eos_ids[0]], ids("#### 5") + [eng.eos_ids[0]]
    tool_turn = out["agent_turns"][0][1]
    assert tool_turn["role"] == "tool" and "Current parsed answer='5' reward=1.0" in tool_turn["text"]
    assert tool_turn["calls"][0]["name"] == "calc_gsm8k_reward" and "error" not in tool_turn["calls"][0]
    n_tool = tool_turn["tokens"]
    # the tool turn is what the chat template writes after the model's end-of-turn token, to the next header
    assert (
        tok.decode(out["responses"][0, len(turn1) : len(turn1) + n_tool])
        == "\n<|im_start|>tool\nCurrent parsed answer='5' reward=1.0<|im_end|>\n<|im_start|>assistant\n"
    )
    want = [1] * len(turn1) + [0] * n_tool + [1] * len(turn2)
    assert out["response_mask"][0].tolist() == want + [0] * (R - len(want))
    assert (
        out["responses"][0, : len(want)].tolist()
        == turn1 + out["responses"][0, len(turn1) : len(turn1) + n_tool].tolist() + turn2
    )
    assert out["attention_mask"][0, P:].tolist() == [1] * len(want) + [0] * (R - len(want))
    assert out["__num_turns__"] == [4, 4, 2] and out["tool_call_counts"] == [1, 1, 0]
    assert out["tool_rewards"][0] == [0.0]  # a first, right answer: no penalty
    assert "unknown tool 'nope'" in out["agent_turns"][1][1]["text"]
    assert out["response_mask"][2].sum() == len(ids("The answer is 7.")) + 1

    # the trained tokens' log-probs as sampled turn by turn == one forward over the whole text
    lp = response_log_probs(model, out["input_ids"], out["attention_mask"], R)[0]
    trained = out["response_mask"].bool()
    torch.testing.assert_close(out["rollout_log_probs"][trained], lp[trained], atol=2e-5, rtol=1e-5)
    packed = response_log_probs(model, out["input_ids"], out["attention_mask"], R, remove_padding=True)[0]
    torch.testing.assert_close(out["rollout_log_probs"][trained], packed[trained], atol=2e-5, rtol=1e-5)
    assert (out["rollout_log_probs"][~trained] == 0).all()

    # tool tokens take no part in the policy loss, the KL and the entropy (the functions the actor uses)
    logp = lp.detach().clone().requires_grad_(True)
    mask = out["response_mask"].float()
    adv = torch.randn_like(logp)
    pg = algorithms.policy_loss_fn("vanilla")(
        logp,
        logp.detach() - 0.1,
        adv,
        mask,
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        clip_ratio_c=3.0,
        loss_agg_mode="token-mean",
    )
    kl = algorithms.agg_loss(algorithms.kl_penalty(logp, logp.detach() + 0.3, "low_var_kl"), mask, "token-mean")
    ent = algorithms.agg_loss(-logp, mask, "token-mean")
    (pg["pg_loss"] + kl + ent).backward()
    assert (logp.grad[~trained] == 0).all() and (logp.grad[trained] != 0).all()

    from verl_npu.trainer.metrics import data_metrics, last_trained_token

    assert last_trained_token(out["response_mask"]).tolist()[0] == len(want) - 1
    assert torch.equal(out["tool_mask"], out["attention_mask"][:, P:] - out["response_mask"])
    assert out["tool_mask"][0].sum() == n_tool
    scored = Batch({k: out[k] for k in ("response_mask", "attention_mask", "prompts", "tool_mask")}, {})
    for k in ("token_level_scores", "token_level_rewards", "advantages", "returns"):
        scored.set(k, torch.zeros(3, R))
    metrics = data_metrics(
        Batch(scored.tensors, {"__num_turns__": out["__num_turns__"], "tool_call_counts": out["tool_call_counts"]}), R
    )
    assert metrics["response_length/max"] == len(turn1) + len(turn2)  # model tokens only
    assert metrics["num_turns/mean"] == pytest.approx(10 / 3) and metrics["tool_call_counts/max"] == 1


def test_failing_and_async_tools_become_turns_and_the_limits_stop_the_loop(model_and_tokenizer):
    model, tok = model_and_tokenizer
    scripts = {
        "q0": ['<tool_call>{"name": "boom", "arguments": {}}</tool_call>', "ok"],
        "q1": ['<tool_call>{"name": "echo", "arguments": {"text": "ab"}}</tool_call>', "fine"],
        "q2": ["<tool_call>{broken</tool_call>", "again"],
    }
    eng, loop = loop_for(model, tok, scripts, max_tool_response_length=20, tool_response_truncate_side="right")
    out = loop.run(prompts(tok, eng.pad_id, ["a", "b", "c"], ["q0", "q1", "q2"]), SamplingParams(max_new_tokens=R))
    turns = out["agent_turns"]
    assert "\nError executing tool...(truncated)<" in turns[0][1]["text"]  # cut to 20 characters like any tool text
    assert turns[0][1]["calls"][0]["error"].startswith("Error executing tool 'boom'")
    assert "\necho:abababababababa...(truncated)<" in turns[1][1]["text"]  # 20 characters, then the marker
    assert out["tool_rewards"][1] == [0.5] and out["tool_rewards"][0] == []
    assert "not valid JSON" in turns[2][1]["text"]
    assert [len(t) for t in turns] == [3, 3, 3]  # each: call, tool turn, final answer

    _, loop = loop_for(model, tok, scripts, max_assistant_turns=1)
    out = loop.run(prompts(tok, eng.pad_id, ["a"], ["q1"]), SamplingParams(max_new_tokens=R))
    assert out["tool_call_counts"] == [0] and out["__num_turns__"] == [2]  # stopped before running the call

    _, loop = loop_for(model, tok, scripts, max_user_turns=1, max_tool_response_length=20)
    out = loop.run(prompts(tok, eng.pad_id, ["a"], ["q1"]), SamplingParams(max_new_tokens=R))
    assert out["tool_call_counts"] == [1] and out["__num_turns__"] == [4]

    # a tool turn that does not fit the budget is not appended: the trajectory ends after the call
    first = len(tok(scripts["q1"][0], add_special_tokens=False)["input_ids"]) + 1
    _, loop = loop_for(model, tok, scripts)
    out = loop.run(prompts(tok, eng.pad_id, ["a"], ["q1"]), SamplingParams(max_new_tokens=first + 5))
    assert out["response_mask"][0].tolist() == [1] * first + [0] * 5
    assert out["attention_mask"][0, P:].sum() == first and out["agent_turns"][0][-1]["dropped"]


def test_sampled_trajectories_do_not_depend_on_their_batch(model_and_tokenizer):
    """Unscripted: each trajectory samples from its own seeded stream, so it is the same alone or batched."""
    model, tok = model_and_tokenizer
    eng, loop = loop_for(model, tok, None, max_assistant_turns=2)
    both = loop.run(prompts(tok, eng.pad_id, ["x", "y"], ["u0", "u1"]), SamplingParams(n=2, max_new_tokens=24))
    alone = loop.run(prompts(tok, eng.pad_id, ["y"], ["u1"]), SamplingParams(n=2, max_new_tokens=24))
    assert torch.equal(both["responses"][2:], alone["responses"])
    assert not torch.equal(both["responses"][2], both["responses"][3])  # the n samples differ
    assert json.dumps(both["agent_turns"])  # the turn records are plain JSON (rollout dumps)


def test_a_single_turn_agent_row_ends_after_its_first_turn(model_and_tokenizer):
    """verl's per-row agent_name: a single_turn_agent row is not continued even when it writes a tool call."""
    model, tok = model_and_tokenizer
    eng, loop = loop_for(model, tok, {"a": [CALL, "x"], "b": [CALL, "x"]})
    batch = prompts(tok, eng.pad_id, ["q", "q"], ["a", "b"])
    batch.set("agent_name", ["single_turn_agent", "tool_agent"])
    out = loop.run(batch, SamplingParams(max_new_tokens=R))
    assert out["tool_call_counts"] == [0, 1] and out["__num_turns__"] == [2, 4]


SYNC_SCRIPTS = {"q0": [CALL, "#### 5"], "q2": ["The answer is 7."]}


def _synced_worker(rank: int, world: int, port: int, result_dir: str) -> None:
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_npu.models.tiny import materialize

    with gloo_group(rank, world, port):
        path = materialize("tiny://qwen2")
        model, tok = AutoModelForCausalLM.from_pretrained(path).float().eval(), AutoTokenizer.from_pretrained(path)
        eng, loop = loop_for(model, tok, SYNC_SCRIPTS)
        loop.synced = True
        uid = ["q0", "q2"][rank]  # rank 0: two model turns and a tool turn; rank 1: one turn
        out = loop.run(prompts(tok, eng.pad_id, ["What is 2 plus 3?"], [uid]), SamplingParams(max_new_tokens=R))
        torch.save({k: out[k] for k in ("responses", "response_mask")}, os.path.join(result_dir, f"rank{rank}.pt"))


def test_ranks_with_different_turn_counts_stay_in_step(model_and_tokenizer, tmp_path):
    """Several workers (sharded modules): a rank whose trajectories finish first keeps stepping (a stand-in
    decode) while another rank runs its tool turn, and each rank's trajectories are those it gets alone."""
    spawn_gloo(_synced_worker, str(tmp_path), timeout_s=240)
    model, tok = model_and_tokenizer
    eng, loop = loop_for(model, tok, SYNC_SCRIPTS)
    for rank, uid in enumerate(["q0", "q2"]):
        alone = loop.run(prompts(tok, eng.pad_id, ["What is 2 plus 3?"], [uid]), SamplingParams(max_new_tokens=R))
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.equal(got["responses"], alone["responses"]) and torch.equal(
            got["response_mask"], alone["response_mask"]
        )
    assert got["response_mask"].sum() < torch.load(tmp_path / "rank0.pt")["response_mask"].sum()


# A template in the manner of Qwen3's (written for this test): consecutive tool messages share one user turn
# in <tool_response> blocks, and the last assistant turn gets an empty think block that earlier ones do not.
QWEN3_LIKE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif m['role'] == 'assistant' and loop.last -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def test_tool_turns_follow_the_chat_template_and_pass_the_tokenization_check(model_and_tokenizer, caplog):
    import copy

    from verl_npu.rollout.tool_turns import ToolTurnRenderer

    tok = copy.deepcopy(model_and_tokenizer[1])
    tok.chat_template = QWEN3_LIKE
    renderer = ToolTurnRenderer(tok, "strict")
    ids = renderer.ids([{"role": "tool", "content": "x=1"}, {"role": "tool", "content": "y=2"}], "<|im_end|>")
    assert tok.decode(ids) == (
        "\n<|im_start|>user\n<tool_response>\nx=1\n</tool_response>\n<tool_response>\ny=2\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert not renderer.warned and "tokenization check" not in caplog.text
    # a model turn that ended with another stop token keeps the template's end of turn
    assert tok.decode(renderer.ids([{"role": "tool", "content": "x"}], "<|endoftext|>")).startswith("<|im_end|>\n")
    tok.chat_template = "{%- for m in messages -%}{{- m['role'] -}}{%- endfor -%}"  # drops the content
    with pytest.raises(Exception, match="custom_chat_template"):
        ToolTurnRenderer(tok).ids([{"role": "tool", "content": "x"}], "")
