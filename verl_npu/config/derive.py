"""Derived settings: values verl-npu fills in when the user did not set them, each with its reason.

A key the user set (in the recipe or on the command line) is never overwritten. A derivation
whose inputs already have a problem is skipped. Rules (seq = max_prompt_length + max_response_length):
- rollout.prompt_length / response_length = data.max_prompt_length / max_response_length
- rollout.max_model_len = seq; rollout.max_num_batched_tokens = max(8192, seq)
- rollout.tensor_model_parallel_size = 1 for engines without tensor parallelism (hf)
- actor Ulysses SP, when responses exceed 8192 tokens: max_response_length // 2048, lowered to the
  largest size that divides the device count and (when the model config is readable) the heads
- ref SP = actor SP; ref/rollout log_prob_use_dynamic_bsz = actor.use_dynamic_bsz
- with dynamic batch size: actor.ppo_max_token_len_per_gpu = n x seq, and the ref/rollout
  log_prob_max_token_len_per_gpu = that value
- actor.clip_ratio_low / clip_ratio_high = clip_ratio
- trainer.default_local_dir = <af_output_dir>/checkpoints, trainer.tensorboard_dir = $TENSORBOARD_DIR when set
  (as in verl), else <af_output_dir>/tensorboard
- top-level engine_kwargs.<engine> is merged into actor_rollout_ref.rollout.engine_kwargs.<engine>
- vllm rollout on a device whose vLLM cannot prefill in chunks while each prompt samples from its
  own seed (CPU: `DeviceInfo.vllm_chunked_prefill_with_seeds`): rollout.enable_chunked_prefill =
  false, and rollout.max_num_batched_tokens raised to max_model_len when below it (vLLM needs a
  whole prompt to fit one step without chunking). The samples are the same as with chunked prefill
  and a budget that never chunks: a step only prefills fewer prompts.
- rollout correction on (algorithm.rollout_correction.rollout_is / rollout_rs / bypass_mode):
  rollout.calculate_log_probs = true; with bypass_mode, actor.policy_loss.loss_mode vanilla -> bypass_mode
- trainer.v1.trainer_mode=separate_async: rollout.calculate_log_probs = true (the behaviour policy's log-probs)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl_npu.config.modelinfo import LONG_RESPONSE, model_heads, ulysses_size
from verl_npu.config.schema import PLACEHOLDER
from verl_npu.config.tree import ACTOR, ALGO, BC, DATA, REF, ROLL, TRAINER, SkipRule, get, get_unless_bad
from verl_npu.errors import Problem
from verl_npu.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, ROLLOUT_ENGINES, bypass_loss, is_file_entry


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def derive(
    cfg: DictConfig, user_keys: frozenset[str], bad: set[str]
) -> tuple[list[tuple[str, Any, str]], list[Problem]]:
    """Fill in derived values in `cfg` (in place). Returns ([(key, value, reason)], problems)."""
    derived: list[tuple[str, Any, str]] = []
    problems: list[Problem] = []

    def val(path: str) -> Any:
        return get_unless_bad(cfg, path, bad)

    def put(path: str, value: Any, reason: str) -> None:
        if path in user_keys or path in bad:
            return
        OmegaConf.update(cfg, path, value, merge=False)
        derived[:] = [d for d in derived if d[0] != path]  # a later derivation of the same key replaces it
        derived.append((path, value, reason))

    def step(fn) -> None:
        try:
            fn()
        except SkipRule:
            pass

    def lengths() -> None:
        p, r = val(DATA + "max_prompt_length"), val(DATA + "max_response_length")
        put(ROLL + "prompt_length", p, "data.max_prompt_length")
        put(ROLL + "response_length", r, "data.max_response_length")
        put(ROLL + "max_model_len", p + r, f"max_prompt_length + max_response_length = {p + r}")
        if p + r > LONG_RESPONSE:
            put(
                ROLL + "max_num_batched_tokens",
                p + r,
                f"prompt + response = {p + r} exceeds 8192, so the engine must batch a whole sequence",
            )
        else:
            put(ROLL + "max_num_batched_tokens", LONG_RESPONSE, f"prompt + response = {p + r} fits in the default 8192")

    def rollout_tp() -> None:
        name = val(ROLL + "name")
        spec = ROLLOUT_ENGINES.find(name)
        if spec is not None and not spec.tensor_parallel:
            put(ROLL + "tensor_model_parallel_size", 1, f"the {name} rollout has no tensor parallelism")

    def sequence_parallel() -> None:
        r = val(DATA + "max_response_length")
        world = val(TRAINER + "nnodes") * val(TRAINER + "n_gpus_per_node")
        key = ACTOR + "ulysses_sequence_parallel_size"
        if r > LONG_RESPONSE:
            heads = model_heads(val(BC + "actor_rollout_ref.model.path"))
            sp = ulysses_size(r, world, heads)
            fit = (
                f"fits {world} devices and {heads[0]}/{heads[1]} attention/kv heads"
                if heads
                else f"fits {world} devices (model config not readable: heads not checked)"
            )
            put(key, sp, f"responses of {r} tokens exceed 8192: {r} // 2048 = {r // 2048}, lowered to {sp} that {fit}")
        sp_now = val(key)
        if sp_now != get(cfg, REF + "ulysses_sequence_parallel_size"):
            put(REF + "ulysses_sequence_parallel_size", sp_now, "actor.ulysses_sequence_parallel_size")

    def dynamic_bsz() -> None:
        dyn = val(ACTOR + "use_dynamic_bsz")
        put(ROLL + "log_prob_use_dynamic_bsz", dyn, "actor.use_dynamic_bsz")
        put(REF + "log_prob_use_dynamic_bsz", dyn, "actor.use_dynamic_bsz")
        if not dyn:
            return
        n = val(ROLL + "n")
        seq = val(DATA + "max_prompt_length") + val(DATA + "max_response_length")
        put(ACTOR + "ppo_max_token_len_per_gpu", n * seq, f"use_dynamic_bsz: n x (prompt + response) = {n} x {seq}")
        tokens = val(ACTOR + "ppo_max_token_len_per_gpu")
        for key in (ROLL + "log_prob_max_token_len_per_gpu", REF + "log_prob_max_token_len_per_gpu"):
            put(key, tokens, "actor.ppo_max_token_len_per_gpu")

    def clip() -> None:
        eps = val(ACTOR + "clip_ratio")
        for key in (ACTOR + "clip_ratio_low", ACTOR + "clip_ratio_high"):
            if get(cfg, key) is None:
                put(key, eps, "actor.clip_ratio")

    def folders() -> None:
        out = val("af_output_dir")
        if not isinstance(out, str) or out.startswith(PLACEHOLDER):
            return
        base = os.path.abspath(os.path.expanduser(out))  # relative: from the current folder (README, "Paths")
        if get(cfg, TRAINER + "default_local_dir") is None:
            put(TRAINER + "default_local_dir", f"{base}/checkpoints", "<af_output_dir>/checkpoints")
        if get(cfg, TRAINER + "tensorboard_dir") is None:
            env = os.environ.get("TENSORBOARD_DIR")
            if env:
                put(TRAINER + "tensorboard_dir", env, "$TENSORBOARD_DIR (verl's variable)")
            else:
                put(TRAINER + "tensorboard_dir", f"{base}/tensorboard", "<af_output_dir>/tensorboard")

    def engine_kwargs() -> None:
        for engine in ("vllm", "sglang"):
            top = val(f"engine_kwargs.{engine}") or {}
            target = ROLL + f"engine_kwargs.{engine}"
            if not top:
                continue
            inner = dict(val(target) or {})
            for k, v in top.items():
                if k in inner and inner[k] != v:
                    problems.append(
                        Problem(
                            f"engine_kwargs.{engine}.{k}",
                            f"is {v!r} but {target}.{k} is {inner[k]!r}",
                            "set it in one place only",
                        )
                    )
                inner[k] = v
            OmegaConf.update(cfg, target, inner, merge=False)
            derived.append((target, inner, f"merged from top-level engine_kwargs.{engine}"))

    def vllm_prefill() -> None:
        spec = ROLLOUT_ENGINES.find(val(ROLL + "name"))
        if spec is None or not spec.chunked_prefill:
            return
        from verl_npu.device import configured_device  # lazily: validating an hf recipe needs no probe

        device = configured_device(val(TRAINER + "device"))
        if device is None or device.vllm_chunked_prefill_with_seeds:
            return
        put(
            ROLL + "enable_chunked_prefill",
            False,
            f"vLLM on {device.kind} cannot prefill a prompt in chunks while it samples from its own seed "
            "(it dies with 'CPU Generator does not use offset'); whole prefills give the same samples",
        )
        # what the engine gets: an engine_kwargs.vllm entry (already merged) wins over the rollout key
        engine = val(ROLL + "engine_kwargs.vllm") or {}

        def effective(arg: str) -> Any:
            return engine[arg] if engine.get(arg) is not None else val(ROLL + arg)

        if effective("enable_chunked_prefill") is not False or engine.get("max_num_batched_tokens") is not None:
            return  # chunked prefill asked for, or the budget set in engine_kwargs: the rules decide
        length, tokens = effective("max_model_len"), val(ROLL + "max_num_batched_tokens")
        if _is_int(length) and _is_int(tokens) and tokens < length:
            put(
                ROLL + "max_num_batched_tokens",
                length,
                f"max_model_len = {length}: without chunked prefill (on {device.kind}) a whole prompt must fit "
                "one engine step",
            )

    def rollout_correction() -> None:
        rc = ALGO + "rollout_correction."
        bypass = val(rc + "bypass_mode") is True
        if bypass or val(rc + "rollout_is") is not None or val(rc + "rollout_rs") is not None:
            put(ROLL + "calculate_log_probs", True, "algorithm.rollout_correction needs the rollout's own log-probs")
        elif val(TRAINER + "v1.trainer_mode") == "separate_async":
            put(
                ROLL + "calculate_log_probs",
                True,
                "trainer.v1.trainer_mode=separate_async: the rollout side's log-probs are the behaviour policy",
            )
        mode = POLICY_LOSSES.find(val(ACTOR + "policy_loss.loss_mode"))
        if bypass and mode is not None and mode.bypass_replaces and ACTOR + "policy_loss.loss_mode" not in bad:
            # replaced even when set by the user: the worker runs the loss the config names, nothing else
            path, reason = (
                ACTOR + "policy_loss.loss_mode",
                (
                    f"algorithm.rollout_correction.bypass_mode=true (its {mode.name} loss is bypass mode's "
                    "loss_type=ppo_clip; verl's trainer switches the loss the same way)"
                ),
            )
            OmegaConf.update(cfg, path, bypass_loss().name, merge=False)
            derived[:] = [d for d in derived if d[0] != path] + [(path, bypass_loss().name, reason)]

    def user_files() -> None:
        # a user's `file.py:function` is imported by path in every worker process: made absolute here, once
        for reg in (POLICY_LOSSES, ADVANTAGE_ESTIMATORS):
            path = BC + reg.key
            value = val(path)
            if path in bad or not is_file_entry(value) or Path(str(value).rpartition(":")[0]).is_absolute():
                continue
            file, _, function = str(value).rpartition(":")
            absolute = f"{Path(file).expanduser().resolve()}:{function}"
            OmegaConf.update(cfg, path, absolute, merge=False)
            derived[:] = [d for d in derived if d[0] != path] + [
                (path, absolute, f"{value} (relative to {Path.cwd()})")
            ]

    for fn in (
        lengths,
        rollout_tp,
        sequence_parallel,
        dynamic_bsz,
        clip,
        folders,
        engine_kwargs,
        vllm_prefill,
        rollout_correction,
        user_files,
    ):
        step(fn)
    return derived, problems
