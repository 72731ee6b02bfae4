"""`vllm` rollout: a vLLM engine (vllm on CUDA, vllm-ascend on NPU, vllm-cpu on CPU) samples responses.

Colocated hybrid engine: every worker process holds its FSDP2 actor shard and its part of a
vLLM engine on the same device. The engine runs in the worker's own process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`); with several workers it joins the trainer's
torch.distributed group through vLLM's external launcher, so `tensor_model_parallel_size`
consecutive ranks form one engine (rollout data-parallel size = world / TP). The worker group
sends every rank of a TP group the same prompts and keeps one output per group.

Weights never touch the disk: after every actor update the worker hands each rank's engine an
iterator of the full tensors (`update_weights`), which gathers them from the FSDP2 shards one bucket
at a time (`rollout.update_weights_bucket_megabytes`) as the engine reads it; the engine casts them
to the rollout dtype and streams them into its engine worker's in-place reload, which keeps this
TP rank's slice. Sampling is seeded per prompt (the run seed and the prompt's uid), so a
prompt's samples do not depend on which rank or TP group generates it. (vllm-cpu cannot combine
those seeds with chunked prefill: after a step that prefilled part of a prompt it rewinds the
prompt's generator by an offset, which CPU generators lack. On CPU the config layer derives
`enable_chunked_prefill=false`, which gives the same samples; see verl_npu/config/derive.py and
`DeviceInfo.vllm_chunked_prefill_with_seeds`.) vLLM is imported only
when the engine is built; argument translation, sampling and request/response helpers
(verl_npu/rollout/requests.py) are plain functions, testable without vLLM. With `multi_turn.enable` the
agent loop (verl_npu/rollout/agent_loop.py) samples its model turns here (verl_npu/rollout/vllm_turns.py),
with prefix caching on.

Engine-argument translation (`translate_engine_kwargs`): recipes carry vLLM arguments in
`engine_kwargs.vllm` (ModelArts, merged into `actor_rollout_ref.rollout.engine_kwargs.vllm`).
Some spellings changed between vLLM versions; an old spelling is rewritten when the installed
vLLM's `EngineArgs` has no field of that name (or, when its fields are unknown, when the vLLM
version is at least `since`):

| recipe key                          | value | becomes (newer vLLM)      | since  |
|-------------------------------------|-------|---------------------------|--------|
| `disable_mm_preprocessor_cache`     | true  | `mm_processor_cache_gb: 0`| 0.13   |
| `disable_mm_preprocessor_cache`     | false | dropped (cache on by default) | 0.13 |
| `swap_space`                        | any   | dropped (no such field)   | field check only |

(`swap_space` sized the CPU swap of preempted sequences; current vLLM has no such argument.)

For a text-only model the multimodal-only keys (`disable_mm_preprocessor_cache`,
`mm_processor_cache_gb`, `limit_mm_per_prompt`, other `mm_*`) are dropped: older vLLM rejects
them for text models ("only supported for multimodal models"), and they do nothing there.
Keys with value null are dropped. A key that the installed vLLM does not know and that has no
translation is a `UserError`.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from verl_npu.batch import Batch
from verl_npu.config.typed import ROOT, plain, section
from verl_npu.errors import UserError
from verl_npu.models.forward import vision_marker_ids
from verl_npu.registry import ROLLOUT_ENGINES
from verl_npu.rollout.base import ROLLOUT_DTYPES, RolloutEngine, SamplingParams, finish_rollout, stop_and_pad_ids
from verl_npu.rollout.requests import (
    prompt_seed,
    request_outputs_to_samples,
    rows_digest,
    samples_to_tensors,
    sampling_kwargs,
    token_prompts,
)

log = logging.getLogger("verl_npu")

ENGINE_KWARGS_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm"
ROLLOUT_KEY = "actor_rollout_ref.rollout"
DROP = object()  # a translation result meaning "leave this argument out"


# ---------------------------------------------------------------------------- engine arguments
@dataclass(frozen=True)
class KwargTranslation:
    """One renamed/removed vLLM engine argument: `convert(value)` gives the new value or DROP."""

    old_key: str
    new_key: str | None
    convert: Callable[[Any], Any]
    since: tuple[int, int] | None  # first vLLM (major, minor) without old_key; None: decide by field check only
    why: str


ENGINE_KWARG_TRANSLATIONS: tuple[KwargTranslation, ...] = (
    KwargTranslation(
        "disable_mm_preprocessor_cache",
        "mm_processor_cache_gb",
        lambda v: 0 if bool(v) else DROP,
        (0, 13),
        "newer vLLM turns the multimodal processor cache off with mm_processor_cache_gb=0",
    ),
    KwargTranslation(
        "swap_space", None, lambda v: DROP, None, "this vLLM has no CPU swap space for preempted sequences"
    ),
)

MULTIMODAL_ONLY_KEYS = ("disable_mm_preprocessor_cache", "limit_mm_per_prompt")


def parse_version(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a version string such as '0.11.0rc2' or '0.32.0+cpu'; None if unparsable."""
    if not version:
        return None
    parts = str(version).split(".")
    try:
        major = int(parts[0])
        minor = int("".join(ch for ch in parts[1].split("+")[0] if ch.isdigit()) or 0) if len(parts) > 1 else 0
    except ValueError:
        return None
    return major, minor


