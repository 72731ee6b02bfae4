"""SFT (issue 38): verl 0.9.1's SFT keys, the assistant-token mask, bad data refused before training, checkpoints
in verl's SFT layout with exact resume, 1 and 2 workers equal, and an RL run started from an SFT run's output.
Real runs of the tiny text model on synthetic tool-call transcripts (a few steps each)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from verl_npu.config.sft import Node, load_sft_recipe
from verl_npu.config.sft_schema import KEYS, LEGACY
from verl_npu.data.sft_dataset import SFTDataset
from verl_npu.data.sft_synthetic import prepare_synthetic, transcript
from verl_npu.errors import ConfigErrors, UserError

REPO = Path(__file__).resolve().parents[2]
BC = "backend_config."


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sft_data")
    prepare_synthetic(folder, 8, 4, seed=3)
    return folder


def write_recipe(folder: Path, model_path, data_dir: Path, **backend) -> Path:
    """An SFT recipe in `folder` training `model_path` on `data_dir`'s train/test.parquet; `backend` {section: {key: value}}
    replaces or adds keys."""
    tree = {
        "data": {
            "train_files": str(data_dir / "train.parquet"),
            "val_files": str(data_dir / "test.parquet"),
            "max_length": 512,
            "train_batch_size": 4,
            "micro_batch_size_per_gpu": 2,
            "use_dynamic_bsz": False,
        },
        "model": {"path": str(model_path), "enable_gradient_checkpointing": False},
        "optim": {"lr": 2e-3, "weight_decay": 0.0},
        "trainer": {"total_training_steps": 2, "logger": ["console"], "seed": 5},
    }
    for section, values in backend.items():
        tree.setdefault(section, {}).update(values)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sft.yaml"
    path.write_text(yaml.safe_dump({"af_output_dir": str(folder / "out"), "backend_config": tree}))
    return path


# ---- config ------------------------------------------------------------------------------------------------------
def test_verl_keys_defaults_and_older_spellings_mapped_with_a_warning(tmp_path, tiny_lm_path, sft_data):
    recipe = write_recipe(tmp_path, tiny_lm_path, sft_data)
    rc = load_sft_recipe(
        recipe,
        [
            "optim.lr=1e-4",
            "data.multiturn.messages_key=messages",
            "model.fsdp_config.model_dtype=fp32",
            "ulysses_sequence_parallel_size=1",
            "use_remove_padding=false",
            "data.multiturn.enable=true",
        ],
    )
    cfg = rc.typed
    assert cfg.optim.lr == 1e-4 and cfg.data.messages_key == "messages" and cfg.model.use_remove_padding is False
    assert cfg.data.truncation == "error" and cfg.checkpoint.save_contents == ["model", "optimizer", "extra"]
    assert cfg.trainer.default_local_dir == f"{tmp_path / 'out'}/checkpoints"
    text = "\n".join(rc.warnings)
    for old in (
        "data.multiturn.messages_key",
        "model.fsdp_config.model_dtype",
        "ulysses_sequence_parallel_size",
        "use_remove_padding",
    ):
        assert f"{old} is verl's older fsdp_sft_trainer spelling of {LEGACY[old]}" in text
    assert "data.multiturn.enable=True" in text


def test_every_problem_is_reported_at_once_by_name(tmp_path, tiny_lm_path, sft_data):
    recipe = write_recipe(tmp_path, tiny_lm_path, sft_data)
    with pytest.raises(ConfigErrors) as info:
        load_sft_recipe(
            recipe,
            [
                "data.prompt_key=question",
                "data.custom_cls.path=my.py",
                "engine.ulysses_sequence_parallel_size=2",
                "engine.strategy=megatron",
                "data.max_lenght=9",
                "data.truncation=cut",
                "optim.lr_scheduler=wsd",
                "checkpoint.save_contents=[model,weights]",
                "data.val_files='EDIT_ME: /path/to/val.parquet'",
            ],
        )
    problems = {p.key.removeprefix(BC): f"{p.message} {p.fix}" for p in info.value.problems}
    assert (
        "convert" not in problems.get("data.max_lenght", "")
        and "did you mean data.max_length" in problems["data.max_lenght"]
    )
    assert "messages column" in problems["data.prompt_key"]
    assert "messages column" in problems["data.custom_cls.path"]
    assert "Ulysses SFT is not built" in problems["engine.ulysses_sequence_parallel_size"]
    assert "megatron" in problems["engine.strategy"]
    assert "cut" in problems["data.truncation"] and "wsd" in problems["optim.lr_scheduler"]
    assert "weights" in problems["checkpoint.save_contents"]
    assert "placeholder" in problems["data.val_files"]  # an optional key: a placeholder is still not a path


def test_every_key_is_documented_and_read_by_code():
    """Every key has its meaning; every key that is neither a no-op, nor refused off its default, nor limited to one
    value (checked by the loader) is read by the SFT code (its name as an attribute in the modules that read it)."""
    readers = [
        "verl_npu/sft/worker.py",
        "verl_npu/sft/loop.py",
        "verl_npu/data/sft_dataset.py",
        "verl_npu/config/sft.py",
        "verl_npu/models/lora.py",
        "verl_npu/workers/parallel.py",
        "verl_npu/workers/actor_ckpt.py",
        "verl_npu/demo.py",
    ]
    source = "\n".join((REPO / r).read_text() for r in readers)
    unread = []
    for key in KEYS.values():
        assert len(key.doc) > 10, key.path
        if key.noop or key.off_only or len(key.choices) == 1 or key.path == "af_output_dir":
            continue
        leaf = key.path.rsplit(".", 1)[1]
        if not re.search(rf"\.{leaf}\b|\[\"{leaf}\"\]", source):
            unread.append(key.short)
    assert not unread, f"keys no code reads: {unread}"


# ---- data: the mask and bad rows ------------------------------------------------------------------------------------
def test_the_loss_mask_is_the_assistant_tokens_token_by_token(tiny_lm_path):
    from verl_npu.data.sft_dataset import ChatTokenizer
    from verl_npu.models.loading import load_tokenizer_and_processor

    tok, _ = load_tokenizer_and_processor(tiny_lm_path)
    messages = transcript("Tom has 3 apples and gets one more. How many apples does Tom have now?", "4")
    messages.insert(2, {"role": "assistant", "content": "Let me check 4 with the tool."})
    cfg = Node(
        "backend_config.data",
        {
            "apply_chat_template_kwargs": {},
            "max_length": 1024,
            "truncation": "error",
            "ignore_input_ids_mismatch": False,
        },
    )
    conv = ChatTokenizer(tok, cfg).encode(messages, None, "test row 0")
    # the tiny template is ChatML: each message is "<|im_start|>ROLE\n" then "CONTENT<|im_end|>\n"
    ids, mask = [], []
    for m in messages:
        head = tok(f"<|im_start|>{m['role']}\n", add_special_tokens=False)["input_ids"]
        body = tok(f"{m['content']}<|im_end|>\n", add_special_tokens=False)["input_ids"]
        ids += head + body
        mask += [0] * len(head) + [int(m["role"] == "assistant")] * len(body)
    assert list(conv.input_ids) == ids and list(conv.loss_mask) == mask
    learned = tok.decode([t for t, m in zip(conv.input_ids, conv.loss_mask) if m])
    assert learned == "".join(f"{m['content']}<|im_end|>\n" for m in messages if m["role"] == "assistant")
    assert "<tool_call>" in learned and "reward=1.0" not in learned and "Tom has" not in learned


def _parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


GOOD = transcript("Ann has 2 pens and gets one more. How many pens does Ann have now?", "3")


@pytest.mark.parametrize(
    "rows,match",
    [
        ([{"conversation": GOOD}], r"no column 'messages' \(data.messages_key\)"),
        (
            [{"messages": GOOD}, {"messages": GOOD[:2] + [{"role": "robot", "content": "hi"}]}],
            r"row 1: message 2 has role 'robot'",
        ),
        (
            [{"messages": GOOD}, {"messages": GOOD}, {"messages": GOOD[:2]}],
            r"row 2: the conversation has no assistant turn",
        ),
        (
            [{"messages": GOOD[:2] + [{"role": "assistant", "content": "1 2 3 4 " * 200}]}],
            r"row 0: \d+ tokens, longer than data.max_length=512",
        ),
    ],
)
def test_bad_rows_are_refused_naming_file_and_row(tmp_path, tiny_lm_path, sft_data, rows, match):
    from verl_npu.models.loading import load_tokenizer_and_processor

    bad = _parquet(tmp_path / "bad.parquet", rows)
    rc = load_sft_recipe(write_recipe(tmp_path, tiny_lm_path, sft_data, data={"train_files": str(bad)}))
    tok, _ = load_tokenizer_and_processor(tiny_lm_path)
    with pytest.raises(
        UserError, match=f"{re.escape(str(bad))}[: ]" if "column" in match else re.escape(str(bad))
    ) as info:
        SFTDataset(rc.typed.data.train_files, tok, rc.typed.data)
    assert re.search(match, str(info.value))


def test_the_cli_refuses_bad_data_before_any_model_is_loaded(tmp_path, tiny_lm_path, sft_data, capsys):
    from verl_npu.cli import main

    bad = _parquet(tmp_path / "bad.parquet", [{"messages": GOOD}, {"messages": GOOD[:2]}])
    recipe = write_recipe(tmp_path, tiny_lm_path, sft_data, data={"train_files": str(bad)})
    assert main(["sft", str(recipe)]) == 1
    err = capsys.readouterr().err
    assert f"{bad} row 1: the conversation has no assistant turn" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "checkpoints").exists()


# ---- training runs --------------------------------------------------------------------------------------------------
def _hf_weights(step_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(step_dir / "huggingface" / "model.safetensors")


def _local(value) -> torch.Tensor:
    """A saved tensor as a plain one (a one-rank mesh's DTensor: its local shard, which is all of it)."""
    return value.to_local() if hasattr(value, "to_local") else torch.as_tensor(value)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_checkpoint_layout_and_exact_resume(tmp_path, tiny_lm_path, sft_data):
    """4 steps in one go vs 2 steps, then a resume for steps 3-4 (the step-4 checkpoint removed, the marker back
    at 2): the same weights, optimizer state and metrics, bit for bit."""
    from verl_npu.sft.loop import run_sft
    from verl_npu.workers.torch_files import load_torch

    # 8 rows of 4 a step: 2 steps an epoch, so after_each_epoch validates at steps 2 and 4
    recipe = write_recipe(
        tmp_path,
        tiny_lm_path,
        sft_data,
        trainer={"total_training_steps": 4, "save_freq": 2, "test_freq": "after_each_epoch"},
        checkpoint={"save_contents": ["model", "optimizer", "extra", "hf_model"]},
        optim={"lr_scheduler_type": "cosine", "lr_warmup_steps": 1},
    )
    rc = load_sft_recipe(recipe)
    assert run_sft(rc) == 0
    ckpt = tmp_path / "out" / "checkpoints"
    step4 = ckpt / "global_step_4"
    assert sorted(p.name for p in step4.iterdir() if p.name not in ("COMPLETE", "manifest.json")) == [
        "data_0.pt",
        "extra_state_world_size_1_rank_0.pt",
        "fsdp_config.json",
        "huggingface",
        "model_world_size_1_rank_0.pt",
        "optim_world_size_1_rank_0.pt",
    ]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    assert json.loads((step4 / "fsdp_config.json").read_text()) == {"FSDP_version": 2, "world_size": 1}
    assert load_torch(step4 / "data_0.pt")["global_step"] == 4
    whole, whole_optim, whole_rows = (
        _hf_weights(step4),
        load_torch(step4 / "optim_world_size_1_rank_0.pt"),
        _rows(tmp_path / "out"),
    )
    assert [r["step"] for r in whole_rows] == [1, 2, 3, 4]
    assert ["val/loss" in r for r in whole_rows] == [False, True, False, True]
    assert whole_rows[-1]["train/loss"] < whole_rows[0]["train/loss"]
    assert (tmp_path / "out" / "training_curves.png").stat().st_size > 0

    import shutil

    shutil.rmtree(step4)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2\n")
    assert run_sft(load_sft_recipe(recipe)) == 0
    resumed = _hf_weights(step4)
    assert resumed.keys() == whole.keys()
    for name in whole:
        assert torch.equal(resumed[name], whole[name]), name
    resumed_optim = load_torch(step4 / "optim_world_size_1_rank_0.pt")
    for pid, state in whole_optim["state"].items():
        for k, v in state.items():
            assert torch.equal(_local(resumed_optim["state"][pid][k]), _local(v)), (pid, k)
    assert _rows(tmp_path / "out") == whole_rows


def save_rank_state(worker) -> None:
    """after_fit of the worker-count test: this rank's full weights, in a file named by its rank."""
    import os

    state = worker.engine.parameter_snapshot()
    torch.save(state, Path(os.environ["SFT_TEST_STATE_DIR"]) / f"rank{worker.rank}.pt")


@pytest.mark.slow
def test_one_and_two_workers_train_alike(tmp_path, tiny_lm_path, sft_data, monkeypatch):
    """2 steps on 1 worker and on 2 (gloo, FSDP2 shards): every rank ends with the same full weights, equal to the
    single worker's; the logged loss, grad norm and validation loss agree."""
    from verl_npu.sft.loop import run_sft

    results = {}
    for workers in (1, 2):
        folder = tmp_path / f"w{workers}"
        (folder / "states").mkdir(parents=True)
        monkeypatch.setenv("SFT_TEST_STATE_DIR", str(folder / "states"))
        recipe = write_recipe(folder, tiny_lm_path, sft_data, trainer={"n_gpus_per_node": workers, "test_freq": 2})
        assert run_sft(load_sft_recipe(recipe), after_fit=save_rank_state) == 0
        results[workers] = (
            [torch.load(folder / "states" / f"rank{r}.pt") for r in range(workers)],
            _rows(folder / "out"),
        )
    (one,), rows_one = results[1]
    twos, rows_two = results[2]
    for state in twos:  # every rank holds the same full weights; they are the single worker's up to rounding
        assert state.keys() == one.keys()
        for name in one:
            assert torch.equal(state[name], twos[0][name]), name
            torch.testing.assert_close(state[name], one[name], rtol=1e-4, atol=1e-5)
    for a, b in zip(rows_one, rows_two):
        for key in ("train/loss", "train/grad_norm", "train/global_tokens", "val/loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-5), key


@pytest.mark.slow
def test_rl_starts_from_the_sft_checkpoint_folder(tmp_path, tiny_lm_path, sft_data):
    """SFT 2 steps (hf_model saved), then 2 GRPO steps with actor_rollout_ref.model.path = the SFT run's
    global_step_2 folder itself (read through its huggingface/ export): the RL actor starts from the SFT weights."""
    from run_helpers import text_data, text_run_overrides

    from verl_npu.config import load_recipe
    from verl_npu.models.loading import resolve_model_path
    from verl_npu.sft.loop import run_sft
    from verl_npu.trainer.entry import run_training

    recipe = write_recipe(
        tmp_path / "sft",
        tiny_lm_path,
        sft_data,
        checkpoint={"save_contents": ["model", "optimizer", "extra", "hf_model"]},
    )
    assert run_sft(load_sft_recipe(recipe)) == 0
    step = tmp_path / "sft" / "out" / "checkpoints" / "global_step_2"
    assert resolve_model_path(str(step)) == str(step / "huggingface")
    sft_weights = _hf_weights(step)
    seen = {}

    def first_weights(workers):
        seen.update(workers.parameter_snapshot())

    data = text_data(tmp_path / "rl_data", rows=4)
    rc = load_recipe(
        "tiny_gsm8k",
        text_run_overrides(
            tmp_path / "rl",
            data,
            **{
                "actor_rollout_ref.model.path": step,
                "trainer.total_training_steps": 2,
                "actor_rollout_ref.actor.optim.lr": 0,
            },
        ),
    )
    assert run_training(rc, after_fit=first_weights) == 0
    # lr 0: the RL actor's weights after 2 steps are the SFT run's
    for name, value in sft_weights.items():
        torch.testing.assert_close(seen[name], value, rtol=0, atol=0)
    assert [json.loads(r)["step"] for r in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_checkpoint_folder_without_weights_says_how_to_get_them(tmp_path):
    from verl_npu.models.loading import resolve_model_path

    step = tmp_path / "global_step_3"
    (step / "huggingface").mkdir(parents=True)
    (step / "fsdp_config.json").write_text('{"FSDP_version": 2, "world_size": 1}')
    (step / "huggingface" / "config.json").write_text("{}")
    with pytest.raises(UserError, match="hf_model.*verl.model_merger merge --backend fsdp"):
        resolve_model_path(str(step))


def test_docs_list_every_key_as_the_schema_says():
    from verl_npu.config.sft_schema import reference_table

    assert (REPO / "docs" / "sft.md").read_text().endswith("## Every key\n" + reference_table())


def test_dynamic_micro_batches_over_several_workers_are_refused_by_name(tmp_path, tiny_lm_path, sft_data):
    recipe = write_recipe(
        tmp_path, tiny_lm_path, sft_data, data={"use_dynamic_bsz": True}, trainer={"n_gpus_per_node": 2}
    )
    with pytest.raises(ConfigErrors, match="data.use_dynamic_bsz=false"):
        load_sft_recipe(recipe)


@pytest.mark.slow
def test_a_stages_recipe_runs_sft_then_rl_and_resumes_in_the_right_stage(tmp_path, tiny_lm_path, sft_data):
    """`verl-npu run` on a recipe naming an SFT stage and an RL stage: SFT 1 step, RL 2 steps from the SFT
    checkpoint; run again asking for a third RL step, it skips the finished SFT stage (its metrics untouched) and
    the RL stage resumes from its step-2 checkpoint."""
    from run_helpers import text_data, text_run_overrides

    from verl_npu.cli import main

    sft = write_recipe(
        tmp_path / "sft_recipe",
        tiny_lm_path,
        sft_data,
        trainer={"total_training_steps": 1},
        checkpoint={"save_contents": ["model", "optimizer", "extra", "hf_model"]},
    )
    data = text_data(tmp_path / "rl_data", rows=4)
    rl = [
        o
        for o in text_run_overrides(tmp_path / "unused", data, **{"trainer.save_freq": 1})
        if not o.startswith(("af_output_dir=", "actor_rollout_ref.model.path="))
    ]
    stages = tmp_path / "stages.yaml"
    stages.write_text(
        yaml.safe_dump(
            {
                "af_output_dir": str(tmp_path / "run"),
                "stages": [
                    {"name": "sft", "recipe": str(sft)},
                    {"name": "rl", "recipe": "tiny_gsm8k", "overrides": rl},
                ],
            }
        )
    )
    assert main(["validate", str(stages)]) == 0
    assert main(["run", str(stages)]) == 0
    state = json.loads((tmp_path / "run" / "stages.json").read_text())
    assert state["sft"]["checkpoint"].endswith("sft/checkpoints/global_step_1") and state["rl"]["finished"]
    sft_rows = (tmp_path / "run" / "sft" / "metrics.jsonl").read_text()
    assert main(["run", str(stages), "rl.trainer.total_training_steps=3"]) == 0
    assert (tmp_path / "run" / "sft" / "metrics.jsonl").read_text() == sft_rows
    assert [r["step"] for r in _rows(tmp_path / "run" / "rl")] == [1, 2, 3]
    from verl_npu.config.stages import load_stages

    with pytest.raises(UserError, match="a stages recipe's overrides start with a stage name"):
        load_stages(stages, ["optim.lr=1"])


def test_sft_refuses_an_rl_recipe_naming_the_command(capsys):
    from verl_npu.cli import main

    assert main(["sft", "tiny_gsm8k"]) == 1
    assert "run an RL recipe with `verl-npu run tiny_gsm8k`" in capsys.readouterr().err


#: verl's own SFT command lines (docs/sft.md; the reference's B.4 and B.6), paths replaced by the test's
VERL_NPU_SCRIPT = [
    "data.messages_key=messages",
    "engine=fsdp",
    "optim=fsdp",
    "optim.lr=1e-5",
    "engine.ulysses_sequence_parallel_size=2",
    "engine.strategy=fsdp2",
    "trainer.total_epochs=2",
]
RETOOL_SFT_SCRIPT = [
    "data.max_length=16384",
    "data.train_batch_size=32",
    "data.multiturn.enable=true",
    "data.multiturn.messages_key=messages",
    "data.multiturn.tools_key=tools",
    "data.micro_batch_size_per_gpu=4",
    "model.strategy=fsdp",
    "trainer.total_epochs=6",
    "trainer.save_freq=62",
    "ulysses_sequence_parallel_size=4",
    "use_remove_padding=true",
    "trainer.logger=console",
]


@pytest.mark.parametrize("script,older", [(VERL_NPU_SCRIPT, False), (RETOOL_SFT_SCRIPT, True)], ids=["npu", "retool"])
def test_verls_sft_command_lines_validate_but_for_ulysses_named(tmp_path, tiny_lm_path, sft_data, script, older):
    """verl's NPU SFT test script (engine=fsdp optim=fsdp, 0.9.1 keys) and ReTool's SFT stage (the older
    fsdp_sft_trainer keys: model.partial_pretrain, data.multiturn.*, top-level ulysses / remove-padding) with only
    paths changed: the one refusal is Ulysses sequence parallelism (not built for SFT), named; with it at 1 both
    validate (the older keys with warnings)."""
    recipe = tmp_path / "min.yaml"
    recipe.write_text(yaml.safe_dump({"af_output_dir": str(tmp_path / "out"), "backend_config": {"model": {}}}))
    paths = [
        f"data.train_files={sft_data / 'train.parquet'}",
        f"data.val_files={sft_data / 'test.parquet'}",
        f"{'model.partial_pretrain' if older else 'model.path'}={tiny_lm_path}",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ]
    with pytest.raises(ConfigErrors) as info:
        load_sft_recipe(recipe, paths + script)
    assert [p.key.removeprefix(BC) for p in info.value.problems] == ["engine.ulysses_sequence_parallel_size"]
    one = [re.sub(r"ulysses_sequence_parallel_size=\d", "ulysses_sequence_parallel_size=1", o) for o in script]
    rc = load_sft_recipe(recipe, paths + one)
    assert rc.typed.model.path == str(tiny_lm_path) and rc.typed.engine.strategy in ("fsdp", "fsdp2")
    assert bool(rc.warnings) == older
    with pytest.raises(ConfigErrors, match="engine=megatron picks verl's megatron engine config"):
        load_sft_recipe(recipe, paths + one + ["engine=megatron"])


@pytest.mark.slow
def test_lora_sft_writes_verls_lora_files(tmp_path, tiny_lm_path, sft_data):
    """model.lora_rank: the shared engine wraps the model in peft adapters; the checkpoint holds verl's
    lora_train_meta.json, the adapter names under peft's prefix, and the merged model plus the adapter folder."""
    from verl_npu.sft.loop import run_sft
    from verl_npu.workers.torch_files import load_torch

    recipe = write_recipe(
        tmp_path,
        tiny_lm_path,
        sft_data,
        model={"lora_rank": 4, "lora_alpha": 8},
        trainer={"total_training_steps": 1},
        checkpoint={"save_contents": ["model", "optimizer", "extra", "hf_model"]},
    )
    assert run_sft(load_sft_recipe(recipe)) == 0
    step = tmp_path / "out" / "checkpoints" / "global_step_1"
    assert json.loads((step / "lora_train_meta.json").read_text())["r"] == 4
    names = list(load_torch(step / "model_world_size_1_rank_0.pt"))
    assert all(n.startswith("base_model.model.") for n in names) and any("lora_A" in n for n in names)
    assert (step / "huggingface" / "lora_adapter" / "adapter_config.json").is_file()


@pytest.mark.slow
def test_a_workers_user_error_reaches_the_user_as_one(tmp_path, tiny_lm_path, sft_data):
    """A checkpoint of 1 worker resumed by 2: each spawned rank refuses it (a UserError), and the run says so as a
    UserError naming the rank, not as a traceback of the process pool."""
    from verl_npu.sft.loop import run_sft

    recipe = write_recipe(
        tmp_path, tiny_lm_path, sft_data, trainer={"total_training_steps": 1}, data={"val_files": None}
    )
    assert run_sft(load_sft_recipe(recipe)) == 0
    with pytest.raises(UserError, match=r"worker rank \d: checkpoint .* was saved by 1 workers, this run has 2"):
        run_sft(load_sft_recipe(recipe, ["trainer.n_gpus_per_node=2", "trainer.total_training_steps=2"]))


def test_after_each_epoch_is_taken_for_save_and_test_freq(tmp_path, tiny_lm_path, sft_data):
    recipe = write_recipe(tmp_path, tiny_lm_path, sft_data)
    rc = load_sft_recipe(recipe, ["trainer.test_freq=after_each_epoch", "trainer.save_freq=after_each_epoch"])
    assert rc.typed.trainer.test_freq == rc.typed.trainer.save_freq == "after_each_epoch"
    with pytest.raises(ConfigErrors, match="trainer.test_freq"):
        load_sft_recipe(recipe, ["trainer.test_freq=after_each_step"])
