"""The extension points: one registry each, holding a torch-free spec of every implementation.

Each implementation declares itself beside its code with a decorator whose arguments are literals,
`@POLICY_LOSSES.register("gspo", doc=...)`; the registry reads those declarations from the source of the
folders it names (see `core.Registry`), so the config layer validates names and asks what an implementation
can do without importing torch, and the implementation is imported only when it is used (`load(name)`).

| registry            | config key                               | declared in        | spec         |
|---------------------|------------------------------------------|--------------------|--------------|
| POLICY_LOSSES       | actor_rollout_ref.actor.policy_loss.loss_mode | verl_npu/algorithms | PolicyLossSpec |
| ADVANTAGE_ESTIMATORS| algorithm.adv_estimator                  | verl_npu/algorithms| EstimatorSpec|
| ROLLOUT_ENGINES     | actor_rollout_ref.rollout.name           | verl_npu/rollout   | RolloutSpec  |
| ROLES               | (built when the config needs them)       | verl_npu/workers   | RoleSpec     |
| REWARD_MANAGERS     | reward_model.reward_manager              | verl_npu/rewards   | RewardManagerSpec |
| METRIC_SINKS        | trainer.logger                           | verl_npu/trainer   | MetricSinkSpec |
| ROLLOUT_CORRECTIONS | algorithm.rollout_correction.{rollout_is, rollout_rs, loss_type} | verl_npu/algorithms/rollout_correction.py | RolloutCorrectionSpec |
| TOOLS               | class_name of a multi-turn tool config entry | verl_npu/tools | ToolSpec |

Policy losses and advantage estimators may also be a user's own function, `path/to/file.py:function`; a
tool, a user's own class (`path/to/file.py:Class` or `package.module.Class` in the tool config file, read by
`verl_npu.tool_registry`).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from typing import Any

from verl_npu.registry.core import Registry, RegistryError, Spec, is_file_entry, load_file  # noqa: F401


@dataclass(frozen=True)
class PolicyLossSpec(Spec):
    """A policy loss: fn(log_prob, old_log_prob, advantages, response_mask, ..., config=actor section) ->
    {"pg_loss": scalar tensor, more metrics}. `rollout_correction`: the loss also takes the
    `rollout_correction` settings (it weights and rejects by the rollout's log-probs itself: the loss of
    algorithm.rollout_correction.bypass_mode). `bypass_replaces`: with bypass_mode, the config replaces
    this loss by the rollout-correction one (whose ppo_clip loss_type computes it)."""

    rollout_correction: bool = False
    bypass_replaces: bool = False
    requires: tuple[str, ...] = ()  # actor settings it reads that have no default (a rule requires them)


@dataclass(frozen=True)
class EstimatorSpec(Spec):
    """An advantage estimator: fn(token_level_rewards, response_mask, group_ids, config=algorithm section,
    **inputs) -> (advantages, returns). `needs_group`: it compares the responses to one prompt
    (rollout.n >= 2); `inputs`: the batch columns it reads beyond the rewards (values: a critic is built;
    baseline_rewards: the trainer samples one greedy response per prompt for it)."""

    needs_group: bool = False
    inputs: tuple[str, ...] = ()
    score_components: bool = False  # it normalises the reward function's components (algorithm.gdpo_reward_keys)
    group_mean_std: bool = False  # (score - group mean) / group std (norm_adv_by_std_in_grpo): GRPO's own

    @property
    def needs_critic(self) -> bool:
        return "values" in self.inputs

    @property
    def needs_greedy_baseline(self) -> bool:
        return "baseline_rewards" in self.inputs


@dataclass(frozen=True)
class RolloutSpec(Spec):
    """A rollout engine (a `verl_npu.rollout.base.RolloutEngine` subclass).

    on_actor_module: it samples with the actor's own module (no weight copy to sync: its log-probs are the
        actor's, and the old-log-prob pass may be skipped); else it holds its own copy of the weights.
    tensor_parallel: one engine spans rollout.tensor_model_parallel_size ranks (else the actor's SP group).
    images_in_multiturn: tool turns may return images to it.
    memory: how the memory planner counts it: "actor_module" (the actor's activations only) or
        "kv_cache_pool" (it reserves rollout.gpu_memory_utilization of the device for weights and KV cache,
        released between steps with rollout.free_cache_engine).
    chunked_prefill: it honours rollout.enable_chunked_prefill.
    engine_arguments: it reads the rollout's engine arguments (gpu_memory_utilization, max_num_seqs,
        max_num_batched_tokens, enforce_eager, engine_kwargs.<name>); their rules check only such engines.
    package, install_hint: the separately installed package it needs, and how to install it.
    partial_rollout: as the rollout side of separate_async it steps its requests one engine step at a time, and a
        weight update interrupts them and resumes them on the new weights (`verl_npu.rollout.vllm_partial`)."""

    on_actor_module: bool = False
    tensor_parallel: bool = False
    images_in_multiturn: bool = False
    memory: str = "actor_module"
    chunked_prefill: bool = False
    engine_arguments: bool = False
    partial_rollout: bool = False
    package: str | None = None
    install_hint: str = ""

    def missing_package(self) -> str | None:
        """For an engine whose package is not installed in this Python: what is missing and how to install
        it; else None. Looks the package up without importing it (vLLM's import takes seconds)."""
        if self.package is None or importlib.util.find_spec(self.package) is not None:
            return None
        return f"the {self.package} package is not installed in this Python; {self.install_hint}"

    def group_size(self, cfg: Any) -> int:
        """Consecutive ranks that share one engine and receive the same prompts (`cfg`: the backend config)."""
        if self.tensor_parallel:
            return int(cfg.actor_rollout_ref.rollout.tensor_model_parallel_size)
        return int(cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size)


@dataclass(frozen=True)
class RoleSpec(Spec):
    """A worker role (a worker class built on every rank when the config needs it).

    needed_when: conditions, any of which builds it: "always", a backend key that is true
        ("critic.enable"), or "estimator.<property>" (a property of algorithm.adv_estimator's spec).
    methods: the worker methods the controller calls on it (the controller finds a method's role here).
    metrics: the prefix of the metrics it returns; trains: it updates its weights (its optimizer steps can
        be skipped: `<metrics>/skipped_updates`).
    checkpointed: it saves and restores a global_step_N/<role> folder (False: a frozen role).
    keep_key: the trainer key limiting how many of its checkpoints are kept.
    model_key: the backend key naming its model folder.
    scores: it scores responses (its rm_scores replace the rule reward)."""

    needed_when: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    metrics: str = ""
    trains: bool = False
    checkpointed: bool = True
    keep_key: str = ""
    model_key: str = ""
    scores: bool = False

    def needed(self, cfg: Any) -> bool:
        """Whether a run of `cfg` (the backend config: typed, an OmegaConf tree or a dict) builds this role."""
        for condition in self.needed_when:
            if condition == "always":
                return True
            if condition.startswith("estimator."):
                spec = estimator_spec(_at(cfg, "algorithm.adv_estimator"))
                if spec is not None and getattr(spec, condition.partition(".")[2]):
                    return True
            elif _at(cfg, condition):
                return True
        return False


@dataclass(frozen=True)
class RewardManagerSpec(Spec):
    """A reward manager: fn(scores, extras, valid_response_lengths, reward_kwargs, max_response_length) ->
    (scores, extras), applied to the rule reward. `overlong_penalty`: it reads reward_kwargs'
    overlong_buffer_cfg (DAPO's overlong shaping). `parallel_scoring`: the rule reward is computed by
    `verl_npu.rewards.prime.ParallelRewardScorer` (worker processes, per-response deadlines, a failed
    response scores 0) instead of row by row in the trainer."""

    overlong_penalty: bool = False
    parallel_scoring: bool = False


@dataclass(frozen=True)
class MetricSinkSpec(Spec):
    """A `trainer.logger` sink. `module`: the library it imports, `extra`: the pyproject extra that installs
    it ("" for the built-in sinks, which `verl_npu.trainer.tracking.Tracker` writes itself)."""

    module: str = ""
    extra: str = ""

    @property
    def tracker(self) -> bool:
        """A sink of its own library (a run in an experiment tracker), not one Tracker writes itself."""
        return bool(self.module)

    def missing_library(self) -> str | None:
        """For a tracker whose library is not installed: what to do; else None."""
        if not self.module or library_available(self.module):
            return None
        return (
            f"the {self.module} library is not installed: pip install 'verl-npu[{self.extra}]' "
            f"(or remove {self.name} from trainer.logger)"
        )


@dataclass(frozen=True)
class RolloutCorrectionSpec(Spec):
    """A mode of rollout correction (`algorithm.rollout_correction.*`): `option` is the key that names it.

    rollout_is (an importance-weight level): fn(log_ratio, mask) -> (statistic, raw weights); `per_token`: one
        weight per token (else one per response, on each of its tokens).
    rollout_rs (a rejection option): fn(values, mask, valid_token) -> (statistic [B, T], row values [B] or
        None) judges each token (`per_token`) or a whole response by its tokens' values of `statistic`, the
        divergence it rejects on ("k1": -d, "k2": d²/2, "k3": exp(d) - 1 - d, d the clamped log-ratio);
        k1 options take ratio bounds 'L_U'.
    loss_type (bypass mode's loss): fn(log_prob, old_log_prob, advantages, mask, weights, ...) -> the loss's
        entries."""

    option: str = ""
    per_token: bool = False
    statistic: str = ""

    @property
    def ratio_bounds(self) -> bool:
        """Its threshold may be ratio bounds 'L_U' (a k1 rejection option; one number U means L = 1/U)."""
        return self.statistic == "k1"


@dataclass(frozen=True)
class ToolSpec(Spec):
    """A built-in multi-turn tool (a `verl_npu.tools.base.BaseTool` subclass), named by `class_name` in a tool
    config file. function_name: the name its schema must have (None: any name, taken from the schema);
    verl_class_paths: verl's class paths (or a verl recipe's) that name it, so a tool config written for verl works
    unchanged; returns_images: its replies hold images (a vision-language model on an engine that takes them);
    config_check: "module:function" of a torch-free check of its `config:` (function(config, key) ->
    [(key, problem)]), run by `validate` before anything is imported; retrieval_server: it queries a
    retrieval server (config.retrieval_service_url), which `validate --check-paths` probes; demo_data:
    "module:function" writing the synthetic data of a multi-turn demo recipe on a tiny model that uses it
    (verl_npu/demo.py; empty: the model's default demo data)."""

    function_name: str | None = None
    verl_class_paths: tuple[str, ...] = ()
    returns_images: bool = False
    config_check: str = ""
    retrieval_server: bool = False
    demo_data: str = ""

    def config_problems(self, config: dict, key: str) -> list[tuple[str, str]]:
        """(key, problem) of an entry's `config:` (none when the tool checks it itself when built)."""
        if not self.config_check:
            return []
        module, _, function = self.config_check.partition(":")
        return getattr(importlib.import_module(module), function)(config, key)


#: verl's deprecated logger names and what they mean now: refused, naming the new one.
RENAMED_LOGGERS = (("tracking", "wandb"),)


def library_available(module: str) -> bool:
    """True when `module` can be imported (a module set to None in sys.modules counts as missing,
    as Python's import does)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


POLICY_LOSSES: Registry[PolicyLossSpec] = Registry(
    "POLICY_LOSSES",
    "policy loss",
    "actor_rollout_ref.actor.policy_loss.loss_mode",
    PolicyLossSpec,
    ("algorithms",),
    user_files=True,
)
ADVANTAGE_ESTIMATORS: Registry[EstimatorSpec] = Registry(
    "ADVANTAGE_ESTIMATORS",
    "advantage estimator",
    "algorithm.adv_estimator",
    EstimatorSpec,
    ("algorithms",),
    user_files=True,
)
ROLLOUT_ENGINES: Registry[RolloutSpec] = Registry(
    "ROLLOUT_ENGINES",
    "rollout engine",
    "actor_rollout_ref.rollout.name",
    RolloutSpec,
    ("rollout",),
    unsupported=("sglang", "trtllm"),
)
ROLES: Registry[RoleSpec] = Registry("ROLES", "worker role", "(roles)", RoleSpec, ("workers",))
REWARD_MANAGERS: Registry[RewardManagerSpec] = Registry(
    "REWARD_MANAGERS",
    "reward manager",
    "reward_model.reward_manager",
    RewardManagerSpec,
    ("rewards",),
    unsupported=("batch",),
)
METRIC_SINKS: Registry[MetricSinkSpec] = Registry(
    "METRIC_SINKS",
    "logger",
    "trainer.logger",
    MetricSinkSpec,
    ("trainer/tracking.py", "trainer"),
    unsupported=("clearml", "trackio", "vemlp_wandb", "rl_insight"),
)
ROLLOUT_CORRECTIONS: Registry[RolloutCorrectionSpec] = Registry(
    "ROLLOUT_CORRECTIONS",
    "rollout correction mode",
    "algorithm.rollout_correction",
    RolloutCorrectionSpec,
    ("algorithms/rollout_correction.py",),
)
TOOLS: Registry[ToolSpec] = Registry("TOOLS", "tool", "tools[].class_name", ToolSpec, ("tools/gsm8k.py", "tools"))


def registry_of(key: str) -> Registry:
    """The registry whose entries the config key `key` names (`algorithm.adv_estimator`, ...)."""
    return next(reg for reg in ALL if reg.key == key)


def image_engines() -> list[str]:
    """The engines that take images in multi-turn conversations."""
    return [spec.name for spec in ROLLOUT_ENGINES.specs.values() if spec.images_in_multiturn]


def bypass_loss() -> PolicyLossSpec:
    """The policy loss of rollout correction's bypass mode."""
    return next(spec for spec in POLICY_LOSSES.specs.values() if spec.rollout_correction)


def _at(tree: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        tree = tree.get(key) if hasattr(tree, "get") else getattr(tree, key, None)
    return tree


def estimator_spec(name: Any) -> EstimatorSpec | None:
    """The spec of a built-in estimator or of a readable user's file entry; None for anything else (for
    questions asked before the config is validated)."""
    found = ADVANTAGE_ESTIMATORS.find(name)
    if (
        found is None
        and ADVANTAGE_ESTIMATORS.user_files_allowed(str(name))
        and ADVANTAGE_ESTIMATORS.file_problem(str(name)) is None
    ):
        found = ADVANTAGE_ESTIMATORS.file_spec(str(name))
    return found


def roles_needed(cfg: Any) -> list[RoleSpec]:
    """The roles a run of `cfg` (the backend config) builds, in declaration order (the actor first)."""
    return [spec for spec in ROLES.specs.values() if spec.needed(cfg)]


def role_with_method(method: str) -> str:
    """The role whose workers serve `method` (declared in its spec's `methods`)."""
    for spec in ROLES.specs.values():
        if method in spec.methods:
            return spec.name
    raise RegistryError(f"no worker role declares the method {method!r}")


def correction_modes(option: str) -> dict[str, RolloutCorrectionSpec]:
    """name -> spec of the rollout-correction modes that `option` (rollout_is, rollout_rs, loss_type) names."""
    return {name: spec for name, spec in ROLLOUT_CORRECTIONS.specs.items() if spec.option == option}


def correction_mode(option: str, name: Any) -> RolloutCorrectionSpec:
    """The spec of the mode `name` of `option`; ValueError listing that option's modes."""
    found = correction_modes(option).get(str(name))
    if found is None:
        raise ValueError(f"{option} must be one of {', '.join(correction_modes(option))}, got {name!r}")
    return found


ALL = (
    POLICY_LOSSES,
    ADVANTAGE_ESTIMATORS,
    ROLLOUT_ENGINES,
    ROLES,
    REWARD_MANAGERS,
    METRIC_SINKS,
    ROLLOUT_CORRECTIONS,
    TOOLS,
)