def _is_multimodal_only(key: str) -> bool:
    return key in MULTIMODAL_ONLY_KEYS or key.startswith("mm_")


def translate_engine_kwargs(
    kwargs: Mapping[str, Any] | None,
    *,
    vllm_version: str | None,
    accepted_keys: Iterable[str] | None = None,
    multimodal: bool = True,
    source: str = ENGINE_KWARGS_KEY,
) -> tuple[dict[str, Any], list[str]]:
    """The recipe's vLLM engine arguments in the installed vLLM's spelling, plus one note per change.

    `accepted_keys`: the field names of the installed `vllm.EngineArgs` (None: unknown, then the
    translation table's `since` versions decide). `multimodal`: False drops multimodal-only keys.

    Raises:
        UserError: a key the installed vLLM does not accept and that has no translation (only
            checked when `accepted_keys` is given); the message names `source.KEY` and close matches.
    """
    accepted = set(accepted_keys) if accepted_keys is not None else None
    version = parse_version(vllm_version)
    rules = {t.old_key: t for t in ENGINE_KWARG_TRANSLATIONS}
    out: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in dict(kwargs or {}).items():
        if value is None:
            continue
        if not multimodal and _is_multimodal_only(key):
            notes.append(f"{source}.{key} dropped: the model is text-only")
            continue
        rule = rules.get(key)
        if rule is not None:
            if accepted is not None:
                rejected = key not in accepted
            else:
                rejected = rule.since is not None and version is not None and version >= rule.since
            if rejected:
                new_value = rule.convert(value)
                if new_value is DROP or rule.new_key is None:
                    notes.append(f"{source}.{key}={value!r} dropped: {rule.why}")
                else:
                    notes.append(f"{source}.{key}={value!r} -> {rule.new_key}={new_value!r}: {rule.why}")
                    out.setdefault(rule.new_key, new_value)  # an explicit new-style key wins
                continue
        if accepted is not None and key not in accepted:
            close = difflib.get_close_matches(key, sorted(accepted), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UserError(
                f"{source}.{key}: vLLM {vllm_version or '?'} has no engine argument {key!r}{hint}; "
                f"remove it or use the installed vLLM's name for it (see `vllm serve --help`)"
            )
        out[key] = value
    return out, notes


def engine_args_from_config(
    rollout_cfg: Any,
    *,
    model_path: str,
    engine_kwargs: Mapping[str, Any] | None = None,
    seed: int = 0,
    trust_remote_code: bool = False,
    sleep_mode_available: bool = True,
) -> dict[str, Any]:
    """Keyword arguments for `vllm.LLM(...)` from the `actor_rollout_ref.rollout` section (typed; a
    mapping is read as that section, its missing keys at the schema's defaults).

    `max_model_len` is the config's value or prompt_length + response_length (both null: a
    UserError). `load_format` `dummy_dtensor` / `dummy_hf` (verl names) become vLLM's `dummy`
    (random weights, replaced by the first `update_weights`). `free_cache_engine` turns on vLLM
    sleep mode where the platform has it. `engine_kwargs` (already translated) are applied last
    and win over the config.
    """
    ro = section(ROLLOUT_KEY, rollout_cfg)
    # prompt_length / response_length / max_model_len are null until the config layer derives them
    prompt_len, response_len = ro.prompt_length or 0, ro.response_length or 0
    max_model_len = ro.max_model_len
    if max_model_len is None:
        if prompt_len <= 0 or response_len <= 0:
            raise UserError(
                f"{ROLLOUT_KEY}.max_model_len is unset and prompt_length/response_length are not known; "
                f"set data.max_prompt_length and data.max_response_length (or {ROLLOUT_KEY}.max_model_len)"
            )
        max_model_len = prompt_len + response_len
    load_format = "dummy" if ro.load_format.startswith("dummy") else ro.load_format
    args: dict[str, Any] = dict(
        model=model_path,
        tokenizer=model_path,
        trust_remote_code=bool(trust_remote_code),
        dtype=ro.dtype,
        tensor_parallel_size=ro.tensor_model_parallel_size,
        gpu_memory_utilization=ro.gpu_memory_utilization,
        max_model_len=max_model_len,
        max_num_batched_tokens=ro.max_num_batched_tokens,
        max_num_seqs=ro.max_num_seqs,
        enable_chunked_prefill=ro.enable_chunked_prefill,
        enforce_eager=ro.enforce_eager,
        load_format=load_format,
        disable_log_stats=ro.disable_log_stats,
        enable_sleep_mode=ro.free_cache_engine and sleep_mode_available,
        seed=int(seed),
    )
    args.update(engine_kwargs or {})  # validation checked the scheduler rules on these final values
    return args


# ---------------------------------------------------------------------------- the engine
def import_vllm():
    """The `vllm` module, or a UserError saying how to install it."""
    try:
        import vllm  # noqa: WPS433 (optional dependency)
    except ImportError as err:
        raise UserError(f"{ROLLOUT_KEY}.name=vllm but vLLM cannot be imported ({err}); {INSTALL_HINT}") from err
    return vllm


def _engine_arg_names(vllm) -> set[str] | None:
    import dataclasses

    engine_args = getattr(vllm, "EngineArgs", None)
    if engine_args is None or not dataclasses.is_dataclass(engine_args):
        return None
    return {f.name for f in dataclasses.fields(engine_args)}


def _sleep_mode_available() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_sleep_mode_available())
    except Exception:  # noqa: BLE001 (old vLLM without the query: assume no sleep mode)
        return False


