"""The reward model worker (`reward_model.enable`): a frozen scorer on every rank, colocated with the actor.

The reward model is a transformers sequence-classification model with one label
(`reward_model.model.path`). A response's score is that model's output at the last valid token of
prompt + response. It is computed as verl does: the checkpoint is loaded through the
token-classification class of the same architecture (the same backbone and the same `score`
Linear, which gives an output at every position), and the output is read at the last position
whose attention mask is 1. A checkpoint without a `score.bias` (sequence-classification heads have
none) gets a zero bias, so the number equals the sequence-classification model's own.

Inputs: with `reward_model.model.input_tokenizer` null, or naming a tokenizer equal to the reward
model's (same vocabulary and chat template), the rollout's token ids are scored as they are.
Otherwise each row is rendered again for the reward model: its chat messages (`raw_prompt`, with
`data.return_raw_chat`) plus the response text as an assistant turn, through the reward model's
chat template; without messages (or without a chat template), the decoded prompt text followed by
the response text. `reward_model.max_length` keeps the last max_length tokens of each sequence.

No optimizer, no gradients, no checkpoint: the reward model is frozen, and `global_step_N/` holds
no folder for it (it is reloaded from `reward_model.model.path` on resume).
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import TYPE_CHECKING

import torch

from verl_npu import algorithms
from verl_npu.batch import Batch, reads
from verl_npu.config.rules_roles import VL_REWARD_MODEL, VL_REWARD_MODEL_FIX
from verl_npu.errors import UserError
from verl_npu.models.loading import (
    MODEL_LOAD_KWARGS,
    apply_override_config,
    is_vision_language,
    load_config,
    load_tokenizer_and_processor,
    resolve_model_path,
)
from verl_npu.models.tiny import is_tiny_uri
from verl_npu.registry import ROLES
from verl_npu.workers.engine import TrainingEngine, micro_batching

if TYPE_CHECKING:
    from verl_npu.config.sections import BackendConfigSection

RM_KEY = "reward_model.model"
log = logging.getLogger("verl_npu")


def load_reward_model(
    path,
    *,
    dtype: torch.dtype,
    attn_implementation: str,
    override_config: dict | None,
    trust_remote_code: bool,
    external_lib: str | None = None,
) -> torch.nn.Module:
    """The token-classification model (one label, no dropout) of the sequence-classification
    checkpoint at `path`, in eval mode with gradients off; a missing `score.bias` is zero."""
    from transformers import AutoModelForTokenClassification

    if external_lib:
        try:
            importlib.import_module(external_lib)
        except ImportError as err:
            raise UserError(
                f"{RM_KEY}.external_lib={external_lib!r} cannot be imported ({err}); install it or remove the key"
            ) from err
    config = load_config(path, trust_remote_code=trust_remote_code)
    apply_override_config(config, override_config)
    if is_vision_language(config):  # the config check refuses a folder; this a tiny:// or hub model
        raise UserError(f"{RM_KEY}.path={path} ({config.model_type}) {VL_REWARD_MODEL}; {VL_REWARD_MODEL_FIX}")
    archs = list(getattr(config, "architectures", None) or [])
    if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
        raise UserError(
            f"{RM_KEY}.path={path} is a {', '.join(archs)}, not a sequence-classification model; "
            "point it at a reward model (AutoModelForSequenceClassification, num_labels=1)"
        )
    if int(getattr(config, "num_labels", 1)) != 1:
        raise UserError(
            f"{RM_KEY}.path={path}: the model has num_labels={config.num_labels}; a reward model "
            "gives one score (num_labels=1)"
        )
    config.classifier_dropout = 0.0
    loader_log = logging.getLogger("transformers.modeling_utils")
    level = loader_log.level
    loader_log.setLevel(logging.ERROR)  # its report of the missing score.bias reads like an error: ours below
    try:
        model, info = AutoModelForTokenClassification.from_pretrained(
            resolve_model_path(path),
            config=config,
            dtype=dtype,
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
            output_loading_info=True,
            **MODEL_LOAD_KWARGS,
        )
    except ValueError as err:  # an architecture without a token-classification class
        raise UserError(f"{RM_KEY}.path={path}: cannot load it as a per-token scorer ({err})") from err
    finally:
        loader_log.setLevel(level)
    missing = set(info.get("missing_keys", ()))
    head = [k for k in missing if not k.endswith("score.bias")]
    if head:
        raise UserError(
            f"{RM_KEY}.path={path} has no weights for {', '.join(sorted(head)[:3])}: it is not a "
            "sequence-classification (reward) model; point it at one (num_labels=1)"
        )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in missing:  # score.bias: sequence-classification heads have none
                param.zero_()
                log.info(
                    "reward model: %s is not in the checkpoint (a sequence-classification head has no bias): zero", name
                )
    model.requires_grad_(False)
    return model.eval()


def last_token_scores(module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Scores [B]: the model's output at the last position of each row whose attention mask is 1."""
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = module(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False)
    logits = out.logits.squeeze(-1).float()
    cols = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    last = (cols * attention_mask.long()).argmax(-1)
    return logits[torch.arange(len(logits), device=logits.device), last]


