"""The vLLM engine's model turns in the multi-turn agent loop (`rollout.name=vllm` with `multi_turn.enable`).

`verl_npu.rollout.agent_loop.AgentLoop` runs the loop (tool calls, tool turns, masks, output rows); this
module is its `TurnBackend` for a `VLLMRollout`:

- each round, every unfinished trajectory of the batch becomes one request, its prompt and its response so
  far as token ids, and all of them go to the engine in one `LLM.generate` call, so the engine schedules and
  batches them together;
- prefix caching is on (`enable_prefix_caching`, which `VLLMRollout` sets for multi-turn unless
  `engine_kwargs.vllm` says otherwise): the KV blocks of a trajectory's earlier turns are still cached from
  the round before, so a round prefills little more than the new tool turn (`stats["cached_tokens"]`). The
  engine empties the cache after every weight update and wake-up, so it never serves KV of older weights;
- per request: `max_tokens` is what is left of `rollout.response_length` for that trajectory; the model's
  end-of-turn ids stop it; the seed is the hf loop's (`prompt_seed` of the run seed, the trajectory's uid
  and the turn number), so a trajectory's samples do not depend on its batch, rank or TP group;
  `logprobs=0` returns each sampled token's log-prob (`processed_logprobs`: under the distribution it was
  drawn from); `extra_args={"trajectory": uid, "turn": k}` tell a custom logits processor
  (`engine_kwargs.vllm.logits_processors`) which trajectory and turn a request is.

Tensor parallelism: the ranks of one TP group drive one engine together, so each of them must make the
same `generate` calls. Only the group's first rank runs the tools and interactions (`runs_tools`); before
every round it sends its trajectories to the others, which take them over (`sync`,
verl_npu/rollout/rank_sync.py): a tool runs once per call (its side effects happen once), nothing a tool
returns can make the engine's ranks diverge, and every rank of the group ends with the same trajectories.
The same exchange stops every rank when one fails (`fail`: its error on every rank) or does not arrive
within `multi_turn.tp_round_timeout_s` (an error naming it). Different TP groups (rollout data
parallelism) are independent engines: their rounds need no lock-step.
"""

from __future__ import annotations

from dataclasses import replace

from verl_npu.rollout.agent_loop import Trajectory, TurnBackend, turn_room
from verl_npu.rollout.base import SamplingParams
from verl_npu.rollout.rank_sync import RankGroupSync, adopt_trajectories, trajectories_wire
from verl_npu.rollout.requests import prompt_seed, sampled_log_probs, sampling_kwargs


class VLLMTurns(TurnBackend):
    """Model turns from a `VLLMRollout`'s engine (see the module docstring). `stats` counts, since the
    last `reset_stats`: rounds, requests, prompt tokens sent and prompt tokens the prefix cache served."""

    def __init__(self, engine, round_timeout_s: float | None = None):
        self.engine = engine
        # how long the ranks of a TP engine wait for each other at a round (multi_turn.tp_round_timeout_s)
        self.round_timeout_s = round_timeout_s
        self.reset_stats()

    def reset_stats(self) -> None:
        self.stats = {"rounds": 0, "requests": 0, "prompt_tokens": 0, "cached_tokens": 0}

    def _tp_group(self):
        """vLLM's group of the ranks that share this engine, or None for a one-rank engine."""
        if int(self.engine.engine_args.get("tensor_parallel_size", 1)) <= 1:
            return None
        from vllm.distributed.parallel_state import get_tp_group

        group = get_tp_group()
        return group if group.world_size > 1 else None

    def _rank_sync(self) -> RankGroupSync | None:
        if not hasattr(self, "_ranks"):  # the engine's group is fixed for its life
            group = self._tp_group()
            self._ranks = None if group is None else RankGroupSync(group, self.round_timeout_s)
        return self._ranks

    @property
    def runs_tools(self) -> bool:
        group = self._tp_group()
        return group is None or group.rank_in_group == 0

    def sync(self, trajectories: list[Trajectory]) -> None:
        ranks = self._rank_sync()
        if ranks is None:
            return
        wire = ranks.exchange(trajectories_wire(trajectories) if ranks.first else None)
        if not ranks.first:
            adopt_trajectories(trajectories, wire)

    def fail(self, error: BaseException) -> None:
        ranks = self._rank_sync()
        if ranks is not None:
            ranks.fail(error)

    def round_requests(self, active, params: SamplingParams, budget: int) -> list[tuple[dict, dict, int]]:
        """Each trajectory's request this round: (prompt as token ids, vLLM sampling arguments, its room)."""
        eng = self.engine
        base, _ = sampling_kwargs(replace(params, n=1), eng.eos_ids, eng.banned_ids)
        out = []
        for t in active:
            room = turn_room(t, budget)  # an interaction may limit a turn (max_tokens_per_turn)
            kwargs = dict(base, max_tokens=room, extra_args={"trajectory": t.uid, "turn": t.assistant_turns})
            if not params.greedy:
                kwargs["seed"] = prompt_seed(eng.seed, f"{t.uid}#turn{t.assistant_turns}")
            out.append(({"prompt_token_ids": t.prompt_ids + t.response}, kwargs, room))
        self.stats["rounds"] += 1
        self.stats["requests"] += len(out)
        self.stats["prompt_tokens"] += sum(len(prompt["prompt_token_ids"]) for prompt, _, _ in out)
        return out

    def next_turns(self, active, params: SamplingParams, budget: int, record: bool):
        if not active:
            return None
        requests = self.round_requests(active, params, budget)
        sampling = [self.engine._vllm.SamplingParams(**kwargs) for _, kwargs, _ in requests]
        outputs = self.engine.llm.generate(
            [prompt for prompt, _, _ in requests], sampling_params=sampling, use_tqdm=False
        )
        turns = []
        for (_, _, room), out in zip(requests, outputs):
            completion = out.outputs[0]
            ids = [int(tok) for tok in completion.token_ids][:room]
            lps = None
            if record:
                lps = sampled_log_probs(ids, getattr(completion, "logprobs", None)) or [float("nan")] * len(ids)
            turns.append((ids, lps))
            self.stats["cached_tokens"] += int(getattr(out, "num_cached_tokens", 0) or 0)
        return turns
