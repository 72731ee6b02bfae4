"""verl keys outside the schema's own: the verl subtrees verl-npu does not support, and verl's deprecated keys
(refused, mapped to the keys that replace them with a warning, or warned about only). The loader reads them
when it classifies a recipe's keys; `verl-npu explain` and the generated docs name them."""

from __future__ import annotations

# Tables, kept as written (ruff format would put each entry's parts on lines of their own).
# fmt: off

#: verl subtrees verl-npu does not support: prefix (full path) -> the missing feature.
UNSUPPORTED_PREFIXES: dict[str, str] = {
    "backend_config.algorithm.pf_ppo": "pf-ppo",
    "backend_config.trainer.controller_nsight_options": "Nsight Systems profiling (use global_profiler.tool=torch)",
    "backend_config.trainer.worker_nsight_options": "Nsight Systems profiling (use global_profiler.tool=torch)",
}

#: deprecated verl keys that verl 0.9.1 no longer reads (full path) -> the key that replaces them: refused.
DEPRECATED: dict[str, str] = {
    "backend_config.reward_model.micro_batch_size": "backend_config.reward_model.micro_batch_size_per_gpu",
}
_A = "backend_config.actor_rollout_ref."
#: verl's deprecated micro batch sizes that verl 0.9.1 still accepts: old key (full path) -> (the per-device key
#: it sets, the Ulysses sequence-parallel size key of that role). The old value counts responses over all
#: data-parallel ranks: the per-device value is old // (nnodes * n_gpus_per_node // sequence-parallel size),
#: and below 1 is refused (verl: micro batch * sp must be >= the device count). Setting both is refused, as in
#: verl (without use_dynamic_bsz; with it neither is read). A null old value is the same as not setting it.
DEPRECATED_MICRO: dict[str, tuple[str, str]] = {
    _A + "actor.ppo_micro_batch_size":
        (_A + "actor.ppo_micro_batch_size_per_gpu", _A + "actor.ulysses_sequence_parallel_size"),
    _A + "rollout.log_prob_micro_batch_size":
        (_A + "rollout.log_prob_micro_batch_size_per_gpu", _A + "actor.ulysses_sequence_parallel_size"),
    _A + "ref.log_prob_micro_batch_size":
        (_A + "ref.log_prob_micro_batch_size_per_gpu", _A + "ref.ulysses_sequence_parallel_size"),
    "backend_config.critic.ppo_micro_batch_size":
        ("backend_config.critic.ppo_micro_batch_size_per_gpu", "backend_config.critic.ulysses_sequence_parallel_size"),
}
#: verl's deprecated `trainer.remove_previous_ckpt_in_save`, still read by verl 0.9.1: true keeps one checkpoint,
#: i.e. sets these keys to 1 (verl ignores them then; verl-npu refuses one set to another value).
DEPRECATED_CKPT = ("backend_config.trainer.remove_previous_ckpt_in_save",
                   ("backend_config.trainer.max_actor_ckpt_to_keep", "backend_config.trainer.max_critic_ckpt_to_keep"))
#: verl's deprecated optimizer `grad_clip` (a field of verl 0.9.1's optimizer config, set with `+`; verl copies it
#: to `optim.clip_grad`): old key (full path) -> the key it sets (verl-npu reads `optim.clip_grad` as that key).
DEPRECATED_RENAMED: dict[str, str] = {
    _A + "actor.optim.grad_clip": _A + "actor.grad_clip",
    "backend_config.critic.optim.grad_clip": "backend_config.critic.grad_clip",
}
#: every deprecated verl key verl-npu accepts and maps (full path) -> what it sets, in words.
DEPRECATED_MAPPED: dict[str, str] = {
    **{old: f"sets `{new.removeprefix('backend_config.')}` (verl: `optim.clip_grad`), with a warning; "
            "a different value set there too is refused"
       for old, new in DEPRECATED_RENAMED.items()},
    **{old: f"sets `{new.removeprefix('backend_config.')}` to it // the data-parallel ranks (devices // "
            f"`{sp.removeprefix('backend_config.')}`), with a warning; setting both is refused"
       for old, (new, sp) in DEPRECATED_MICRO.items()},
    DEPRECATED_CKPT[0]: "true sets `trainer.max_actor_ckpt_to_keep` and `trainer.max_critic_ckpt_to_keep` to 1, "
                        "with a warning; either set to another value is refused",
}
del _A
#: deprecated keys that only warn (as in verl).
DEPRECATED_WARN_ONLY = {"backend_config.data.val_batch_size": "leave it null: validation sends the whole set at once"}
# fmt: on
