"""A newcomer's additions, each one file with one registration line (its decorator), in a real run: a
policy loss and an advantage estimator named by their files (`file.py:function`), a rollout engine and a
worker role read from the files named in $VERL_NPU_PLUGINS; two training steps of the tiny text model on
CPU, one worker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from run_helpers import cli_env, step_metrics, text_data, text_run_overrides

TOYS = Path(__file__).resolve().parents[1] / "toys"
REPO = Path(__file__).resolve().parents[2]


def test_a_toy_loss_estimator_engine_and_role_train_two_steps(tmp_path):
    data, out, log = text_data(tmp_path / "data"), tmp_path / "out", tmp_path / "toy.log"
    overrides = text_run_overrides(
        out,
        data,
        **{
            "actor_rollout_ref.actor.policy_loss.loss_mode": f"{TOYS / 'toy_loss.py'}:toy_reinforce",
            "algorithm.adv_estimator": f"{TOYS / 'toy_estimator.py'}:toy_constant",
            "actor_rollout_ref.rollout.name": "toy_hf",
            "trainer.logger": "[console,file]",
        },
    )
    env = cli_env(
        VERL_NPU_PLUGINS=f"{TOYS / 'toy_rollout.py'}:{TOYS / 'toy_role.py'}",
        TOY_LOG=str(log),
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "verl_npu.cli", "run", "tiny_gsm8k", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = step_metrics(out)
    assert sorted(steps) == [1, 2]
    for row in steps.values():
        assert row["critic/advantages/mean"] == row["critic/advantages/max"] == 0.5  # the toy estimator's
        assert "actor/toy_pg_loss" in row and row["actor/grad_norm"] > 0  # the toy loss's
    lines = log.read_text().splitlines()
    assert lines.count("role built: rank 0 of 1, 2 steps") == 1
    assert lines.count("generate 4 prompts -> 8 rows") == 2  # the toy engine sampled both steps


def test_the_toys_are_refused_by_name_without_their_registration(tmp_path):
    """Without $VERL_NPU_PLUGINS the engine's name is unknown, and a loss file without the function is
    reported with the file and the key: validation, before anything starts."""
    overrides = text_run_overrides(
        tmp_path / "out",
        text_data(tmp_path / "data"),
        **{
            "actor_rollout_ref.rollout.name": "toy_hf",
            "actor_rollout_ref.actor.policy_loss.loss_mode": f"{TOYS / 'toy_loss.py'}:no_such_loss",
        },
    )
    env = cli_env()
    env.pop("VERL_NPU_PLUGINS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "verl_npu.cli", "validate", "tiny_gsm8k", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    text = proc.stdout + proc.stderr
    assert "rollout.name" in text and "'toy_hf' is not one of" in text
    assert "policy_loss.loss_mode" in text and "defines no top-level 'no_such_loss'" in text


def test_a_missing_plugin_file_is_a_clear_error(tmp_path):
    env = cli_env(VERL_NPU_PLUGINS=str(tmp_path / "no_such_plugin.py"))
    proc = subprocess.run(
        [sys.executable, "-m", "verl_npu.cli", "validate", "tiny_gsm8k"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "$VERL_NPU_PLUGINS names files that do not exist" in proc.stderr and "no_such_plugin.py" in proc.stderr


TOY_CORRECTION_AND_TOOL = """
import asyncio, json, sys, torch
from verl_npu.algorithms.rollout_correction import rollout_correction
from verl_npu.config import load_recipe
from verl_npu.tools.loading import load_tools
tool_config = sys.argv[1]
load_recipe("tiny_gsm8k", ["algorithm.rollout_correction.rollout_is=toy_half",
                           "algorithm.rollout_correction.rollout_rs=toy_seq_min_k3",
                           "algorithm.rollout_correction.rollout_rs_threshold=0.5"])
load_recipe("tiny_tool_gsm8k", ["actor_rollout_ref.rollout.multi_turn.tool_config_path=" + tool_config])
log_ratio = torch.tensor([[2.0, 2.0, 2.0], [0.0, 2.0, 0.0]])   # old - rollout log-probs
corr = rollout_correction(log_ratio, torch.zeros_like(log_ratio), torch.ones(2, 3), rollout_is="toy_half",
                          rollout_is_threshold=10.0, rollout_rs="toy_seq_min_k3", rollout_rs_threshold=0.5)
tool = load_tools(tool_config)["reverse_text"]
reply, _, _ = asyncio.run(tool.execute("id", {"text": "abc"}))
print(json.dumps({"weights": corr.weights.tolist(), "mask": corr.response_mask.tolist(),
                  "rejected": corr.metrics["rollout_corr/rollout_rs_toy_seq_min_k3_masked_fraction"],
                  "tool": type(tool).__name__, "reply": reply.text}))
"""


def test_a_toy_rollout_correction_and_tool_register_from_their_files(tmp_path):
    """A rollout-correction mode of each kind (an IS level, a rejection option) and a tool, each one file
    with its registration line, read from $VERL_NPU_PLUGINS: the config accepts their names, the tensor
    code computes with them and the tool is built from a tool config file and called. Without the plugin
    files their names are refused by the config, before anything starts."""
    import json
    import math

    tool_config = tmp_path / "tools.yaml"
    tool_config.write_text("tools:\n  - class_name: toy_reverse\n    config: {type: native}\n")
    env = cli_env(VERL_NPU_PLUGINS=f"{TOYS / 'toy_correction.py'}:{TOYS / 'toy_tool.py'}")
    proc = subprocess.run(
        [sys.executable, "-c", TOY_CORRECTION_AND_TOOL, str(tool_config)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    e = math.exp(1.0)  # exp(2 / 2): the toy level halves the log-ratio
    weights = [w for row in out["weights"] for w in row]
    assert len(weights) == 6 and all(
        math.isclose(w, want, rel_tol=1e-6) for w, want in zip(weights, [e, e, e, 1, e, 1])
    )
    # row 0's smallest k3 is exp(2) - 3 > 0.5: rejected; row 1 has a token with k3 = 0: kept
    assert out["mask"] == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]] and out["rejected"] == 0.5
    assert (out["tool"], out["reply"]) == ("ToyReverseTool", "cba")

    env.pop("VERL_NPU_PLUGINS")
    for override, refusal in (
        ("algorithm.rollout_correction.rollout_is=toy_half", "'toy_half' is not one of"),
        (
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
            "tools[0].class_name: 'toy_reverse' is neither a built-in tool",
        ),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "verl_npu.cli", "validate", "--check-paths", "tiny_tool_gsm8k", override],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        text = proc.stdout + proc.stderr
        assert proc.returncode == 1 and "Traceback" not in text and refusal in text, text[-3000:]