def _on_cpu_platform() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # noqa: BLE001
        return False


def _mapped_files() -> set[str]:
    """Paths that some live process on this machine has mapped (from /proc/*/maps)."""
    from pathlib import Path

    used: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended or is not ours to read
            continue
        used.update(line.split(None, 5)[-1].strip() for line in text.splitlines() if line.count(" ") >= 5)
    return used


def remove_stale_cpu_shm(shm_dir: str = "/dev/shm") -> list[str]:
    """Delete vLLM CPU tensor-parallel shared-memory files that no live process maps; returns them.

    vLLM's CPU TP group names these files from the ranks only (`...-cpushm_<rank>`), never deletes
    them when a worker process ends, and refuses to start when one exists (`create shm in
    SHMManager failed. errno: 17`): without this, the second TP run on a machine would fail."""
    from pathlib import Path

    found = sorted(str(p) for p in Path(shm_dir).glob("*cpushm*"))
    if not found:
        return []
    busy = _mapped_files()
    removed = []
    for path in found:
        if path in busy:
            continue
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def engine_worker(llm: Any) -> Any:
    """The vLLM worker object of this process's part of the engine (the engine runs in-process:
    `VLLM_ENABLE_V1_MULTIPROCESSING=0`, uni-process or external-launcher executor).

    Raises:
        RuntimeError: the engine's workers live in other processes (weights cannot be streamed).
    """
    executor = getattr(getattr(llm, "llm_engine", None), "model_executor", None)
    worker = getattr(executor, "driver_worker", None)
    if worker is None:
        raise RuntimeError(
            "the vLLM engine's worker is not in this process, so weights cannot be streamed into it; "
            "verl-npu builds the engine with VLLM_ENABLE_V1_MULTIPROCESSING=0 (do not override it)"
        )
    return getattr(worker, "worker", worker)  # WorkerWrapperBase holds the platform's worker


