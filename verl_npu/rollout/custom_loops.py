"""Custom agent loops (`actor_rollout_ref.rollout.agent.agent_loop_config_path`, verl 0.9.1's semantics): a
user's `AgentLoopBase` subclasses (`verl_npu.rollout.agent_loop_api`), run one coroutine per trajectory over
the rollout engine's batched turns.

The config file is verl's: a YAML list of `{name: <agent_name>, _target_: <class>, ...}` entries; `_target_`
is `package.module.Class` (found on the Python path or in the YAML file's folder) or `path/to/file.py:Class`
(relative to the current folder); the entry's other keys are passed to the class's constructor, as Hydra's
instantiate passes them in verl. A row's `agent_name` picks its loop (no column: `rollout.agent.default_agent_loop`).

Generation (`BatchedServer`): every trajectory's `AgentLoopBase` instance gets a handle (`server_manager`)
whose `async generate(request_id, prompt_ids=..., sampling_params=...)` queues a request. When every
trajectory of the batch is either finished or waiting on a request, the queued requests are sampled together
by the engine's `TurnBackend` (the hf decode, or one vLLM call), each up to `sampling_params["max_tokens"]`
(or `max_new_tokens`) and never more than `rollout.response_length` tokens, seeded by its trajectory's uid and
call number as the built-in loop's turns are; each request's future then gets its `TokenOutput` (ids up to and
including the end-of-turn token, their log-probs). With several hf workers every rank keeps sampling (a
stand-in row) until all ranks' trajectories are done, as the built-in loop does.

Output: each `AgentLoopOutput` becomes one training row: the prompt is the loop's `prompt_ids` (left-padded
to the batch's prompt width), the response its `response_ids` with `response_mask` as returned (1: trained
model tokens, 0: tokens the loop added), cut at `rollout.response_length`; `rollout_log_probs` its
`response_logprobs` (0 where it returned none); `__num_turns__` its num_turns; `agent_reward_score` its
reward_score (None: the reward function scores the row); `agent_extra_fields` its extra_fields (given to the
reward function in extra_info). A loop that raises, or returns an output that breaks these rules, makes an
error trajectory instead: one end-of-turn token with mask 0 (nothing trained), the error in `agent_turns`
and the log, and the count in the `agent_loop/errors` metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from verl_npu.batch import Batch
from verl_npu.config.agent_loop_file import KEY, LoopEntry, read_agent_loop_config
from verl_npu.errors import UserError
from verl_npu.rollout.agent_loop_api import (
    AgentLoopBase,
    AgentLoopOutput,
    DictConfigWrap,
    TokenOutput,
    verl_compat_modules,
)

log = logging.getLogger(__name__)

#: the sampling keys a loop hands back to generate; a change is refused (one sampler serves the whole batch)
FIXED_SAMPLING = ("temperature", "top_p", "top_k")


@contextlib.contextmanager
def _importable_from(folder: Path):
    """The config file's folder on the Python path while its classes are imported (verl's `_target_` names a
    module; the user's loop module usually sits beside its YAML)."""
    added = str(folder) not in sys.path
    if added:
        sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        if added and str(folder) in sys.path:
            sys.path.remove(str(folder))


def loop_class(entry: LoopEntry, folder: Path) -> type:
    """The class `entry` names, imported with verl's interface module names available
    (`agent_loop_api.verl_compat_modules`). Raises UserError naming the entry when the module cannot be
    imported, has no such class, or the class is not an `AgentLoopBase` subclass with an async `run`."""
    from verl_npu.registry.core import load_file
    from verl_npu.tools.loading import class_of

    kind_file = ":" in entry.target
    where, _, cls = entry.target.rpartition(":" if kind_file else ".")
    try:
        with verl_compat_modules(), _importable_from(folder):
            if kind_file:
                path = Path(os.path.expanduser(where))
                module = load_file(path if path.is_absolute() else Path.cwd() / path)
            else:
                module = importlib.import_module(where)
    except BaseException as err:  # noqa: BLE001 - the user's module may raise anything at import (SystemExit too)
        raise UserError(
            f"{entry.where}._target_: importing {where!r} failed: {type(err).__name__}: {err}. Fix the "
            f"module (verl's agent loop interface is there as verl.experimental.agent_loop; nothing "
            f"else of verl is), or the _target_ in {KEY}"
        ) from None
    found = class_of(module, where, cls, f"{entry.where}._target_")
    if not issubclass(found, AgentLoopBase):
        raise UserError(
            f"{entry.where}._target_: {entry.target!r} is not an agent loop: it must subclass "
            "AgentLoopBase (from verl.experimental.agent_loop import AgentLoopBase, or from "
            "verl_npu.rollout.agent_loop_api)"
        )
    if not asyncio.iscoroutinefunction(getattr(found, "run", None)) or getattr(found.run, "__isabstractmethod__", 0):
        raise UserError(
            f"{entry.where}._target_: {entry.target!r} has no `async def run(self, sampling_params, "
            "**kwargs)` returning an AgentLoopOutput; define it"
        )
    return found


