"""Cross-key rules of the worker roles' own sections (the FSDP settings of every role, the reward
model's `reward_model.*`, the actor's policy-loss settings), registered in `rules.RULES`.

Kept apart from `rules.py` so that each file stays small; `paths` (and so `loader`) imports this module,
which registers its rules.
"""

from __future__ import annotations

from collections.abc import Iterator

from verl_npu.config.rules import _LENS, _WORLD, Ctx, _rule
from verl_npu.config.tree import BC
from verl_npu.errors import Problem
from verl_npu.registry import POLICY_LOSSES

RM = BC + "reward_model."

#: the roles with an fsdp_config: (config section, the role's name in messages, its optimizer offloads)
_FSDP_ROLES = (
    ("actor_rollout_ref.actor", "actor", True),
    ("actor_rollout_ref.ref", "ref", False),
    ("critic.model", "critic.model", True),
    ("reward_model.model", "reward_model.model", False),
)
_FSDP = (
    tuple(
        f"{BC}{section}.fsdp_config.{k}"
        for section, _, _ in _FSDP_ROLES
        for k in ("param_offload", "optimizer_offload", "fsdp_size")
    )
    + _WORLD
)


@_rule(
    "trainer_fsdp_offload_and_sharding",
    _FSDP,
    "optimizer_offload needs param_offload (FSDP2 offloads both together; one worker shards over a group of "
    "itself); fsdp_size must be -1 or the device count (no hybrid sharding)",
)
def _trainer_fsdp(c: Ctx) -> Iterator[Problem]:
    for section, role, has_optimizer in _FSDP_ROLES:
        prefix = f"{BC}{section}.fsdp_config."
        param = bool(c(prefix + "param_offload"))
        opt = c(prefix + "optimizer_offload")
        if has_optimizer and opt and not param:
            yield Problem(
                prefix + "optimizer_offload",
                "FSDP2 offloads the optimizer state together with the parameters, not alone",
                f"also set {role}.fsdp_config.param_offload=true, or set this to false",
            )
        size = c(prefix + "fsdp_size")
        if int(size if size is not None else -1) not in (-1, c.world):
            yield Problem(
                prefix + "fsdp_size",
                "hybrid sharding (fsdp_size < world size) is not implemented",
                "leave it at -1 (shard over all workers)",
            )


@_rule(
    "reward_model_path",
    (RM + "enable", RM + "model.path"),
    "reward_model.enable=true needs reward_model.model.path (a sequence-classification model)",
)
def _reward_model_path(c: Ctx) -> Iterator[Problem]:
    if c(RM + "enable") and not c(RM + "model.path"):
        yield Problem(
            RM + "model.path",
            "is required with reward_model.enable=true",
            "set it to a transformers sequence-classification model folder (num_labels=1), or set "
            "reward_model.enable=false",
        )


@_rule(
    "reward_model_token_budget",
    (RM + "enable", RM + "use_dynamic_bsz", RM + "forward_max_token_len_per_gpu", RM + "max_length") + _LENS,
    "with reward_model.use_dynamic_bsz, forward_max_token_len_per_gpu holds one sequence (prompt + response, "
    "at most reward_model.max_length tokens)",
)
def _reward_model_budget(c: Ctx) -> Iterator[Problem]:
    if not (c(RM + "enable") and c(RM + "use_dynamic_bsz")):
        return
    longest = c.seq_len if c(RM + "max_length") is None else min(c.seq_len, int(c(RM + "max_length")))
    key = RM + "forward_max_token_len_per_gpu"
    if c(key) < longest:
        yield Problem(
            key,
            f"{c(key)} tokens cannot hold one sequence of {longest} tokens (max_prompt_length + "
            "max_response_length, at most reward_model.max_length)",
            f"set it to at least {longest}",
        )


PL = BC + "actor_rollout_ref.actor.policy_loss."