def load_weights_in_place(worker: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Stream (Hugging Face name, whole tensor) pairs into the engine worker's model; each TP rank's
    loader keeps its own shard. Returns the method used: 'reload_weights' (vLLM's in-place reload,
    which re-runs the post-load processing) or 'load_weights' (the model's own loader, for
    platform workers without reload_weights)."""
    if hasattr(worker, "reload_weights"):
        worker.reload_weights(weights_iterator=weights)
        return "reload_weights"
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    model.load_weights(weights)
    return "load_weights"


class _Counting:
    """Wraps the worker's gathering iterator: casts floating tensors to `dtype` (None: as they
    are), counts what the engine took, and drains the rest afterwards (gathering is a collective:
    every rank must walk the whole state dict even when an engine stops early)."""

    def __init__(self, items: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None):
        self._it = iter(items)
        self.dtype = dtype
        self.taken = 0

    def __iter__(self):
        for name, tensor in self._it:
            self.taken += 1
            yield name, tensor.to(self.dtype) if self.dtype is not None and tensor.is_floating_point() else tensor

    def drain(self) -> None:
        for _ in self._it:
            pass


#: vLLM's CPU backend needs an explicit KV-cache size; used when neither engine_kwargs nor
#: VLLM_CPU_KVCACHE_SPACE gives one.
CPU_KV_CACHE_BYTES = 256 << 20


INSTALL_HINT = (
    "the vllm rollout needs vLLM: on CUDA `pip install 'verl-npu[vllm]'`; on Ascend NPUs install vllm "
    "(VLLM_TARGET_DEVICE=empty) and the matching vllm-ascend (see README, 'NPU install'); or sample with "
    "transformers instead: actor_rollout_ref.rollout.name=hf"
)


@ROLLOUT_ENGINES.register(
    "vllm",
    on_actor_module=False,
    tensor_parallel=True,
    images_in_multiturn=False,
    memory="kv_cache_pool",
    chunked_prefill=True,
    engine_arguments=True,
    partial_rollout=True,
    package="vllm",
    install_hint=INSTALL_HINT,
    doc="vLLM (vllm on CUDA, vllm-ascend on NPU, vllm-cpu on CPU), colocated with the actor",
)
class VLLMRollout(RolloutEngine):
    """This rank's part of a vLLM engine, colocated with the actor shard in the same process.

    `cfg` is the typed backend_config section (a mapping is read as that section); `engine_kwargs`
    (None: `actor_rollout_ref.rollout.engine_kwargs.vllm`, which already holds the top-level
    `engine_kwargs.vllm`) are extra `vllm.LLM` arguments; `model_path` (None: the resolved
    `actor_rollout_ref.model.path`) is what the engine loads first. With several workers the
    engine uses vLLM's external launcher over the trainer's torch.distributed group: ranks
    [g*TP, (g+1)*TP) form engine g.

    Raises:
        UserError: vLLM is not installed, an engine argument is unknown / inconsistent, or the
            engine fails to start (the cause's text, this rank, the keys to change).
    """

    @classmethod
    def from_config(
        cls, module, tokenizer, processor, cfg, *, rank: int = 0, world_size: int = 1, device=None, weights=None
    ) -> VLLMRollout:
        cfg = section(ROOT, cfg)
        engine = cls(
            module, tokenizer, processor, cfg, rank=rank, world_size=world_size, device=device, weights=weights
        )
        rollout_cfg = cfg.actor_rollout_ref.rollout
        custom = rollout_cfg.agent.agent_loop_config_path  # custom agent loops (custom_loops.py)
        if rollout_cfg.multi_turn.enable or custom:  # multi-turn with tools: agent_loop.py, turns from vllm_turns.py
            from verl_npu.rollout.agent_loop import build_agent_loop
            from verl_npu.rollout.vllm_turns import VLLMTurns

            engine.agent_loop = build_agent_loop(
                engine,
                rollout_cfg.multi_turn,
                rollout_cfg.agent.default_agent_loop,
                turns=VLLMTurns(engine, rollout_cfg.multi_turn.tp_round_timeout_s),
                custom=(cfg, custom) if custom else None,
            )
        return engine

    def __init__(
        self,
        module: torch.nn.Module,
        tokenizer,
        processor,
        cfg,
        engine_kwargs: Mapping[str, Any] | None = None,
        *,
        model_path: str | None = None,
        seed: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        device=None,
        weights: Iterable[tuple[str, torch.Tensor]] | None = None,
    ):
        vllm = import_vllm()
        from verl_npu.models.loading import is_vision_language, resolve_model_path

        cfg = section(ROOT, cfg)
        rollout_cfg = cfg.actor_rollout_ref.rollout
        model_cfg = cfg.actor_rollout_ref.model
        self.rank = rank
        self.device = device  # the worker's DeviceInfo (memory reports; None: none)
        self.tokenizer = tokenizer
        self.processor = processor
        self.free_cache_engine = rollout_cfg.free_cache_engine
        self.multi_stage_wake_up = rollout_cfg.multi_stage_wake_up
        self.dtype = ROLLOUT_DTYPES.get(rollout_cfg.dtype)
        # one seed for every rank: each prompt's samples come from its own seed (prompt_seed)
        self.seed = int(seed if seed is not None else cfg.data.seed)
        config = getattr(module, "config", None)
        self.multimodal = processor is not None and config is not None and is_vision_language(config)
        self.image_token_id = getattr(config, "image_token_id", None) if config is not None else None
        self.banned_ids = vision_marker_ids(config) if config is not None else []
        self.eos_ids, self.pad_id = stop_and_pad_ids(module, tokenizer)

        if engine_kwargs is None:
            engine_kwargs = plain(rollout_cfg.engine_kwargs.vllm)  # vLLM may change nested dicts it is given
        accepted = _engine_arg_names(vllm)
        translated, notes = translate_engine_kwargs(
            engine_kwargs,
            vllm_version=getattr(vllm, "__version__", None),
            accepted_keys=accepted,
            multimodal=self.multimodal,
        )
        for note in notes:
            log.info("vllm rollout: %s", note)
        # the actor's old log-probs are of the temperature-scaled distribution: ask vLLM for the
        # same (its default is the raw distribution) so the probs-diff check compares like with like
        if accepted is None or "logprobs_mode" in accepted:
            translated.setdefault("logprobs_mode", "processed_logprobs")
        if rollout_cfg.multi_turn.enable:
            # the agent loop resends each trajectory's earlier turns every round: their KV blocks are reused
            translated.setdefault("enable_prefix_caching", True)
        if _on_cpu_platform():
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # do not pin the trainer's cores
            if "kv_cache_memory_bytes" not in translated and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                translated["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
                log.info(
                    "vllm rollout: CPU KV cache sized %d MiB (set engine_kwargs.vllm.kv_cache_memory_bytes "
                    "to change it)",
                    CPU_KV_CACHE_BYTES >> 20,
                )
        self.sleep_mode = bool(self.free_cache_engine and _sleep_mode_available())
        args = engine_args_from_config(
            rollout_cfg,
            model_path=model_path or resolve_model_path(model_cfg.path),
            engine_kwargs=translated,
            seed=self.seed,
            trust_remote_code=model_cfg.trust_remote_code,
            sleep_mode_available=self.sleep_mode,
        )
        if world_size > 1:
            # the engine joins the trainer's process group: TP groups of consecutive ranks
            args.setdefault("distributed_executor_backend", "external_launcher")
            if _on_cpu_platform() and int(args.get("tensor_parallel_size", 1)) > 1:
                stale = remove_stale_cpu_shm()
                if stale:
                    log.info("vllm rollout: removed shared-memory files an earlier CPU TP engine left: %s", stale)
                import torch.distributed as dist

                if dist.is_initialized():
                    dist.barrier()  # every rank cleaned up before any engine creates its files
        # the engine core must live in this process: weights stream into its worker object
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.sleep_mode = bool(args.get("enable_sleep_mode"))
        self._vllm = vllm
        self.engine_args = args
        log.info("vllm rollout (rank %d): vLLM %s, engine args %s", rank, getattr(vllm, "__version__", "?"), args)
        try:
            self.llm = vllm.LLM(**args)
        except Exception as exc:  # noqa: BLE001 - one clean message instead of a wall of engine traceback
            raise UserError(engine_start_error(exc, rank, args)) from None
        self._asleep = False
        self.weight_sync_method: str | None = None
        self.last_sync: dict[str, float] = {}
        if args["load_format"] == "dummy":  # random init: the actor's weights must go in before sampling
            if weights is None:
                raise ValueError("load_format=dummy starts the engine with random weights: pass the actor's weights")
            self.update_weights(weights)
        if self.free_cache_engine:
            self.sleep()

    # ---- sampling -------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        if getattr(self, "agent_loop", None) is not None:
            return self._generate_multi_turn(prompts, params)
        self.wake_up()
        try:
            inputs = token_prompts(prompts["raw_prompt_ids"], prompts.get("multi_modal_data"), self.image_token_id)
            kwargs, repeat = sampling_kwargs(params, self.eos_ids, self.banned_ids)
            if params.greedy:
                sampling = self._vllm.SamplingParams(**kwargs)
            else:  # per-prompt seeds: samples do not depend on the rank or on the batch's other prompts
                uids = prompts.get("uid") or [str(i) for i in range(len(inputs))]
                sampling = [self._vllm.SamplingParams(**kwargs, seed=prompt_seed(self.seed, uid)) for uid in uids]
            outputs = self.llm.generate(inputs, sampling_params=sampling, use_tqdm=False)
            self.last_prompt_tokens = sum(len(row["prompt_token_ids"]) for row in inputs) * int(kwargs["n"])
        finally:
            if self.free_cache_engine:
                self.sleep()
        samples = request_outputs_to_samples(outputs, repeat)
        responses, log_probs = samples_to_tensors(samples, params.max_new_tokens, self.pad_id)
        # a response that stopped without an EOS token in its ids (a stop rule that strips the
        # token) must not count its padding as generated
        lengths = torch.tensor([min(len(ids), params.max_new_tokens) for ids, _ in samples], dtype=torch.long)
        rows = finish_rollout(prompts, responses, self.eos_ids, self.pad_id, params.n, lengths=lengths)
        if log_probs is not None:
            rows.set("rollout_log_probs", log_probs * rows["response_mask"].to(log_probs.dtype))
        self.last_rollout_digest = rows_digest(rows)
        return rows

    def _generate_multi_turn(self, prompts: Batch, params: SamplingParams) -> Batch:
        """The agent loop (`verl_npu.rollout.agent_loop`) with its model turns from this engine
        (`VLLMTurns`); awake for the whole batch, so the prefix cache keeps the earlier turns."""
        turns = self.agent_loop.turns
        turns.reset_stats()
        self.wake_up()
        try:
            rows = self.agent_loop.run(prompts, params, record_log_probs=True)
        finally:
            if self.free_cache_engine:
                self.sleep()
        self.last_prompt_tokens = turns.stats["prompt_tokens"]
        self.last_cached_tokens = turns.stats["cached_tokens"]
        self.last_rollout_digest = rows_digest(rows)
        return rows

    # ---- weights and memory -----------------------------------------------------------------
    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Stream the actor's weights, (Hugging Face name, whole tensor) pairs, into this rank's part
        of the engine, in memory.

        Collective (every rank calls it): the worker's iterator gathers each tensor from the FSDP2
        shards as it is read (`TrainingEngine.rollout_weights`: `update_weights_bucket_megabytes`
        at a time, a LoRA actor's adapters merged); each is cast to the rollout dtype and handed to
        the engine's loader, which keeps this TP rank's slice. With sleep mode,
        `multi_stage_wake_up` brings back the weights first and the KV cache only after the sync
        (the sync's peak memory excludes the KV cache); otherwise everything wakes first."""
        import time

        start = time.perf_counter()
        self._log_memory("Before state_dict() in sharding manager memory")
        if self._asleep:
            self._wake(["weights"] if self.multi_stage_wake_up else None)
        weights = _Counting(weights, self.dtype)
        try:
            self.weight_sync_method = load_weights_in_place(engine_worker(self.llm), weights)
        finally:
            weights.drain()
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self._log_memory("After sync model weights in sharding manager")
        if self._asleep:
            if self.multi_stage_wake_up:
                self._wake(["kv_cache"])
            self._asleep = False
        self.last_sync = {"seconds": time.perf_counter() - start, "tensors": float(weights.taken)}

    def engine_stats(self) -> dict[str, Any]:
        """The engine's own scheduler settings (as vLLM resolved them), the prompt tokens the last
        `generate` sent (prompts x n; multi-turn: every round's requests) and, multi-turn, how many of them
        the prefix cache served, and a digest of the rows it returned (`rows_digest`), for tests and
        diagnostics."""
        sched = self.llm.llm_engine.vllm_config.scheduler_config
        return {
            "enable_chunked_prefill": bool(sched.enable_chunked_prefill),
            "enable_prefix_caching": bool(self.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching),
            "max_num_batched_tokens": int(sched.max_num_batched_tokens),
            "max_num_seqs": int(sched.max_num_seqs),
            "last_prompt_tokens": int(getattr(self, "last_prompt_tokens", 0)),
            "last_cached_tokens": int(getattr(self, "last_cached_tokens", 0)),
            "last_rollout_digest": getattr(self, "last_rollout_digest", ""),
        }

    def weights_digest(self) -> dict[str, tuple[float, float]]:
        """(sum, sum of squares) of every engine parameter on this rank, in float64: ranks that
        hold the same engine shard must agree (tests)."""
        worker = engine_worker(self.llm)
        runner = worker.model_runner
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        out = {}
        for name, param in model.named_parameters():
            t = param.detach().double()
            out[name] = (float(t.sum()), float((t * t).sum()))
        return out

    def _log_memory(self, phase: str) -> None:
        if self.device is None:
            return
        try:
            mem = self.device.memory()
        except Exception:  # noqa: BLE001 (memory reporting must never break a run)
            return
        # verl's phase names, so logs of the two trainers can be read side by side
        log.debug("rank %d: %s, %s", self.rank, phase, mem)

    def _wake(self, tags: list[str] | None) -> None:
        if tags is None:
            self.llm.wake_up()
        else:
            self.llm.wake_up(tags=tags)

    def sleep(self) -> None:
        """Free the KV cache and offload weights (vLLM sleep level 1; the only level vllm-ascend
        has) where the platform supports sleep mode; otherwise nothing."""
        if self.sleep_mode and not self._asleep:
            self._log_memory("Before vllm offload in sharding manager")
            self.llm.sleep(level=1)
            self._asleep = True
            self._log_memory("After vllm offload in sharding manager")

    def wake_up(self) -> None:
        if self.sleep_mode and self._asleep:
            self._wake(None)
            self._asleep = False
            self.llm.reset_prefix_cache()  # cached blocks did not survive the sleep
            self._log_memory("After vllm wake up in sharding manager")


#: engine-start failures we recognise: (text in the cause, the keys to look at).
_START_HINTS: tuple[tuple[str, str], ...] = (
    ("max_num_batched_tokens", "actor_rollout_ref.rollout.max_num_batched_tokens / max_num_seqs / max_model_len"),
    ("max_model_len", "actor_rollout_ref.rollout.max_model_len (or data.max_prompt_length + max_response_length)"),
    ("memory", "actor_rollout_ref.rollout.gpu_memory_utilization (or engine_kwargs.vllm.kv_cache_memory_bytes)"),
    ("KV cache", "actor_rollout_ref.rollout.gpu_memory_utilization, max_model_len or max_num_seqs"),
    ("tensor_parallel", "actor_rollout_ref.rollout.tensor_model_parallel_size"),
    ("attention heads", "actor_rollout_ref.rollout.tensor_model_parallel_size (must divide the model's heads)"),
    ("head size", "the model: vLLM's CPU attention needs a head size of at least 32"),
)


def engine_start_error(exc: BaseException, rank: int, args: Mapping[str, Any]) -> str:
    """One plain message for an engine that failed to start: its cause's own text (the last
    line of a validation error usually says it all), the rank, and the keys to change."""
    text = str(exc).strip() or type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    cause = " ".join(lines[:6])
    keys = [hint for needle, hint in _START_HINTS if needle.lower() in text.lower()]
    where = (
        "; look at " + "; ".join(keys)
        if keys
        else ("; its arguments come from actor_rollout_ref.rollout.* and engine_kwargs.vllm")
    )
    shown = {
        k: args[k]
        for k in (
            "tensor_parallel_size",
            "max_model_len",
            "max_num_batched_tokens",
            "max_num_seqs",
            "gpu_memory_utilization",
            "dtype",
        )
        if k in args
    }
    return f"worker rank {rank}: the vLLM engine did not start ({type(exc).__name__}: {cause}){where}. Engine arguments: {shown}"
