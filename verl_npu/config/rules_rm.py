"""Cross-key rules of the reward model role (`reward_model.*`), registered in `rules.RULES`.

Kept apart from `rules.py` (which imports this module at its end) so that each file stays small.
"""

from __future__ import annotations

from collections.abc import Iterator

from verl_npu.config.rules import _LENS, Ctx, _rule
from verl_npu.config.tree import BC
from verl_npu.errors import Problem

RM = BC + "reward_model."


@_rule("reward_model_path", (RM + "enable", RM + "model.path"),
       "reward_model.enable=true needs reward_model.model.path (a sequence-classification model)")
def _reward_model_path(c: Ctx) -> Iterator[Problem]:
    if c(RM + "enable") and not c(RM + "model.path"):
        yield Problem(RM + "model.path", "is required with reward_model.enable=true",
                      "set it to a transformers sequence-classification model folder (num_labels=1), or set "
                      "reward_model.enable=false")


@_rule("reward_model_token_budget", (RM + "enable", RM + "use_dynamic_bsz", RM + "forward_max_token_len_per_gpu",
                                     RM + "max_length") + _LENS,
       "with reward_model.use_dynamic_bsz, forward_max_token_len_per_gpu holds one sequence (prompt + response, "
       "at most reward_model.max_length tokens)")
def _reward_model_budget(c: Ctx) -> Iterator[Problem]:
    if not (c(RM + "enable") and c(RM + "use_dynamic_bsz")):
        return
    longest = c.seq_len if c(RM + "max_length") is None else min(c.seq_len, int(c(RM + "max_length")))
    key = RM + "forward_max_token_len_per_gpu"
    if c(key) < longest:
        yield Problem(key, f"{c(key)} tokens cannot hold one sequence of {longest} tokens (max_prompt_length + "
                      "max_response_length, at most reward_model.max_length)", f"set it to at least {longest}")


def model_folder_problems(key: str, folder) -> list[Problem]:
    """A problem when `folder` (an existing reward model folder) holds no config.json, or one whose
    `architectures` name no `*ForSequenceClassification` class (a causal LM has no score head)."""
    import json
    from pathlib import Path

    config = Path(folder) / "config.json"
    if not config.is_file():
        return [Problem(key, f"{str(folder)!r} has no config.json: not a transformers model folder",
                        "point it at a sequence-classification model folder")]
    try:
        archs = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError) as err:
        return [Problem(key, f"{config} cannot be read as JSON ({err})", "fix or replace the model folder")]
    if archs and not any(str(a).endswith("ForSequenceClassification") for a in archs):
        return [Problem(key, f"{str(folder)!r} is a {', '.join(map(str, archs))}, not a sequence-classification "
                        "model: the reward model must be AutoModelForSequenceClassification with num_labels=1",
                        "point it at a reward model folder (architectures: *ForSequenceClassification)")]
    return []