@_rule(
    "policy_loss_settings",
    (PL + "loss_mode", PL + "dro_beta"),
    "policy_loss.loss_mode=dro needs policy_loss.dro_beta (> 0): the weight of its log-ratio penalty has no default",
)
def _policy_loss_settings(c: Ctx) -> Iterator[Problem]:
    spec = POLICY_LOSSES.find(c(PL + "loss_mode"))
    if spec is not None and "policy_loss.dro_beta" in spec.requires and c(PL + "dro_beta") is None:
        yield Problem(
            PL + "dro_beta",
            "is required with policy_loss.loss_mode=dro (it has no default, as in verl)",
            "set actor_rollout_ref.actor.policy_loss.dro_beta to a value > 0, e.g. 0.1",
        )


#: why a vision-language reward model is refused, and what to use instead (config check and worker)
VL_REWARD_MODEL = (
    "is a vision-language model: the reward model worker scores token ids only (no images reach "
    "it), and transformers has no sequence-classification class for vision-language models"
)
VL_REWARD_MODEL_FIX = (
    "point reward_model.model.path at a text reward model (*ForSequenceClassification, "
    "num_labels=1), or score with a rule reward (custom_reward_function.path) and "
    "reward_model.enable=false"
)


#: the tiny:// models (verl_npu.models.tiny) that are vision-language models
TINY_VISION_LANGUAGE = ("qwen25vl",)


def tiny_model_problems(key: str, uri: str) -> list[Problem]:
    """The `VL_REWARD_MODEL` problem when `uri` (a reward model's tiny:// path) names a vision-language model."""
    name = uri[len("tiny://") :].partition("?")[0]
    if name in TINY_VISION_LANGUAGE:
        return [Problem(key, f"{uri!r} {VL_REWARD_MODEL}", VL_REWARD_MODEL_FIX)]
    return []


def model_folder_problems(key: str, folder) -> list[Problem]:
    """A problem when `folder` (an existing reward model folder) holds no config.json, one whose
    `architectures` name no `*ForSequenceClassification` class (a causal LM has no score head), or one
    of a vision-language model (a `vision_config`: `VL_REWARD_MODEL`)."""
    import json
    from pathlib import Path

    config = Path(folder) / "config.json"
    if not config.is_file():
        return [
            Problem(
                key,
                f"{str(folder)!r} has no config.json: not a transformers model folder",
                "point it at a sequence-classification model folder",
            )
        ]
    try:
        doc = json.loads(config.read_text())
        archs = doc.get("architectures") or []
    except (OSError, ValueError, AttributeError) as err:
        return [Problem(key, f"{config} cannot be read as JSON ({err})", "fix or replace the model folder")]
    if doc.get("vision_config") is not None:
        return [Problem(key, f"{str(folder)!r} ({doc.get('model_type')}) {VL_REWARD_MODEL}", VL_REWARD_MODEL_FIX)]
    if archs and not any(str(a).endswith("ForSequenceClassification") for a in archs):
        return [
            Problem(
                key,
                f"{str(folder)!r} is a {', '.join(map(str, archs))}, not a sequence-classification "
                "model: the reward model must be AutoModelForSequenceClassification with num_labels=1",
                "point it at a reward model folder (architectures: *ForSequenceClassification)",
            )
        ]
    return []


_OFFLOAD = BC + "actor_rollout_ref.model.enable_activation_offload"


@_rule(
    "activation_offload_on_cpu",
    (_OFFLOAD, BC + "trainer.device"),
    "model.enable_activation_offload on a CPU run only notes that it changes nothing",
)
def _activation_offload_on_cpu(c: Ctx) -> Iterator[Problem]:
    from verl_npu.config.rules import _device

    device = _device(c)
    if c(_OFFLOAD) and device is not None and not device.is_accelerator:
        c.warnings.append(
            "actor_rollout_ref.model.enable_activation_offload: on cpu the activations are in host "
            "memory already; accepted, changes nothing"
        )
    return iter(())
