"""verl's SFT example scripts on verl-npu (issue 38): the overrides of verl's GSM8K LoRA example, its multi-turn
example, its NPU SFT test and ReTool's SFT stage (tests/fixtures/verl_sft_scripts/*.txt, source and what the file rests
on in each header), with only their data, model and checkpoint paths replaced by local tiny ones, are validated as
`verl-npu sft` validates: each passes or fails exactly on the refusals its `# expect:` line names (each with a fix).
With the `# drop:` keys removed and the `# fixed:` overrides added it must validate; the scripts marked
`# train: 2 steps` then train 2 steps on the CPU with only sizing overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from verl_npu.config.sft import load_sft_recipe
from verl_npu.data.sft_synthetic import prepare_synthetic
from verl_npu.errors import ConfigErrors

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "verl_sft_scripts"
SCRIPTS = sorted(HERE.glob("*.txt"))
HEADER_KEYS = ("source", "expect", "drop", "fixed", "train")
#: what a CPU run of 2 steps changes besides the paths: batch sizes and lengths for 8 tiny conversations
SIZING = [
    "data.train_batch_size=4",
    "data.micro_batch_size_per_gpu=2",
    "data.max_length=512",
    "data.use_dynamic_bsz=false",
    "trainer.total_training_steps=2",
    "trainer.total_epochs=1",
    "trainer.save_freq=-1",
    "trainer.logger=console",
]


def read_script(path: Path) -> tuple[list[str], dict[str, str]]:
    overrides, header = [], {}
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            if key.strip() in HEADER_KEYS:
                header[key.strip()] = value.strip()
        elif line.strip():
            overrides.append(line.strip())
    return overrides, header


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verl_sft_data")
    prepare_synthetic(folder, 8, 4, seed=0)
    return folder


def localized(overrides: list[str], data: Path, model: Path, out: Path) -> list[str]:
    paths = {
        "data.train_files": data / "train.parquet",
        "data.val_files": data / "test.parquet",
        "model.path": model,
        "model.partial_pretrain": model,
        "trainer.default_local_dir": out / "checkpoints",
    }
    result = []
    for item in overrides:
        key = item.split("=", 1)[0]
        result.append(f"{key}={paths[key.lstrip('+')]}" if key.lstrip("+") in paths else item)
    return result


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_verl_sft_script_validates_or_is_refused_by_name_then_trains(script, sft_data, tiny_lm_path, tmp_path):
    overrides, header = read_script(script)
    assert header["source"].startswith("github.com/volcengine/verl ") and " @ " in header["source"]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"af_output_dir": str(tmp_path / "out"), "backend_config": {"model": {}}}))
    args = localized(overrides, sft_data, tiny_lm_path, tmp_path / "out")
    expect = header["expect"]
    if expect == "pass":
        load_sft_recipe(recipe, args, check_paths=True)
    else:
        assert expect.startswith("refused: ")
        with pytest.raises(ConfigErrors) as info:
            load_sft_recipe(recipe, args, check_paths=True)
        keys = sorted(p.key.removeprefix("backend_config.") for p in info.value.problems)
        assert keys == sorted(k.strip() for k in expect.removeprefix("refused: ").split(","))
        assert all(p.fix for p in info.value.problems)  # each refusal says what to do
    drop = set(header.get("drop", "").split())
    fixed = [a for a in args if a.split("=", 1)[0].lstrip("+") not in drop] + header.get("fixed", "").split()
    rc = load_sft_recipe(recipe, fixed, check_paths=True)
    assert rc.typed.model.path == str(tiny_lm_path)
    if header.get("train") != "2 steps":
        return
    from verl_npu.cli import main

    assert main(["sft", str(recipe), *fixed, *SIZING]) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(losses) == 2 and all(loss > 0 for loss in losses)
    assert (tmp_path / "out" / "checkpoints" / "global_step_2").is_dir()
