"""Partial rollout on a vLLM engine (`verl_npu.rollout.vllm.VLLMRollout`), for the rollout side of
`trainer.v1.trainer_mode=separate_async`: requests are stepped one engine step at a time, so that a weight update
can arrive between two steps while requests are in flight.

At a weight update the in-flight requests are aborted (`interrupt`), the new weights are loaded, and each request
is submitted again (`resume`) with its prompt followed by the tokens it has generated so far, asking for the rest
of its token budget: it continues on the new weights. The engine recomputes the prefix's KV cache with the new
weights (the prefix cache is reset at every update), so every token is sampled from, and its log-prob is that of,
exactly one policy version: the one the engine held at the step that sampled it (NeMo-RL's
`recompute_kv_cache_after_weight_updates=true`; vLLM's in-place pause would keep KV blocks of the old weights).
Each token's version is recorded: the rows carry `rollout_versions` [rows, response width] (-1 on padding), from
which the trainer counts spans and staleness.

Each of a prompt's `n` samples is a request of its own (`n=1`, its own seed, `prompt_seed` of the run seed and
"<uid>/<j>"), so that each can be aborted and resumed alone; a resumed request samples with the same seed (its
random stream restarts: the tokens it draws are still from the new weights' distribution). Greedy decoding asks
for one request per prompt and repeats it `n` times, as `VLLMRollout.generate` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from verl_npu.batch import Batch
from verl_npu.rollout.base import VERSIONS_KEY, SamplingParams, finish_rollout
from verl_npu.rollout.requests import prompt_seed, sampled_log_probs, samples_to_tensors, sampling_kwargs, token_prompts
from verl_npu.rollout.vllm_turns import VLLMTurns


@dataclass
class _Request:
    """One sample's request: its prompt, sampling arguments and what it generated so far, token by token."""

    key: str
    prompt: dict
    kwargs: dict
    budget: int
    ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    submissions: int = 0
    done: bool = False


@dataclass
class _Part:
    prompts: Batch
    params: SamplingParams
    repeat: int
    requests: list[_Request]


class SteppedRequests:
    """Requests on `engine` (a `VLLMRollout`), stepped one engine step at a time, each token's version recorded;
    `interrupt` and `resume` carry the in-flight ones over a weight update (the module's docstring)."""

    def __init__(self, engine: Any):
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import RequestOutputKind

        self.engine = engine
        self.llm_engine = engine.llm.llm_engine
        self._params, self._delta = VLLMSamplingParams, RequestOutputKind.DELTA
        self.live: dict[str, _Request] = {}  # request id -> request, while the engine holds it
        self.paused: list[_Request] = []
        self.interrupted = 0  # requests aborted at a weight update and resumed (for stats)

    def submit(self, request: _Request) -> None:
        left = request.budget - len(request.ids)
        if left <= 0:
            request.done = True
            return
        prompt = dict(request.prompt, prompt_token_ids=list(request.prompt["prompt_token_ids"]) + request.ids)
        params = self._params(**request.kwargs, max_tokens=left, output_kind=self._delta)
        request_id = f"{request.key}|{request.submissions}"
        request.submissions += 1
        self.llm_engine.add_request(request_id, prompt, params)
        self.live[request_id] = request

    def step_requests(self, version: int) -> None:
        """One engine step with the weights of `version`: each live request's new tokens, their log-probs and
        version."""
        for output in self.llm_engine.step():
            request = self.live.get(output.request_id)
            if request is None:  # an aborted request's last words
                continue
            completion = output.outputs[0]
            new = [int(t) for t in completion.token_ids]
            lps = sampled_log_probs(new, getattr(completion, "logprobs", None))
            request.ids.extend(new)
            request.log_probs.extend(lps if lps is not None else [float("nan")] * len(new))
            request.versions.extend([int(version)] * len(new))
            if output.finished:
                request.done = True
                del self.live[output.request_id]

    def interrupt(self) -> int:
        """Abort every in-flight request, keeping what it generated (before a weight update); returns how many."""
        if self.live:
            self.llm_engine.abort_request(list(self.live))
        self.paused = list(self.live.values())
        self.live.clear()
        self.interrupted += len(self.paused)
        return len(self.paused)

    def resume(self) -> None:
        """Submit the interrupted requests again, each continuing after the tokens it already has."""
        paused, self.paused = self.paused, []
        for request in paused:
            self.submit(request)


