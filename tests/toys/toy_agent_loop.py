"""A custom agent loop written against verl 0.9.1's interface (it imports verl's module names only), for
tests/rollout/test_custom_agent_loops.py and the agent-loop verl script's 2-step run: two model turns with an
appended user message between them. Also loops that fail in the ways a user's loop can."""

from uuid import uuid4

from verl.experimental.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.experimental.agent_loop.agent_loop import register

FOLLOW_UP = "Check your answer once more."


@register("two_turn_toy")
class TwoTurnAgentLoop(AgentLoopBase):
    """Answer, hear a follow-up user message (not trained), answer again."""

    def __init__(self, *args, follow_up: str = FOLLOW_UP, first_turn_tokens: int = 6, **kwargs):
        super().__init__(*args, **kwargs)
        self.follow_up = follow_up
        self.first_turn_tokens = first_turn_tokens
        self.response_length = self.rollout_config.response_length

    async def run(self, sampling_params, **kwargs):
        prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
        first = await self.server_manager.generate(
            request_id=uuid4().hex,
            prompt_ids=prompt_ids,
            sampling_params={**sampling_params, "max_tokens": self.first_turn_tokens},
        )
        end = "" if first.token_ids and first.stop_reason == "completed" else "<|im_end|>"
        user = self.tokenizer(
            f"{end}\n<|im_start|>user\n{self.follow_up}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
        )["input_ids"]
        second = await self.server_manager.generate(
            request_id=uuid4().hex, prompt_ids=prompt_ids + first.token_ids + user, sampling_params=sampling_params
        )
        response = first.token_ids + user + second.token_ids
        mask = [1] * len(first.token_ids) + [0] * len(user) + [1] * len(second.token_ids)
        logprobs = first.log_probs + [0.0] * len(user) + second.log_probs
        n = self.response_length
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response[:n],
            response_mask=mask[:n],
            response_logprobs=logprobs[:n],
            num_turns=4,
            metrics={},
            extra_fields={"follow_up_tokens": len(user)},
        )


class RaisingLoop(AgentLoopBase):
    async def run(self, sampling_params, **kwargs):
        raise RuntimeError("the environment crashed")


class BadOutputLoop(AgentLoopBase):
    async def run(self, sampling_params, **kwargs):
        return AgentLoopOutput(
            prompt_ids=list(kwargs["raw_prompt_ids"]), response_ids=[1, 2, 3], response_mask=[1, 0], metrics={}
        )


class NotALoop:
    async def run(self, sampling_params, **kwargs):
        return None
