"""Run-time features of verl keys, each in a short real CPU run on the tiny models:
`actor.freeze_vision_tower`, the profiler (`global_profiler.*`, `<role>.profiler.*`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from run_helpers import run_overrides, write_varied_reward

from verl_npu.config import load_recipe
from verl_npu.errors import UserError
from verl_npu.trainer.entry import run_training


def overrides(tmp_path: Path, data_dir: Path, **extra) -> list[str]:
    return run_overrides(
        tmp_path / "out",
        data_dir,
        {
            "data.train_batch_size": 4,
            "data.max_response_length": 4,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.actor.use_kl_loss": "false",
            "actor_rollout_ref.actor.optim.lr": 1e-3,
            "actor_rollout_ref.rollout.n": 2,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 8,
            "trainer.total_training_steps": 1,
            "trainer.save_freq": -1,
            "trainer.test_freq": -1,
            "trainer.val_before_train": "false",
            "trainer.logger": "[console]",
            "custom_reward_function.path": write_varied_reward(tmp_path / "reward.py"),
        },
        extra,
    )


# ---- freeze_vision_tower -----------------------------------------------------------------------
@pytest.mark.slow
def test_freeze_vision_tower_keeps_the_tower_and_trains_the_rest(tmp_path, geo_data, tiny_vl_path):
    from verl_npu.models.loading import load_policy_model

    initial = {k: v.clone() for k, v in load_policy_model("tiny://qwen25vl", dtype=torch.float32).state_dict().items()}
    seen = {}

    def inspect(workers):
        worker = workers.worker
        params = dict(worker.module.named_parameters())
        seen["grad"] = {n for n, p in params.items() if p.grad is not None or p.requires_grad}
        with_state = {id(p) for p in worker.optimizer.state}
        seen["state"] = {n for n, p in params.items() if id(p) in with_state}
        seen["after"] = workers.parameter_snapshot()

    rc = load_recipe(
        "tiny_geo3k", overrides(tmp_path, geo_data, **{"actor_rollout_ref.actor.freeze_vision_tower": "true"})
    )
    assert run_training(rc, after_fit=inspect) == 0
    after = seen["after"]
    visual = [k for k in after if ".visual." in f".{k}"]
    rest = [k for k in after if k not in visual]
    assert visual and rest
    for key in visual:  # bit-for-bit unchanged
        assert torch.equal(after[key], initial[key]), key
    changed = [k for k in rest if not torch.equal(after[k], initial[k])]
    assert len(changed) > len(rest) // 2, f"only {len(changed)} of {len(rest)} language-model tensors changed"
    # no gradient, no optimizer state for the tower; the rest has both
    assert not any(".visual." in f".{n}" for n in seen["grad"] | seen["state"])
    assert {n for n in seen["state"]} and all(".visual." not in f".{n}" for n in seen["state"])


def test_freeze_vision_tower_on_a_text_model_is_refused_by_name():
    from verl_npu.models.freeze import freeze_vision_tower
    from verl_npu.models.loading import load_policy_model

    with pytest.raises(UserError, match="freeze_vision_tower"):
        freeze_vision_tower(load_policy_model("tiny://qwen2", dtype=torch.float32))


# ---- profiler ----------------------------------------------------------------------------------
PROFILE = {
    "global_profiler.tool": "torch",
    "global_profiler.steps": "[2]",
    "global_profiler.save_path": "prof",
    "actor_rollout_ref.actor.profiler.enable": "true",
    "actor_rollout_ref.actor.profiler.ranks": "[0]",
    "trainer.total_training_steps": 2,
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "steps, continuous, folder",
    [("[2]", "false", "step_2"), ("[1,2]", "true", "step_1")],
    ids=["step-2", "continuous-1-2"],
)
def test_profiler_traces_the_named_step_under_af_output_dir(
    tmp_path, geo_data, tiny_vl_path, steps, continuous, folder
):
    """[2]: step 1 is not profiled; [1,2] with profile_continuous_steps: one trace over both steps."""
    rc = load_recipe(
        "tiny_geo3k",
        overrides(
            tmp_path,
            geo_data,
            **{**PROFILE, "global_profiler.steps": steps, "global_profiler.profile_continuous_steps": continuous},
        ),
    )
    assert run_training(rc) == 0
    root = tmp_path / "out" / "prof"
    assert [p.name for p in root.iterdir()] == [folder]
    trace = json.loads((root / folder / "rank_0" / "trace.json").read_text())
    events = trace["traceEvents"]
    names = {e.get("name", "") for e in events}
    assert len(events) > 100 and any(n.startswith("aten::") for n in names)


FILLED = [
    "af_output_dir=/tmp/verl_npu_out",
    "data.train_files=/data/t.parquet",
    "data.val_files=/data/v.parquet",
    "actor_rollout_ref.model.path=/models/m",
    "trainer.device=cpu",
]
ROLE = ["actor_rollout_ref.actor.profiler.enable=true", "actor_rollout_ref.actor.profiler.all_ranks=true"]
GP = "backend_config.global_profiler."


@pytest.mark.parametrize(
    "extra,key,fragment",
    [
        (["global_profiler.tool=nsys", "global_profiler.steps=[1]"] + ROLE, GP + "tool", "Nsight Systems must wrap"),
        (["global_profiler.tool=npu", "global_profiler.steps=[1]"] + ROLE, GP + "tool", "this run is on cpu"),
        (["global_profiler.tool=torch_memory", "global_profiler.steps=[1]"] + ROLE, GP + "tool", "memory snapshots"),
        (["global_profiler.tool=torch", "global_profiler.steps=[1]"], GP + "tool", "no role records"),
        (["global_profiler.tool=torch"] + ROLE, GP + "steps", "nothing would be profiled"),
        (["global_profiler.steps=[1]"] + ROLE, GP + "tool", "is null"),
        (
            ["global_profiler.tool=torch", "global_profiler.steps=[1]", "actor_rollout_ref.actor.profiler.enable=true"],
            "backend_config.actor_rollout_ref.actor.profiler.ranks",
            "no rank would record",
        ),
        (["global_profiler.tool=torch", "global_profiler.steps=[1.5]"] + ROLE, GP + "steps", "list[int]"),
    ],
)
def test_profiler_settings_that_would_record_nothing_or_cannot_run_are_refused(extra, key, fragment):
    from verl_npu.errors import ConfigErrors

    with pytest.raises(ConfigErrors) as info:
        load_recipe("qwen25vl_geo3k", FILLED + extra)
    named = [p for p in info.value.problems if p.key == key]
    assert any(fragment in f"{p.message} {p.fix}" for p in named), str(info.value)


def test_verl_profiler_overrides_validate():
    rc = load_recipe(
        "qwen25vl_geo3k",
        FILLED
        + [
            "global_profiler.tool=torch",
            "global_profiler.steps=[1,2,5]",
            "global_profiler.save_path=./outputs/profile",
            "global_profiler.profile_continuous_steps=true",
            "actor_rollout_ref.actor.profiler.enable=True",
            "actor_rollout_ref.actor.profiler.all_ranks=False",
            "actor_rollout_ref.actor.profiler.ranks=[0]",
            "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[memory,shapes]",
            "actor_rollout_ref.ref.profiler.enable=True",
            "actor_rollout_ref.ref.profiler.all_ranks=True",
            "actor_rollout_ref.rollout.profiler.enable=True",
            "actor_rollout_ref.rollout.profiler.ranks=[0]",
            "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=True",
            "global_profiler.global_tool_config.nsys.discrete=False",
        ],
    )
    assert list(rc.backend.global_profiler.steps) == [1, 2, 5]


# ---- use_fused_kernels in a run ----------------------------------------------------------------
@pytest.mark.slow
def test_fused_kernels_run_matches_the_unfused_run(tmp_path, geo_data, tiny_vl_path):
    """Same seeds, one step each: the fused run logs the same entropy, losses and grad norm."""
    rows = {}
    for fused in ("false", "true"):
        out = tmp_path / fused
        out.mkdir()
        rc = load_recipe("tiny_geo3k", overrides(out, geo_data, **{"actor_rollout_ref.model.use_fused_kernels": fused}))
        assert run_training(rc) == 0
        rows[fused] = json.loads((out / "out" / "metrics.jsonl").read_text().splitlines()[-1])
    for key in (
        "actor/entropy_before_update",
        "actor/entropy",
        "actor/pg_loss",
        "actor/grad_norm",
        "critic/score/mean",
    ):
        assert rows["true"][key] == pytest.approx(rows["false"][key], rel=1e-4, abs=1e-6), key


# ---- the three on two FSDP2 workers -------------------------------------------------------------
@pytest.mark.slow
def test_fused_kernels_freeze_and_profiler_on_two_fsdp2_workers(tmp_path, geo_data, tiny_vl_path):
    """Sharded parameters: the fused head works where FSDP2 gathers the output projection, the frozen
    tower stays put on every rank, and every rank writes its trace."""
    from verl_npu.models.loading import load_policy_model

    initial = load_policy_model("tiny://qwen25vl", dtype=torch.float32).state_dict()
    snapshots = []
    extra = {
        "trainer.n_gpus_per_node": 2,
        "ray_init.num_cpus": 2,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.model.use_fused_kernels": "true",
        "actor_rollout_ref.actor.freeze_vision_tower": "true",
        **PROFILE,
        "actor_rollout_ref.actor.profiler.ranks": "[0,1]",
    }
    rc = load_recipe("tiny_geo3k", overrides(tmp_path, geo_data, **extra))
    assert run_training(rc, after_fit=lambda workers: snapshots.extend(workers.parameter_snapshots())) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["actor/grad_norm"] > 0 for r in rows)
    for rank in (0, 1):
        assert json.loads((tmp_path / "out" / "prof" / "step_2" / f"rank_{rank}" / "trace.json").read_text())[
            "traceEvents"
        ]
    for snap in snapshots:
        visual = [k for k in snap if ".visual." in f".{k}"]
        assert visual and all(torch.equal(snap[k], initial[k]) for k in visual)
        assert any(not torch.equal(snap[k], initial[k]) for k in snap if k not in visual)


# ---- a tracker in a real run -------------------------------------------------------------------
@pytest.mark.slow
def test_a_run_logs_to_wandb_with_its_names_and_resolved_recipe(tmp_path, geo_data, tiny_vl_path):
    pytest.importorskip("wandb")
    from test_loggers import _wandb_records

    rc = load_recipe(
        "tiny_geo3k",
        overrides(
            tmp_path,
            geo_data,
            **{"trainer.logger": "[console,wandb]", "trainer.project_name": "proj9", "trainer.experiment_name": "exp9"},
        ),
    )
    assert run_training(rc) == 0
    run, history = _wandb_records(tmp_path / "out")
    assert (run.project, run.display_name) == ("proj9", "exp9")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["af_output_dir"] == str(tmp_path / "out")
    assert config["backend_config"]["actor_rollout_ref"]["model"]["path"] == "tiny://qwen25vl"
    row = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[-1])
    assert history[1]["critic/score/mean"] == pytest.approx(row["critic/score/mean"])
    assert {"actor/pg_loss", "timing_s/step", "response_length/mean"} <= set(history[1])