def keep_last_tokens(attention_mask: torch.Tensor, max_length: int | None) -> torch.Tensor:
    """The attention mask with all but the last `max_length` valid tokens of each row masked out."""
    if max_length is None:
        return attention_mask
    from_end = attention_mask.flip(-1).long().cumsum(-1).flip(-1)  # valid tokens from here to the row's end
    return attention_mask * (from_end <= int(max_length)).to(attention_mask.dtype)


def load_input_tokenizer(path: str, trust_remote_code: bool):
    """The tokenizer of `reward_model.model.input_tokenizer`: a model folder or a tokenizer-only folder."""
    from transformers import AutoTokenizer

    local = resolve_model_path(path) if is_tiny_uri(path) else os.path.expanduser(path)
    try:
        return AutoTokenizer.from_pretrained(local, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise UserError(
            f"{RM_KEY}.input_tokenizer={path!r}: no tokenizer can be loaded from it ({err}); point it "
            "at the actor's model (or tokenizer) folder, or set it to null"
        ) from err


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers give the same ids and the same chat rendering."""
    return a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)


@ROLES.register(
    "reward_model",
    needed_when=("reward_model.enable",),
    checkpointed=False,
    scores=True,
    model_key="reward_model.model.path",
    methods=("compute_rm_score",),
    doc="frozen sequence-classification reward model (reward_model.enable)",
)
class RewardModelWorker:
    """The reward model role: a frozen engine and `last_token_scores` as its forward. It reads only
    the `reward_model` section of the typed backend config `cfg`."""

    def __init__(
        self, cfg: BackendConfigSection, total_training_steps: int, device, rank: int = 0, world_size: int = 1
    ):
        self.cfg = cfg.reward_model
        self.engine = TrainingEngine("reward_model", device, rank=rank, world_size=world_size)

    def init_model(self) -> dict:
        model_cfg = self.cfg.model
        path = model_cfg.path
        trust = model_cfg.trust_remote_code
        self.tokenizer, _ = load_tokenizer_and_processor(path, trust_remote_code=trust)
        self.input_tokenizer = None  # set when rollouts must be re-tokenised for the reward model
        if model_cfg.input_tokenizer:
            source = load_input_tokenizer(model_cfg.input_tokenizer, trust_remote_code=trust)
            if not same_tokenizer(source, self.tokenizer):
                self.input_tokenizer = source
        module = load_reward_model(
            path,
            dtype=torch.float32,
            attn_implementation=self.engine.device.attn_implementation(),
            override_config=dict(model_cfg.override_config),
            trust_remote_code=trust,
            external_lib=model_cfg.external_lib,
        )
        module = self.engine.attach(module, model_cfg.fsdp_config)
        return {
            "num_params": sum(p.numel() for p in module.parameters()),
            "retokenize": self.input_tokenizer is not None,
        }

    def _inputs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask) the reward model reads, before max_length."""
        if self.input_tokenizer is None:
            return batch["input_ids"], batch["attention_mask"]
        return self._retokenize(batch)

    def _retokenize(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        src, dst = self.input_tokenizer, self.tokenizer
        prompt_len = batch["input_ids"].shape[1] - batch["responses"].shape[1]
        messages = batch["raw_prompt"] if "raw_prompt" in batch else None
        rows = []
        for i, response in enumerate(batch["response_text"]):  # decoded once, by the controller
            if messages is not None and getattr(dst, "chat_template", None):
                chat = list(messages[i]) + [{"role": "assistant", "content": response}]
                text = dst.apply_chat_template(chat, tokenize=False)
            else:
                prompt_ids = batch["input_ids"][i, :prompt_len][batch["attention_mask"][i, :prompt_len].bool()]
                text = src.decode(prompt_ids.tolist(), skip_special_tokens=True) + response
            rows.append(dst(text, add_special_tokens=False)["input_ids"])
        width = max(len(r) for r in rows)
        pad = dst.pad_token_id if dst.pad_token_id is not None else 0
        ids = torch.full((len(rows), width), int(pad), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):  # left-padded: every row ends at the last column
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
        return ids, mask

    @reads("input_ids", "attention_mask", "responses", "response_mask", "raw_prompt", "response_text")
    def compute_rm_score(self, batch: Batch) -> Batch:
        """`rm_scores` [B, response_length]: each row's reward model score on its last response
        token (the last position whose response mask is 1; position 0 for an empty response), zeros
        elsewhere, as verl's reward model worker returns them. Re-tokenising reads the responses'
        text, `response_text` (decoded once, by the controller's reward step)."""
        rm = self.cfg
        ids, mask = self._inputs(batch)
        inputs = Batch({"input_ids": ids, "attention_mask": keep_last_tokens(mask, rm.max_length)})
        micro = micro_batching(rm.use_dynamic_bsz, rm.forward_max_token_len_per_gpu, rm.micro_batch_size_per_gpu)
        scores = self.engine.infer(
            inputs, lambda module, part: last_token_scores(module, part["input_ids"], part["attention_mask"]), micro
        )
        return Batch({"rm_scores": algorithms.scores_on_last_token(scores, batch["response_mask"])})
