"""A tool turn's text and tokens in a multi-turn trajectory: a tool's reply cut to a length (`truncate`), and the
tool messages rendered by the model's chat template as the turn that follows an assistant turn
(`ToolTurnRenderer`, with multi_turn.tokenization_sanity_check_mode)."""

from __future__ import annotations

import logging

from verl_npu.errors import UserError

log = logging.getLogger(__name__)


def truncate(text: str, limit: int, side: str) -> str:
    """`text` cut to `limit` characters on `side` (left: keep the end; right: keep the start; middle:
    keep both ends), with a marker where text was cut."""
    if len(text) <= limit:
        return text
    if side == "left":
        return "(truncated)..." + text[-limit:]
    if side == "right":
        return text[:limit] + "...(truncated)"
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[len(text) - half :]


class ToolTurnRenderer:
    """Token ids of a tool turn: what the chat template writes after an assistant turn that ended with its
    end-of-turn token, for the tool messages, up to and including the next assistant header.

    The template renders a probe conversation (a user turn, an assistant turn with a marker character as
    its content, the tool messages, the generation prompt); the turn is the text after the marker, less
    the end-of-turn token the model already wrote. Only what follows the assistant turn is used, so
    templates that render a last assistant turn differently (Qwen3's empty think block) give the same turn.
    """

    MARK = "\u2064"
    PROBE = [{"role": "user", "content": "\u2063"}, {"role": "assistant", "content": MARK}]

    def __init__(self, tokenizer, mode: str = "strict", template=None):
        self.tokenizer = tokenizer
        # whose chat template renders the turns: the processor's for a vision-language model (as the dataset
        # renders its prompts), else the tokenizer's
        self.template = template if template is not None else tokenizer
        self.mode = mode
        self.warned = False

    def text(self, tool_messages: list[dict], ended_with: str) -> tuple[str, str]:
        """(the whole rendered probe conversation, the turn's text)."""
        full = self.template.apply_chat_template(self.PROBE + tool_messages, tokenize=False, add_generation_prompt=True)
        if full.count(self.MARK) != 1:
            raise UserError(
                "the chat template does not render an assistant message's content as given, so tool "
                "turns cannot be appended to a conversation; use a chat template that does "
                "(actor_rollout_ref.model.custom_chat_template)"
            )
        delta = full[full.index(self.MARK) + 1 :]
        if ended_with and delta.startswith(ended_with):
            delta = delta[len(ended_with) :]
        return full, delta

    def ids(self, tool_messages: list[dict], ended_with: str) -> list[int]:
        full, delta = self.text(tool_messages, ended_with)
        ids = self.tokenizer(delta, add_special_tokens=False)["input_ids"]
        if self.mode != "disable" and not self.warned:
            self._sanity(full, delta, ids)
        return ids

    def _sanity(self, full: str, delta: str, ids: list[int]) -> None:
        """multi_turn.tokenization_sanity_check_mode: the turn's tokens must be the last tokens of the whole
        rendered conversation tokenized at once (strict), or the same once whitespace-only tokens are left
        out (ignore_strippable); a mismatch is logged once."""
        whole = self.tokenizer(full, add_special_tokens=False)["input_ids"]
        got, want = list(ids), whole[len(whole) - len(ids) :]
        if self.mode == "ignore_strippable":
            keep = lambda seq: [t for t in seq if self.tokenizer.decode([t]).strip()]  # noqa: E731
            got = keep(ids)
            want = keep(whole)[len(keep(whole)) - len(got) :] if got else []
        if got != want:
            self.warned = True
            log.warning(
                "multi-turn tokenization check (%s): a tool turn tokenized alone differs from the same "
                "text tokenized with the whole conversation (%r); the turn's own tokens are used. Set "
                "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=disable to silence "
                "this",
                self.mode,
                delta[:80],
            )
