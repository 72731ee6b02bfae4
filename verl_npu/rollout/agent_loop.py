"""The multi-turn agent loop (`actor_rollout_ref.rollout.multi_turn.enable`), for every rollout engine.

Each of a batch's B x n trajectories starts as its prompt (rendered by the dataset with the tools'
schemas, so the model sees them in its system prompt) and grows turn by turn:

1. generate: every unfinished trajectory is sampled together by the engine's `TurnBackend` (hf: one
   left-padded batch through `decode.decode`, `HFTurns`; vllm: one request per trajectory, all in one
   engine call, `verl_npu.rollout.vllm_turns`) until its end-of-turn token or the rest of its token
   budget (`rollout.response_length` counts every response token, the tools' too); its tokens join the
   response with mask 1;
2. stop when the budget is used up, `max_assistant_turns` or `max_user_turns` is reached, the row's agent
   is `single_turn_agent` (its `agent_name`, else `rollout.agent.default_agent_loop`), or the turn has no
   tool call;
3. parse the turn's Hermes tool calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
   `verl_npu.rollout.tool_calls`: bounded in count, size and depth), at most `max_parallel_calls` of
   them, and run them, all trajectories' calls concurrently (tools may be `async`; each runs in its own
   thread, within its `call_timeout`); a malformed or hostile call, an unknown tool, or a tool that
   raises anything (SystemExit included) becomes an error message in the conversation, never a crash;
   tool texts are cut to `max_tool_response_length` characters on `tool_response_truncate_side`;
4. append the tool messages as a new turn, rendered by the model's chat template (what the template
   writes after an assistant turn, up to the next assistant header), with mask 0, unless that would
   pass the budget (then the trajectory stops, as in verl); then generate again;
5. a turn without a tool call, in a row with an interaction (`multi_turn.interaction_config_path`, the
   row's `extra_info.interaction_kwargs.name`), goes to the interaction instead of ending the trajectory:
   its reply is appended as a user turn with mask 0 (`interaction_turns`), and its score joins the row's
   `turn_scores`.

Images (a vision-language model on the hf engine, `image_turns`): a trajectory carries its prompt's pictures
and every picture a tool replied with (`ToolResponse(image=[...])`); a tool turn with pictures is rendered
with image parts and expanded into their vision tokens by the processor (mask 0), and the trajectory's
`multi_modal_inputs` / `multi_modal_data` hold all its pictures in token order, so every later prefill and
every training forward sees them. An engine without images (`images=None`: text models, vLLM) refuses rows
with pictures by name.

The model's own tokens are kept as generated (verl's `use_inference_chat_template=false`): training
sees exactly the tokens that were sampled, in the same context. Sampling is seeded per trajectory and
turn (the prompt's uid, the sample index and the turn number), so a trajectory does not depend on
what else is in its batch. The hf engine re-reads the whole context at every prefill (no KV reuse
across turns); vLLM reuses the earlier turns' KV blocks (prefix caching). With several workers the hf
engine keeps every rank in step (`HFTurns`); a vLLM engine over several TP ranks runs the tools and
interactions on its first rank only and gives all ranks that rank's trajectories before every round
(`VLLMTurns.sync`); a rank whose loop raises makes the others raise too (`TurnBackend.fail`,
verl_npu/rollout/rank_sync.py).

Output rows are those of `RolloutEngine.generate`, except that `response_mask` is 0 on tool tokens
while `attention_mask` is 1 on every response token, and `tool_mask` is 1 on the tool tokens (with
`rollout.calculate_log_probs`, and always on vLLM, `rollout_log_probs` holds the sampled tokens' log-probs
as the engine reports them, 0 on tool tokens), plus per-row lists: `__num_turns__` (verl's
name: user + assistant turns + 1), `tool_call_counts`, `tool_rewards` (the steps' tool rewards) and
`agent_turns` (the turns: role, text, tokens, trained, tool name / arguments / error; interaction
turns with their score and metadata), and with interactions `turn_scores` and `interaction_info` (the
interaction's last metadata); rows whose trajectory holds pictures get their `multi_modal_inputs` /
`multi_modal_data` replaced by the trajectory's (the prompt's pictures, then the tools').
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from verl_npu.batch import Batch
from verl_npu.config.typed import section
from verl_npu.errors import UserError
from verl_npu.models.forward import merge_multi_modal_inputs
from verl_npu.rollout import interaction_turns
from verl_npu.rollout.base import VERSIONS_KEY, SamplingParams, attach_responses
from verl_npu.rollout.decode import PerRowSampler, decode, forward_device, greedy_pick
from verl_npu.rollout.image_turns import ImageTurns, short_text
from verl_npu.rollout.requests import prompt_seed
from verl_npu.rollout.tool_calls import ToolCall, ToolHealth, parse_hermes
from verl_npu.rollout.tool_turns import ToolTurnRenderer, truncate
from verl_npu.tools.base import ToolResponse
from verl_npu.tools.loading import ToolRaised, run_method

log = logging.getLogger(__name__)

#: the config section the loop reads (`AgentLoop.settings`): max_assistant_turns, max_user_turns,
#: max_parallel_calls, max_tool_response_length, tool_response_truncate_side, tokenization_sanity_check_mode
MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"


@dataclass
class Trajectory:
    prompt_ids: list[int]
    uid: str
    tools_kwargs: dict
    single_turn: bool = False  # the row's agent loop is single_turn_agent: one model turn
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # each model token's policy version (records_versions)
    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_rewards: list[float] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    pending: list[ToolCall] = field(default_factory=list)
    ended_with: str = ""  # the text of the token that ended the last assistant turn
    done: bool = False
    interaction: Any = None  # interaction_turns.InteractionState of a row with an interaction
    images: list = field(default_factory=list)  # the prompt's images, then the tools' (PIL, as the model sees them)
    mm_inputs: dict = field(default_factory=dict)  # their processor tensors (pixel_values, image_grid_thw), same order
    turn_limit: int | None = None  # most tokens of its next turn (a custom loop's generate call: its max_tokens)


def turn_room(t: Trajectory, budget: int) -> int:
    """Most tokens the trajectory's next model turn may have: the rest of the budget, or less when its
    interaction limits a turn (max_tokens_per_turn)."""
    room = budget - len(t.response) if t.turn_limit is None else min(budget - len(t.response), t.turn_limit)
    limit = t.interaction.max_tokens_per_turn if t.interaction is not None else None
    return room if limit is None else min(room, limit)


class TurnBackend:
    """How a rollout engine generates the next model turn of a batch's unfinished trajectories.

    `AgentLoop.run` calls, once per round, `sync(trajectories)` and then `next_turns(active, ...)`; the loop
    itself appends the turns, parses the tool calls and runs the tools, whatever the engine."""

    #: whether this rank runs the tools and interactions; False on the ranks of a tensor-parallel engine
    #: but its first, which take over the first rank's trajectories at the next `sync` instead
    runs_tools: bool = True
    #: whether `next_turns` appends each model token's policy version to its trajectory's `versions` (a partial
    #: rollout, whose weights may change mid-turn); the rows then carry them as VERSIONS_KEY
    records_versions: bool = False

    def sync(self, trajectories: list[Trajectory]) -> None:
        """Make the ranks that must agree on the batch hold the same trajectories (before each round)."""

    def fail(self, error: BaseException) -> None:
        """This rank's loop raised `error` (before its batch was done): make the ranks that `sync` keeps in
        step with it raise too, instead of waiting for it."""

    def next_turns(
        self, active: list[Trajectory], params: SamplingParams, budget: int, record: bool
    ) -> list[tuple[list[int], list[float] | None]] | None:
        """One (new token ids, their log-probs or None) per trajectory of `active`, in its order: the
        sampled turn up to and including its end-of-turn token, at most `turn_room(t, budget)` tokens.
        None when this rank, and every rank it keeps in step with, has nothing left to generate."""
        raise NotImplementedError


class HFTurns(TurnBackend):
    """The `hf` engine's turns: `decode.decode` over the loop's module, every unfinished trajectory in one
    left-padded batch. With several workers (`loop.synced`: FSDP-sharded module) every rank runs as many
    rounds and decode steps as the busiest rank, a rank whose trajectories are done decoding a stand-in row,
    so the collectives of the sharded forwards stay in step."""

    def __init__(self, loop: AgentLoop):
        self.loop = loop  # the module, ids, seed, pick_factory and synced flag are the loop's

    def next_turns(self, active, params, budget, record):
        if not self._all_ranks_max(len(active)):
            return None
        # every rank decodes as many steps as the rank with the most room left (decode's forwards are
        # collectives for sharded modules); a rank whose trajectories are all done decodes a stand-in
        steps = self._all_ranks_max(max((turn_room(t, budget) for t in active), default=1))
        if not active:
            self._stand_in(steps)
            return []
        return self._decode(active, params, budget, record, steps)

    def _all_ranks_max(self, value: int) -> int:
        loop = self.loop
        if not loop.synced:
            return int(value)
        import torch.distributed as dist

        flag = torch.tensor([int(value)], device=loop.torch_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag[0])

    def _stand_in(self, steps: int) -> None:
        """The decode of a rank without unfinished trajectories while other ranks decode theirs: one row
        that ends at once, stepping along until every rank has finished (its output is dropped). With images
        the row holds a picture (`_vision_filler`), so this rank's vision tower runs with the others'."""
        loop = self.loop
        device = loop.torch_device()
        eos = loop.eos_ids[0]
        row, mm = self._vision_filler() if loop.images is not None else ([loop.pad_id], None)
        was_training = loop.module.training
        loop.module.eval()
        try:
            decode(
                loop.module,
                torch.tensor([row], device=device),
                torch.ones(1, len(row), dtype=torch.long, device=device),
                n=1,
                max_new_tokens=steps,
                eos_ids=loop.eos_ids,
                pad_id=loop.pad_id,
                pick=lambda scores, t: torch.full((scores.shape[0],), eos, device=scores.device),
                synced=loop.synced,
                mm_inputs=merge_multi_modal_inputs([mm], device) if mm else None,
            )
        finally:
            loop.module.train(was_training)

    def _vision_filler(self) -> tuple[list[int], dict]:
        """(token ids, processor tensors) of a one-picture user turn. Sharded vision towers are collectives
        (an FSDP unit of their own): with several workers every rank's prefill must encode pictures when any
        does, so a rank without any decodes this row besides its own (its output is dropped)."""
        from PIL import Image

        images = self.loop.images
        text = images.processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}]}], tokenize=False, add_generation_prompt=True
        )
        return images.encode(text, [images.resize(Image.new("RGB", (images.factor, images.factor)))])

    def _decode(
        self, active: list[Trajectory], params: SamplingParams, budget: int, record: bool, steps: int
    ) -> list[tuple[list[int], list[float] | None]]:
        loop = self.loop
        device = loop.torch_device()
        contexts = [t.prompt_ids + t.response for t in active]
        room = [turn_room(t, budget) for t in active]
        # every image of every trajectory (prompt's, then its tools'), in row order: the prefill encodes them
        mm_rows = [t.mm_inputs for t in active]
        filler = loop.synced and loop.images is not None and not any(t.images for t in active)
        if filler:
            filler_ids, filler_mm = self._vision_filler()  # this rank's vision tower runs with the other ranks'
            contexts.append(filler_ids)
            mm_rows.append(filler_mm)
        mm = merge_multi_modal_inputs(mm_rows, device) if any(mm_rows) else None
        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), loop.pad_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for r, ctx in enumerate(contexts):
            ids[r, width - len(ctx) :] = torch.tensor(ctx)
            mask[r, width - len(ctx) :] = 1
        pick = greedy_pick
        if loop.pick_factory is not None:
            scripted = loop.pick_factory(active, steps)
            pick = (
                scripted
                if not filler
                # the filler row (the last) decodes greedily
                else (lambda scores, t: torch.cat([scripted(scores[:-1], t), scores[-1:].argmax(-1)]))
            )
        elif not params.greedy:
            seeds = [prompt_seed(loop.seed, f"{t.uid}#turn{t.assistant_turns}") for t in active]
            pick = PerRowSampler(replace(params, n=1, max_new_tokens=steps), seeds + [0] * filler)
        log_probs: list | None = [] if record else None
        was_training = loop.module.training
        loop.module.eval()
        try:
            out = decode(
                loop.module,
                ids.to(device),
                mask.to(device),
                n=1,
                max_new_tokens=steps,
                eos_ids=loop.eos_ids,
                pad_id=loop.pad_id,
                pick=pick,
                suppress_ids=loop.suppress_ids,
                synced=loop.synced,
                log_probs=log_probs,
                mm_inputs=mm,
            ).cpu()
        finally:
            loop.module.train(was_training)
        lps = log_probs[0].cpu() if log_probs else None
        turns = []
        for r in range(len(active)):
            row = out[r, : room[r]].tolist()
            ended = next((k for k, tok in enumerate(row) if tok in loop.eos_ids), None)
            new = row if ended is None else row[: ended + 1]
            turns.append((new, lps[r, : len(new)].tolist() if lps is not None else None))
        return turns


class AgentLoop:
    """Multi-turn rollout with tools (see the module docstring); `settings`: the typed `rollout.multi_turn`
    section (`MULTI_TURN`; a mapping is read as that section, its missing keys at the schema's defaults);
    `turns` generates the model turns (None: the `hf` engine's decode over `module`, `HFTurns`)."""

    def __init__(
        self,
        module,
        tokenizer,
        tools: dict,
        settings,
        *,
        eos_ids: list[int],
        pad_id: int,
        suppress_ids=None,
        seed: int = 0,
        pick_factory=None,
        default_agent: str = "tool_agent",
        synced: bool = False,
        turns: TurnBackend | None = None,
        interactions: dict | None = None,
        images: ImageTurns | None = None,
        compute_device=None,
    ):
        settings = section(MULTI_TURN, settings)
        self.compute_device = compute_device  # the hf engine's (None: decode.forward_device's own choice)
        self.module, self.tokenizer, self.tools, self.settings = module, tokenizer, tools, settings
        # name -> interaction (multi_turn.interaction_config_path): answers model turns without tool calls
        self.interactions = interactions or {}
        # sharded modules (several workers): every rank runs the same number of rounds and decode steps
        self.synced = synced
        # the agent loop of rows without an agent_name (rollout.agent.default_agent_loop); single_turn_agent
        # rows end after their first turn
        self.default_agent = default_agent
        # pick_factory(active trajectories, steps) -> pick: chooses the tokens instead of sampling (tests
        # script a trajectory with it); None samples as the rollout keys say
        self.pick_factory = pick_factory
        self.eos_ids, self.pad_id, self.suppress_ids, self.seed = eos_ids, pad_id, suppress_ids, seed
        # images in the conversation (a vision-language model on the hf engine; None: text only)
        self.images = images
        self.renderer = ToolTurnRenderer(
            tokenizer,
            settings.tokenization_sanity_check_mode,
            template=images.processor if images is not None else None,
        )
        self.turns = turns if turns is not None else HFTurns(self)
        self.health = ToolHealth()
        # the custom agent loops of rollout.agent.agent_loop_config_path (custom_loops.CustomLoopRunner), or None
        self.custom = None

    def torch_device(self) -> torch.device:
        """Where the hf engine's module computes (`decode.forward_device`)."""
        return forward_device(self.module, self.compute_device)

    # ---- one batch ---------------------------------------------------------------------------
    @torch.no_grad()
    def run(self, prompts: Batch, params: SamplingParams, record_log_probs: bool = False) -> Batch:
        """B prompts -> B * n trajectories (rows i*n .. i*n+n-1 continue prompt i). With custom loops, the
        rows whose agent is one run through them (`custom_loops`), the others through this loop's turns; every
        rank runs both parts (possibly empty), so ranks kept in step stay so."""
        if self.custom is None:
            return self._run_turns(prompts, params, record_log_probs)
        agents = prompts.get("agent_name") or [None] * len(prompts)
        names = [a or self.default_agent for a in agents]
        custom = [i for i, name in enumerate(names) if name in self.custom.loops]
        built_in = [i for i in range(len(prompts)) if i not in set(custom)]
        ours = self._run_turns(prompts.select(built_in), params, record_log_probs)
        try:
            theirs = self.custom.rows(
                prompts.select(custom),
                [names[i] for i in custom],
                params,
                self.turns,
                self.pad_id,
                self.eos_ids[0],
                record_log_probs,
            )
        except Exception as err:
            self.turns.fail(err)  # the ranks kept in step raise too, instead of waiting for this one
            raise
        return merge_parts(ours, built_in, theirs, custom, params.n)

    def _run_turns(self, prompts: Batch, params: SamplingParams, record_log_probs: bool = False) -> Batch:
        """The built-in loop over `prompts` (module docstring)."""
        mm_data = prompts.get("multi_modal_data") or [None] * len(prompts)
        mm_inputs = prompts.get("multi_modal_inputs") or [None] * len(prompts)
        if self.images is None and any(mm_data):
            raise UserError(
                "multi-turn rollout with images runs on the hf engine with a vision-language model: set "
                "actor_rollout_ref.rollout.name=hf (vLLM's multi-turn rollout takes text prompts only)"
            )
        uids = prompts.get("uid") or [str(i) for i in range(len(prompts))]
        extra = prompts.get("extra_info") or [{} for _ in range(len(prompts))]
        agents = prompts.get("agent_name") or [None] * len(prompts)
        trajs = []
        single = [(agents[i] or self.default_agent) == "single_turn_agent" for i in range(len(prompts))]
        for i, raw in enumerate(prompts["raw_prompt_ids"]):
            ids = [int(t) for t in (raw.tolist() if hasattr(raw, "tolist") else raw)]
            kwargs = (extra[i] or {}).get("tools_kwargs") or {}
            for j in range(params.n):
                trajs.append(
                    Trajectory(
                        ids,
                        f"{uids[i]}#{j}",
                        kwargs if isinstance(kwargs, dict) else {},
                        single_turn=single[i],
                        images=list((mm_data[i] or {}).get("image") or []),
                        mm_inputs=dict(mm_inputs[i] or {}),
                    )
                )
        budget = params.max_new_tokens
        # a tensor-parallel engine's ranks but the first neither start, run nor finalize tools and
        # interactions: they take the first rank's trajectories at every sync (vllm_turns, rank_sync)
        owner = self.turns.runs_tools
        try:
            try:
                interaction_turns.attach(trajs, prompts, params.n, self.interactions, self.tokenizer, single)
                if self.interactions and owner:
                    asyncio.run(interaction_turns.start(trajs))
                self._rounds(trajs, params, budget, record_log_probs, owner)
            except Exception as err:
                self.turns.fail(err)  # the ranks kept in step raise too, instead of waiting for this one
                raise
        finally:
            if self.interactions and owner:
                asyncio.run(interaction_turns.finalize(trajs))
        return self._rows(prompts, trajs, params.n, budget, record_log_probs)

    def _rounds(
        self, trajs: list[Trajectory], params: SamplingParams, budget: int, record_log_probs: bool, owner: bool
    ) -> None:
        """Generate, run the tools, let the interactions answer; again, until no trajectory is left."""
        while True:
            self.turns.sync(trajs)
            active = [t for t in trajs if not t.done]
            sampled = self.turns.next_turns(active, params, budget, record_log_probs)
            if sampled is None:
                break
            self._take_turns(active, sampled, budget)
            if not owner:
                continue
            calling = [t for t in active if not t.done and t.pending]
            if calling:
                asyncio.run(self._run_tools(calling, budget))
            if any(t.interaction is not None and t.interaction.waiting for t in active):
                asyncio.run(interaction_turns.respond(active, self.renderer, self.tokenizer, budget))

    def _take_turns(
        self, active: list[Trajectory], sampled: list[tuple[list[int], list[float] | None]], budget: int
    ) -> None:
        """Append each trajectory's new model turn (its tokens, up to and including the end-of-turn token
        when it wrote one) and decide whether it goes on to a tool turn."""
        for t, (new, lps) in zip(active, sampled):
            ended = next((k for k, tok in enumerate(new) if tok in self.eos_ids), None)
            room = turn_room(t, budget)  # before the turn joins the response
            t.response += new
            t.mask += [1] * len(new)
            if lps is not None:
                t.log_probs += lps[: len(new)]
            t.assistant_turns += 1
            text = self.tokenizer.decode(new, skip_special_tokens=False)
            t.turns.append({"role": "assistant", "text": text, "tokens": len(new), "trained": True})
            t.ended_with = self.tokenizer.decode(new[-1:], skip_special_tokens=False) if ended is not None else ""
            s = self.settings
            # a turn cut at its interaction's max_tokens_per_turn (not at the budget) is read as it is
            cut = ended is None and len(new) == room and len(t.response) < budget and t.interaction is not None
            if (
                len(t.response) >= budget
                or (ended is None and not cut)
                or t.single_turn
                or (s.max_assistant_turns and t.assistant_turns >= s.max_assistant_turns)
                or (s.max_user_turns and t.user_turns >= s.max_user_turns)
            ):
                t.done = True
                continue
            t.pending = parse_hermes(text)[: s.max_parallel_calls]
            if not t.pending:
                if t.interaction is not None:  # no tool call: the row's interaction answers the turn
                    t.interaction.waiting = True
                else:
                    t.done = True

    async def _run_tools(self, calling: list[Trajectory], budget: int) -> None:
        jobs = [self._call(t, c) for t in calling for c in t.pending]
        results = iter(await asyncio.gather(*jobs))
        for t in calling:
            messages, records, images, texts = [], [], [], []
            for call in t.pending:
                text, reward, record, returned = next(results)
                t.tool_calls += 1
                if reward is not None:
                    t.tool_rewards.append(float(reward))
                # a reply with images: one image part per image, then the text (verl's tool message shape)
                parts = [{"type": "image"} for _ in returned] + [{"type": "text", "text": text}]
                messages.append({"role": "tool", "content": parts if returned else text})
                records.append(record)
                texts.append(text)
                images += returned
            t.pending = []
            turn_mm: dict = {}
            if images:
                turn_ids, turn_mm = self.images.encode(self.renderer.text(messages, t.ended_with)[1], images)
            else:
                turn_ids = self.renderer.ids(messages, t.ended_with)
            if len(t.response) + len(turn_ids) >= budget:
                t.done = True
                t.turns.append(
                    {
                        "role": "tool",
                        "text": "".join(texts),
                        "tokens": 0,
                        "trained": False,
                        "calls": records,
                        "dropped": "the response budget is used up",
                    }
                )
                continue
            t.response += turn_ids
            t.mask += [0] * len(turn_ids)
            t.log_probs += [0.0] * len(turn_ids)
            t.user_turns += 1
            t.images += images
            t.mm_inputs = merge_multi_modal_inputs([t.mm_inputs, turn_mm])  # the trajectory's images, then the turn's
            text = self.tokenizer.decode(turn_ids, skip_special_tokens=False)
            t.turns.append(
                {
                    "role": "tool",
                    "text": short_text(text, self.images.image_token) if images else text,
                    "tokens": len(turn_ids),
                    "trained": False,
                    "calls": records,
                    **({"images": len(images)} if images else {}),
                }
            )

    async def _call(self, t: Trajectory, call: ToolCall) -> tuple[str, float | None, dict, list]:
        """(text for the conversation, step reward or None, record, images for the conversation) of one
        call; never raises."""
        record = {"name": call.name, "arguments": call.arguments}
        if call.error:
            return call.error, None, {**record, "error": call.error}, []
        tool = self.tools.get(call.name)
        if tool is None:
            msg = f"Error: unknown tool {repr(call.name)[:200]}; available tools: {sorted(self.tools)}"
            return msg, None, {**record, "error": msg}, []
        record["known"] = True
        if isinstance(getattr(tool, "isolation", None), str):  # a code tool: the sandbox it ran in
            record["sandbox"] = tool.isolation
        instance_id, reward, images = None, None, []
        try:
            create_kwargs = (t.tools_kwargs.get(call.name) or {}).get("create_kwargs") or {}
            if getattr(tool, "needs_row_image", False) and "image" not in create_kwargs and t.images:
                # an image tool (the zoom-in tool) works on the row's first image, as the model sees it
                create_kwargs = {**create_kwargs, "image": t.images[0]}
            created = await run_method(tool.create, create_kwargs=create_kwargs)
            instance_id = created[0] if isinstance(created, tuple) else created
            out = await run_method(tool.execute, instance_id, call.arguments)
            response, reward = (out[0], out[1]) if isinstance(out, tuple) else (out, 0.0)
            if isinstance(response, dict):  # verl's tools may reply {"text": ..., "image": [...]}
                response = ToolResponse(
                    text=response.get("text"), image=response.get("image"), video=response.get("video")
                )
            if isinstance(response, ToolResponse) or hasattr(response, "text"):
                if getattr(response, "video", None):
                    raise ValueError("tools returning videos are not built; return images (ToolResponse(image=[...]))")
                images = self._tool_images(getattr(response, "image", None))
                text = response.text or ""
            else:
                text = str(response)
        except Exception as err:  # a failing tool is the model's problem to read, not a crash
            why = str(err) if isinstance(err, ToolRaised) else f"{type(err).__name__}: {err}"
            text = f"Error executing tool '{call.name}': {why}"
            record["error"] = text
            reward, images = None, []
        finally:
            if instance_id is not None:
                try:
                    await run_method(tool.release, instance_id)
                except Exception as err:  # noqa: BLE001 - a failing release must not end the rollout
                    log.warning("tool %s: release failed: %s", call.name, err)
        health = getattr(self, "health", None)
        if health is not None:
            health.record(call.name, record.get("error"))
        s = self.settings
        text = truncate(text, s.max_tool_response_length, s.tool_response_truncate_side)
        if images:
            record["images"] = [list(im.size) for im in images]
        return text, reward, {**record, "result": text}, images

    def _tool_images(self, images) -> list:
        """A tool's returned images as the model will see them (resized as prompt images are); raises (the
        call's error message) when images cannot join this conversation or are not images."""
        if not images:
            return []
        if self.images is None:
            raise ValueError(
                "this rollout takes no images (a text model, or the vllm engine): image tools need a "
                "vision-language model with actor_rollout_ref.rollout.name=hf"
            )
        images = images if isinstance(images, (list, tuple)) else [images]
        if not all(hasattr(im, "size") and hasattr(im, "convert") for im in images):
            raise ValueError("a tool's image must be a PIL image")
        return [self.images.resize(im) for im in images]

    # ---- output ------------------------------------------------------------------------------
    def _rows(self, prompts: Batch, trajs: list[Trajectory], n: int, width: int, record: bool) -> Batch:
        rows = prompts.repeat_interleave(n)
        responses = torch.full((len(trajs), width), self.pad_id, dtype=torch.long)
        response_mask = torch.zeros((len(trajs), width), dtype=torch.long)
        filled = torch.zeros((len(trajs), width), dtype=torch.long)
        log_probs = torch.zeros((len(trajs), width), dtype=torch.float32)
        for r, t in enumerate(trajs):
            k = min(len(t.response), width)
            responses[r, :k] = torch.tensor(t.response[:k], dtype=torch.long)
            response_mask[r, :k] = torch.tensor(t.mask[:k], dtype=torch.long)
            filled[r, :k] = 1
            if record:
                log_probs[r, :k] = torch.tensor(t.log_probs[:k])
        attach_responses(rows, responses, response_mask, attention_tail=filled)
        rows.set("tool_mask", filled - response_mask)  # 1 on the tools' tokens (response-length metrics)
        if record:  # rollout.calculate_log_probs: as the single-turn engines return them, 0 on tool tokens
            rows.set("rollout_log_probs", log_probs)
        if self.turns.records_versions:
            rows.set(VERSIONS_KEY, model_token_versions(trajs, width))
        rows.set("__num_turns__", [t.assistant_turns + t.user_turns + 1 for t in trajs])
        rows.set("tool_call_counts", [t.tool_calls for t in trajs])
        rows.set("tool_rewards", [list(t.tool_rewards) for t in trajs])
        rows.set("agent_turns", [list(t.turns) for t in trajs])
        if any(t.images for t in trajs):  # every image of a trajectory reaches the training forwards
            rows.set("multi_modal_inputs", [dict(t.mm_inputs) for t in trajs])
            rows.set("multi_modal_data", [{"image": list(t.images)} if t.images else None for t in trajs])
        if self.interactions:  # verl's turn_scores: the interaction's score of each of its turns
            fields = [interaction_turns.extra_fields(t) for t in trajs]
            rows.set("turn_scores", [f["turn_scores"] for f in fields])
            rows.set("interaction_info", [f["interaction"] for f in fields])
        return rows


def model_token_versions(trajs: list[Trajectory], width: int) -> torch.Tensor:
    """[trajectories, width]: each model token's version at its place in the response (its `versions`, which hold
    the model's tokens only, in order), -1 on tool and user turns and on padding."""
    versions = torch.full((len(trajs), width), -1, dtype=torch.long)
    for r, t in enumerate(trajs):
        places = [p for p in range(min(len(t.response), width)) if t.mask[p]]
        got = t.versions[: len(places)]
        if got:
            versions[r, places[: len(got)]] = torch.tensor(got, dtype=torch.long)
    return versions


def merge_parts(ours: Batch, our_prompts: list[int], theirs: Batch, their_prompts: list[int], n: int) -> Batch:
    """The rows of the built-in loop's part (`ours`, of prompts `our_prompts`) and the custom loops' part, in
    the batch's order (prompt i's n rows at i*n ..); a column only one part has is None in the other's rows."""
    for a, b in ((ours, theirs), (theirs, ours)):
        for key in a.lists:
            if key not in b.lists:
                b.set(key, [None] * len(b))
    merged = (
        Batch.concat([part for part in (ours, theirs) if len(part)])
        if len(ours) and len(theirs)
        else (ours if len(ours) else theirs)
    )
    order = [p * n + j for p in [*our_prompts, *their_prompts] for j in range(n)]
    position = {row: k for k, row in enumerate(order)}
    return merged.select([position[row] for row in range(len(order))])


def custom_call(prompt_ids: list[int], uid: str, limit: int) -> Trajectory:
    """The trajectory of one `generate` call of a custom agent loop: its prompt, at most `limit` new tokens."""
    return Trajectory(prompt_ids, uid, {}, turn_limit=limit)


def build_agent_loop(
    engine,
    mt,
    default_agent: str,
    turns: TurnBackend | None = None,
    processor=None,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    custom=None,
) -> AgentLoop:
    """The agent loop of a rollout engine over the typed `rollout.multi_turn` section `mt`, its tools built
    from `mt.tool_config_path` and `mt.function_tool_path` and its interactions from `mt.interaction_config_path` (neither: the loop
    stops after the first turn); `default_agent`: `rollout.agent.default_agent_loop`; `turns`: the engine's
    `TurnBackend` (None: the hf engine's, over `engine.module`); `processor`: a vision-language model's
    processor, which lets images into the conversation (`data.min_pixels` / `data.max_pixels` resize the
    tools' images; None: text only); `custom`: (the typed backend config, rollout.agent.agent_loop_config_path)
    when custom agent loops are configured, else None."""
    from verl_npu.tools.interactions.loading import load_interactions
    from verl_npu.tools.loading import load_tools

    tools = (
        load_tools(mt.tool_config_path, mt.function_tool_path) if (mt.tool_config_path or mt.function_tool_path) else {}
    )
    interactions = load_interactions(mt.interaction_config_path) if mt.interaction_config_path else {}
    loop = AgentLoop(
        getattr(engine, "module", None),
        engine.tokenizer,
        tools,
        mt,
        eos_ids=engine.eos_ids,
        pad_id=engine.pad_id,
        suppress_ids=getattr(engine, "suppress_ids", None),
        seed=engine.seed,
        default_agent=default_agent,
        synced=getattr(engine, "synced", False),
        turns=turns,
        interactions=interactions,
        compute_device=getattr(engine, "compute_device", None),
        images=ImageTurns(processor, min_pixels, max_pixels) if processor is not None else None,
    )
    if custom is not None:  # rollout.agent.agent_loop_config_path's loops (custom_loops)
        from verl_npu.rollout.custom_loops import CustomLoopRunner, load_agent_loops

        config, path = custom
        loop.custom = CustomLoopRunner(load_agent_loops(path), config, engine.tokenizer, engine.eos_ids, custom_call)
    return loop
