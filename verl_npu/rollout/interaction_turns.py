"""Interaction turns of the agent loop (`multi_turn.interaction_config_path`; verl's interactions).

A trajectory of a multi-turn row whose `extra_info.interaction_kwargs.name` names an interaction of the
config file gets an `InteractionState`: the interaction, the row's kwargs, the instance (started once per
trajectory with the trajectory's id, `<prompt uid>#<sample>`, as verl passes its request id) and the
scores of its turns. After a model turn that ends with its end-of-turn token (or is cut at the
interaction's `max_tokens_per_turn`, when it has one) and calls no tool, `respond` asks the interaction
for the next user turn:

    should_terminate, text, score, metadata = generate_response(instance_id, messages, **interaction_kwargs)

`messages` is the conversation so far: the prompt's chat messages (the dataset's `raw_prompt` when the
batch carries it, else the decoded prompt as one user message), then each model turn as an `assistant`
message (special tokens removed), each tool turn as `tool` messages and each interaction reply as a
`user` message. `text` becomes a user turn rendered by the chat template (response mask 0, not trained);
`score` joins the trajectory's `turn_scores` even when the turn does not fit the response budget (then
the trajectory ends without it, as a tool turn would); `should_terminate` ends the trajectory after the
turn. `finalize` calls `finalize_interaction` once per started instance when the batch is done.

The per-row `turn_scores` reach the reward function in `extra_info["turn_scores"]` (as verl's reward
managers pass its agent loop's extra fields), together with `extra_info["tool_rewards"]` and
`extra_info["interaction"]` (the last reply's metadata).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from verl_npu.errors import UserError
from verl_npu.tools.loading import run_method


@dataclass
class InteractionState:
    interaction: Any
    kwargs: dict
    instance_id: str = ""
    prompt_messages: list = field(default_factory=list)
    started: bool = False
    waiting: bool = False  # the last model turn is answered next
    scores: list = field(default_factory=list)
    last_metadata: dict = field(default_factory=dict)

    @property
    def max_tokens_per_turn(self) -> int | None:
        value = getattr(self.interaction, "max_tokens_per_turn", None)
        return None if value is None else int(value)


def _prompt_messages(prompts, i: int, tokenizer) -> list[dict]:
    raw = prompts.get("raw_prompt")
    if raw is not None and raw[i]:
        return [dict(m) for m in raw[i]]
    ids = prompts["raw_prompt_ids"][i]
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    return [{"role": "user", "content": tokenizer.decode(ids, skip_special_tokens=True)}]


def attach(trajs: list, prompts, n: int, interactions: dict, tokenizer, single_turn: list[bool]) -> None:
    """Give the trajectories of multi-turn rows their interaction state (rows i*n .. i*n+n-1 are prompt i)."""
    if not interactions:
        return
    extra = prompts.get("extra_info") or [{} for _ in range(len(prompts))]
    where = prompts.get("data_row") or [f"batch row {i}" for i in range(len(prompts))]
    for i in range(len(prompts)):
        if single_turn[i]:
            continue
        kwargs = dict((extra[i] or {}).get("interaction_kwargs") or {})
        kwargs = {k: v for k, v in kwargs.items() if v is not None}  # parquet structs fill absent fields with None
        name = kwargs.get("name")
        if name not in interactions:
            raise UserError(
                f"{where[i]}: extra_info.interaction_kwargs.name is {name!r}, but the interactions of "
                f"actor_rollout_ref.rollout.multi_turn.interaction_config_path are "
                f"{', '.join(interactions)}; name one of them in the row"
            )
        messages = _prompt_messages(prompts, i, tokenizer)
        for t in trajs[i * n : (i + 1) * n]:
            t.interaction = InteractionState(interactions[name], kwargs, prompt_messages=messages)


async def start(trajs: list) -> None:
    """start_interaction for every trajectory with an interaction (concurrently)."""
    states = [(t, t.interaction) for t in trajs if t.interaction is not None]

    async def one(t, s):
        got = await run_method(s.interaction.start_interaction, t.uid, **s.kwargs)
        s.instance_id, s.started = (got if isinstance(got, str) else t.uid), True

    await asyncio.gather(*(one(t, s) for t, s in states))


def _strip_special(text: str, tokenizer) -> str:
    for token in tokenizer.all_special_tokens:
        text = text.replace(token, "")
    return text


def messages_of(t, tokenizer) -> list[dict]:
    """The trajectory's conversation as chat messages (see the module docstring)."""
    out = list(t.interaction.prompt_messages)
    for turn in t.turns:
        if turn["role"] == "assistant":
            out.append({"role": "assistant", "content": _strip_special(turn["text"], tokenizer)})
        elif turn["role"] == "tool":
            out += [{"role": "tool", "content": c.get("result") or c.get("error") or ""} for c in turn.get("calls", [])]
        elif turn["role"] == "user":
            out.append({"role": "user", "content": turn["content"]})
    return out


async def respond(trajs: list, renderer, tokenizer, budget: int) -> None:
    """One interaction turn for each trajectory waiting for one (concurrently); see the module docstring."""
    waiting = [t for t in trajs if t.interaction is not None and t.interaction.waiting]

    async def one(t):
        s = t.interaction
        return await run_method(s.interaction.generate_response, s.instance_id, messages_of(t, tokenizer), **s.kwargs)

    results = await asyncio.gather(*(one(t) for t in waiting))
    for t, out in zip(waiting, results):
        s = t.interaction
        s.waiting = False
        if not (isinstance(out, tuple) and len(out) == 4):
            raise UserError(
                f"interaction {s.interaction.name!r}: generate_response must return (should_terminate, "
                f"response, score, metadata), not {type(out).__name__}"
            )
        terminate, text, score, metadata = out
        text = "" if text is None else str(text)
        if score is not None:
            s.scores.append(float(score))
        s.last_metadata = dict(metadata or {})
        record = {
            "role": "user",
            "content": text,
            "trained": False,
            "interaction": s.interaction.name,
            "score": None if score is None else float(score),
            "metadata": s.last_metadata,
        }
        turn_ids = renderer.ids([{"role": "user", "content": text}], t.ended_with)
        if len(t.response) + len(turn_ids) >= budget:
            t.done = True
            t.turns.append({**record, "text": text, "tokens": 0, "dropped": "the response budget is used up"})
            continue
        t.response += turn_ids
        t.mask += [0] * len(turn_ids)
        t.log_probs += [0.0] * len(turn_ids)
        t.user_turns += 1
        t.turns.append(
            {**record, "text": tokenizer.decode(turn_ids, skip_special_tokens=False), "tokens": len(turn_ids)}
        )
        if terminate:
            t.done = True


async def finalize(trajs: list) -> None:
    """finalize_interaction once for every started instance."""
    states = [t.interaction for t in trajs if t.interaction is not None and t.interaction.started]

    async def one(s):
        method = getattr(s.interaction, "finalize_interaction", None)
        if callable(method):
            await run_method(method, s.instance_id)
        s.started = False

    await asyncio.gather(*(one(s) for s in states))


def extra_fields(t) -> dict:
    """What a trajectory adds to its row's extra_info for the reward function."""
    s = t.interaction
    return {"turn_scores": list(s.scores) if s else [], "interaction": dict(s.last_metadata) if s else {}}