def load_agent_loops(path: str | os.PathLike) -> dict[str, tuple[type, dict]]:
    """agent_name -> (class, constructor kwargs) of the file's entries. Raises UserError for the file's first
    problem."""
    entries, problems = read_agent_loop_config(path)
    if problems:
        where, what = problems[0]
        raise UserError(f"{KEY}: {where}: {what}")
    folder = Path(os.path.expanduser(str(path))).resolve().parent
    return {e.name: (loop_class(e, folder), dict(e.kwargs)) for e in entries}


# ---- running a batch -------------------------------------------------------------------------------
@dataclass
class Request:
    traj: Any  # the agent_loop.Trajectory the TurnBackend samples (prompt = the request's ids)
    future: asyncio.Future


class BatchedServer:
    """Queues the trajectories' generate calls (module docstring); `pending` is sampled in one round.
    `new_trajectory(prompt ids, uid, token limit)`: the engine loop's trajectory of one call."""

    def __init__(self, budget: int, new_trajectory):
        self.budget, self.new_trajectory = budget, new_trajectory
        self.pending: list[Request] = []
        self.changed = asyncio.Event()


class TrajectoryServer:
    """One trajectory's `server_manager`: `generate` as verl's (keyword prompt_ids and sampling_params)."""

    def __init__(self, shared: BatchedServer, uid: str, handed: dict):
        self.shared, self.uid, self.handed, self.calls = shared, uid, handed, 0

    async def generate(
        self,
        request_id: Any = None,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        if image_data or video_data or audio_data:
            raise ValueError("pictures, videos and audio in a custom agent loop are not built in verl-npu")
        changed = [k for k in FIXED_SAMPLING if k in sampling_params and sampling_params[k] != self.handed.get(k)]
        if changed:
            raise ValueError(
                f"generate: sampling_params {changed} differ from the ones run() was given; verl-npu "
                "samples a batch with the rollout's settings (change rollout.temperature / top_p / top_k)"
            )
        limit = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        limit = self.shared.budget if limit is None else max(0, min(int(limit), self.shared.budget))
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("generate: prompt_ids is empty")
        traj = self.shared.new_trajectory(ids, f"{self.uid}#call{self.calls}", limit)
        self.calls += 1
        if limit == 0:
            return TokenOutput(token_ids=[], log_probs=[], stop_reason="length")
        future = asyncio.get_running_loop().create_future()
        self.shared.pending.append(Request(traj, future))
        self.shared.changed.set()
        return await future


@dataclass
class Job:
    """One trajectory of a custom loop: its row's fields, the loop's class and constructor kwargs."""

    name: str
    uid: str
    row: dict
    cls: type
    kwargs: dict
    output: AgentLoopOutput | None = None
    error: str | None = None


class CustomLoopRunner:
    """Runs the rows of a batch whose agent is a custom loop (module docstring). `loops`: load_agent_loops's;
    `config`: the typed backend config handed to the loops; `new_trajectory`: `BatchedServer`'s."""

    def __init__(
        self,
        loops: dict[str, tuple[type, dict]],
        config: Any,
        tokenizer: Any,
        eos_ids: list[int],
        new_trajectory,
        processor: Any = None,
    ):
        self.loops, self.config, self.tokenizer, self.processor = loops, config, tokenizer, processor
        self.new_trajectory = new_trajectory
        self.eos_ids = set(eos_ids)

    def handed_sampling(self, params) -> dict[str, Any]:
        """The `sampling_params` run() gets: verl's keys from the rollout's sampling settings."""
        greedy = params.greedy
        return {
            "temperature": 0.0 if greedy else params.temperature,
            "top_p": 1.0 if greedy else params.top_p,
            "top_k": -1 if greedy else params.top_k,
            "repetition_penalty": 1.0,
            "logprobs": True,
        }

    def rows(self, prompts: Batch, names: list[str], params, turns, pad_id: int, eos_id: int, record: bool) -> Batch:
        """The B * n training rows of the B prompt rows `prompts`, whose agents are `names` (custom loops)."""
        rows = prompts.repeat_interleave(params.n)
        fields = [k for k in prompts.lists if k not in ("multi_modal_inputs", "multi_modal_data", "uid")]
        uids = prompts.get("uid") or [str(i) for i in range(len(prompts))]
        jobs = []
        for i, name in enumerate(names):
            row = {k: prompts.lists[k][i] for k in fields}
            extra = row.get("extra_info") or {}
            row.setdefault("tools_kwargs", (extra.get("tools_kwargs") or {}) if isinstance(extra, dict) else {})
            row.setdefault("reward_model", {"ground_truth": row.get("ground_truth")})
            row["agent_name"] = name
            cls, kwargs = self.loops[name]
            # each sample its own copy: a loop may change the row's messages in place
            jobs += [Job(name, f"{uids[i]}#{j}", copy.deepcopy(row), cls, kwargs) for j in range(params.n)]
        self.run(jobs, turns, params, params.max_new_tokens)
        return job_rows(rows, jobs, params.max_new_tokens, pad_id, eos_id, record)

    def run(self, jobs: list[Job], turns, params, budget: int) -> None:
        """Every job's output (or error), generated through `turns`."""
        asyncio.run(self._drive(jobs, turns, params, budget))

    async def _drive(self, jobs: list[Job], turns, params, budget: int) -> None:
        shared = BatchedServer(budget, self.new_trajectory)
        handed = self.handed_sampling(params)
        tasks = [asyncio.create_task(self._one(job, shared, handed)) for job in jobs]
        for task in tasks:
            task.add_done_callback(lambda _t: shared.changed.set())
        while True:
            # until every trajectory is done or waiting for its generate call
            while sum(t.done() for t in tasks) + len(shared.pending) < len(tasks):
                shared.changed.clear()
                await shared.changed.wait()
            requests, shared.pending = shared.pending, []
            sampled = turns.next_turns([r.traj for r in requests], params, budget, True)
            if sampled is None:
                break
            for request, (ids, lps) in zip(requests, sampled):
                ended = bool(ids) and ids[-1] in self.eos_ids
                request.future.set_result(
                    TokenOutput(
                        token_ids=list(ids),
                        log_probs=list(lps or [0.0] * len(ids)),
                        stop_reason="completed" if ended else "length",
                    )
                )
        await asyncio.gather(*tasks)

    async def _one(self, job: Job, shared: BatchedServer, handed: dict) -> None:
        try:
            loop = job.cls(
                trainer_config=DictConfigWrap(self.config),
                server_manager=TrajectoryServer(shared, job.uid, handed),
                tokenizer=self.tokenizer,
                processor=self.processor,
                dataset_cls=None,
                data_config=DictConfigWrap(self.config.data),
                **job.kwargs,
            )
            output = await loop.run(dict(handed), **job.row)
            job.output = checked_output(output)
        except Exception as err:  # a failing loop is this trajectory's error, never the run's end
            job.error = f"agent loop {job.name!r} ({job.cls.__name__}): {type(err).__name__}: {err}"
            log.warning("%s (trajectory %s): an error trajectory (nothing trained) instead", job.error, job.uid)


def checked_output(output: Any) -> AgentLoopOutput:
    """`output` if it is an AgentLoopOutput whose lists agree (module docstring); raises ValueError naming
    what is wrong."""
    if not isinstance(output, AgentLoopOutput):
        raise ValueError(f"run() returned {type(output).__name__}, not an AgentLoopOutput")
    if not output.prompt_ids:
        raise ValueError("AgentLoopOutput.prompt_ids is empty")
    n = len(output.response_ids)
    if len(output.response_mask) != n:
        raise ValueError(f"AgentLoopOutput.response_mask has {len(output.response_mask)} entries for {n} response ids")
    if any(m not in (0, 1) for m in output.response_mask):
        raise ValueError("AgentLoopOutput.response_mask must hold 0 (added by the loop) or 1 (the model's) only")
    if output.response_logprobs is not None and len(output.response_logprobs) != n:
        raise ValueError(
            f"AgentLoopOutput.response_logprobs has {len(output.response_logprobs)} entries for {n} response ids"
        )
    if output.multi_modal_data:
        raise ValueError("AgentLoopOutput.multi_modal_data: pictures in custom agent loops are not built in verl-npu")
    return output


def job_rows(prompts: Batch, jobs: list[Job], width: int, pad_id: int, eos_id: int, record: bool) -> Batch:
    """The training rows of `jobs` (module docstring), one per job, in order; `prompts`: their prompt rows (the
    dataset's, already repeated per sample)."""
    rows = prompts.select(list(range(len(prompts))))
    prompt_width = rows["input_ids"].shape[1]
    for job in jobs:  # a prompt longer than the batch's prompt width cannot be a training row
        out = job.output
        if out is not None and len(out.prompt_ids) > prompt_width:
            job.error = (
                f"agent loop {job.name!r}: its prompt_ids have {len(out.prompt_ids)} tokens, more than "
                f"data.max_prompt_length ({prompt_width}); shorten the prompt the loop builds"
            )
            job.output = None
    prompt_ids = torch.full((len(jobs), prompt_width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(jobs), prompt_width), dtype=torch.long)
    responses = torch.full((len(jobs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(jobs), width), dtype=torch.long)
    filled = torch.zeros((len(jobs), width), dtype=torch.long)
    log_probs = torch.zeros((len(jobs), width), dtype=torch.float32)
    turns, scores, extras, num_turns = [], [], [], []
    for r, job in enumerate(jobs):
        out = job.output
        if out is None:  # an error trajectory: its prompt, one end-of-turn token, nothing trained
            keep = rows["attention_mask"][r].bool()
            prompt = rows["input_ids"][r][keep].tolist()
            response, rmask, lps = [eos_id], [0], [0.0]
            turns.append([{"role": "error", "text": job.error, "tokens": 0, "trained": False}])
            scores.append(None)
            extras.append({})
            num_turns.append(1)
        else:
            prompt, response, rmask = list(out.prompt_ids), list(out.response_ids), list(out.response_mask)
            lps = list(out.response_logprobs) if out.response_logprobs is not None else [0.0] * len(response)
            turns.append(
                [
                    {
                        "role": "custom",
                        "agent": job.name,
                        "tokens": len(response),
                        "trained": True,
                        "model_tokens": sum(rmask[:width]),
                    }
                ]
            )
            scores.append(None if out.reward_score is None else float(out.reward_score))
            extras.append(dict(out.extra_fields))
            num_turns.append(int(out.num_turns))
        prompt_ids[r, prompt_width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        prompt_mask[r, prompt_width - len(prompt) :] = 1
        k = min(len(response), width)
        responses[r, :k] = torch.tensor(response[:k], dtype=torch.long)
        mask[r, :k] = torch.tensor(rmask[:k], dtype=torch.long)
        filled[r, :k] = 1
        log_probs[r, :k] = torch.tensor(lps[:k], dtype=torch.float32) * mask[r, :k]
    from verl_npu.rollout.base import attach_responses

    rows.set("input_ids", prompt_ids)
    rows.set("attention_mask", prompt_mask)
    rows.set("raw_prompt_ids", [prompt_ids[r][prompt_mask[r].bool()].tolist() for r in range(len(jobs))])
    attach_responses(rows, responses, mask, attention_tail=filled)
    rows.set("tool_mask", filled - mask)
    if record:
        rows.set("rollout_log_probs", log_probs)
    rows.set("__num_turns__", num_turns)
    rows.set("tool_call_counts", [0] * len(jobs))
    rows.set("tool_rewards", [[] for _ in jobs])
    rows.set("agent_turns", turns)
    rows.set("agent_reward_score", scores)
    rows.set("agent_extra_fields", extras)
    return rows


def class_problems(path: str) -> list[list[str]]:
    """[key, what is wrong, fix] for each entry of the agent loop config at `path` whose class cannot be
    imported or is not an agent loop (`loop_class`); nothing is constructed."""
    entries, shape = read_agent_loop_config(path)
    if shape:
        return []  # the config's own checks name them
    folder = Path(os.path.expanduser(str(path))).resolve().parent
    out = []
    for entry in entries:
        try:
            loop_class(entry, folder)
        except UserError as err:
            out.append([KEY, str(err), f"fix the class or the _target_ in {path}"])
        except BaseException as err:  # noqa: BLE001 - a user module may raise anything
            out.append(
                [
                    KEY,
                    f"{entry.where}._target_: checking {entry.target!r} failed: {type(err).__name__}: {err}",
                    "fix the module the class lives in",
                ]
            )
    return out


def main(argv: list[str]) -> int:
    """`python -m verl_npu.rollout.custom_loops PATH`: one JSON line of `class_problems(PATH)` (what the loop
    modules print at import is not the answer), for `verl-npu validate --check-paths`."""
    import io
    import json

    with contextlib.redirect_stdout(io.StringIO()):
        found = class_problems(argv[0])
    sys.stdout.write(json.dumps(found) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