class PartialRollouts(SteppedRequests):
    """Parts (issued prompt batches) being generated by `engine`, one engine step at a time."""

    def __init__(self, engine: Any):
        super().__init__(engine)
        self.parts: dict[str, _Part] = {}  # issue id -> part, in issue order

    @property
    def busy(self) -> bool:
        return bool(self.parts)

    def add(self, issue_id: str, prompts: Batch, params: SamplingParams) -> None:
        """Submit `prompts` (rows named by their `uid`) as part `issue_id`."""
        engine = self.engine
        inputs = token_prompts(prompts["raw_prompt_ids"], prompts.get("multi_modal_data"), engine.image_token_id)
        kwargs, repeat = sampling_kwargs(params, engine.eos_ids, engine.banned_ids)
        samples = int(kwargs.pop("n"))
        budget = int(kwargs.pop("max_tokens"))
        uids = prompts.get("uid") or [f"{issue_id}/{i}" for i in range(len(inputs))]
        requests = []
        for i, prompt in enumerate(inputs):
            for j in range(samples):
                seeded = (
                    dict(kwargs) if params.greedy else dict(kwargs, seed=prompt_seed(engine.seed, f"{uids[i]}/{j}"))
                )
                requests.append(_Request(f"{issue_id}|{i}|{j}", dict(prompt), seeded, budget))
        self.parts[issue_id] = _Part(prompts, params, repeat, requests)
        for request in requests:
            self.submit(request)

    def step(self, version: int) -> list[tuple[str, Batch]]:
        """One engine step with the weights of `version`; returns the parts it completed, (issue id, rows) in
        issue order."""
        self.step_requests(version)
        finished = [issue_id for issue_id, part in self.parts.items() if all(r.done for r in part.requests)]
        return [(issue_id, self._rows(self.parts.pop(issue_id))) for issue_id in finished]

    def _rows(self, part: _Part) -> Batch:
        """A finished part's rows, as `VLLMRollout.generate` builds them, plus the per-token versions."""
        engine, width = self.engine, part.params.max_new_tokens
        samples = [(r.ids, r.log_probs) for r in part.requests for _ in range(part.repeat)]
        responses, log_probs = samples_to_tensors(samples, width, engine.pad_id)
        versions = torch.full((len(samples), width), -1, dtype=torch.long)
        for row, request in enumerate(r for r in part.requests for _ in range(part.repeat)):
            got = request.versions[:width]
            versions[row, : len(got)] = torch.as_tensor(got, dtype=torch.long)
        lengths = torch.tensor([min(len(ids), width) for ids, _ in samples], dtype=torch.long)
        rows = finish_rollout(part.prompts, responses, engine.eos_ids, engine.pad_id, part.params.n, lengths=lengths)
        mask = rows["response_mask"]
        if log_probs is not None:
            rows.set("rollout_log_probs", log_probs * mask.to(log_probs.dtype))
        rows.set(VERSIONS_KEY, versions.masked_fill(mask == 0, -1))
        return rows


class PartialTurns(VLLMTurns):
    """The multi-turn agent loop's model turns (`VLLMTurns`' requests, seeds and TP lock-step) with partial
    rollout: each round's requests are stepped one engine step at a time (`requests`, a `SteppedRequests`) with the
    weights of `version`, `between_steps()` is called before every step but a part's first (on every TP rank: the
    rollout side's command handling, which at a weight update interrupts `requests`, loads the weights, sets
    `version` and resumes them), and each model token's version goes to its trajectory's `versions`. The turn in
    flight at a weight update continues on the new weights, as a single-turn request does."""

    records_versions = True

    def __init__(self, engine: Any, round_timeout_s: float | None = None):
        super().__init__(engine, round_timeout_s)
        self.requests = SteppedRequests(engine)
        self.version = -1
        self.between_steps: Callable[[], None] = lambda: None
        # whether the part has had its first engine step: its first tokens come from the version it was issued
        # at, so nothing is taken before that step (the rollout side sets it False at each part's start)
        self.stepped = False

    def next_turns(self, active, params: SamplingParams, budget: int, record: bool):
        if not active:
            return None
        stepped = self.requests
        requests = []
        for t, (prompt, kwargs, room) in zip(active, self.round_requests(active, params, budget)):
            kwargs = dict(kwargs)
            kwargs.pop("max_tokens")
            requests.append(_Request(f"{t.uid}|turn{t.assistant_turns}", prompt, kwargs, room))
        for request in requests:
            stepped.submit(request)
        while not all(r.done for r in requests):
            if self.stepped:
                self.between_steps()
            stepped.step_requests(self.version)
            self.stepped = True
        turns = []
        for t, request in zip(active, requests):
            ids = request.ids[: request.budget]
            t.versions += request.versions[: len(ids)]
            turns.append((ids, request.log_probs[: len(ids)] if record else None))
        return turns
