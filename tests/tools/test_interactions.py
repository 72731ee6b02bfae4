"""Interactions (verl's interaction config, the gsm8k and grid_env built-ins) and the grid environments.

A scripted trajectory (the tokens of each model turn chosen by a `pick_factory`; the tiny Qwen2, its chat
template, the decode loop and the interactions are the real ones) shows the response mask token by token
(model turns 1, interaction / environment turns 0) and the per-turn scores; bad interaction configs are
refused naming the file and the key; the environments are deterministic for a seed.
"""

from __future__ import annotations

import pytest
import torch
from test_agent_loop import left_padded, scripted

from verl_npu.batch import Batch
from verl_npu.config.interaction_file import default_name, read_interaction_config
from verl_npu.config.typed import section
from verl_npu.errors import UserError
from verl_npu.rollout.agent_loop import MULTI_TURN, AgentLoop
from verl_npu.rollout.base import SamplingParams
from verl_npu.rollout.hf import HFRollout
from verl_npu.tools.envs import make_env, parse_action
from verl_npu.tools.interactions.grid_env import GridEnvInteraction
from verl_npu.tools.interactions.gsm8k import RIGHT, WRONG, Gsm8kInteraction
from verl_npu.tools.interactions.loading import load_interactions

P, R = 48, 160
LAKE = ["G..", ".S.", "..."]  # the goal up and to the left: U then L (or L then U)


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_npu.models.tiny import materialize

    path = materialize("tiny://qwen2")
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path).float().eval(), AutoTokenizer.from_pretrained(path)


# ---- environments ------------------------------------------------------------------------------------
def test_parse_action_reads_one_move_and_nothing_else():
    assert [parse_action(t) for t in ("U", " D\n", "Left", "<answer>right</answer>", "R")] == ["U", "D", "L", "R", "R"]
    assert [parse_action(t) for t in ("", "UL", "go up", "X", "<answer></answer>", "u", " r")] == [None] * 7


@pytest.mark.parametrize("name,options", [("frozen_lake", {"size": 4}), ("sokoban", {"size": 5})])
def test_environments_are_deterministic_for_a_seed(name, options):
    def play(seed):
        env = make_env(name, seed, **options)
        first = env.reset()
        moves = env.shortest_path() if name == "frozen_lake" else env.solve()
        results = [env.step(m) for m in moves]
        return first, moves, [(r.observation, r.reward, r.done) for r in results], env.success

    assert play(3) == play(3)
    first, moves, steps, won = play(3)
    assert won and steps[-1][1] == 1.0 and steps[-1][2] and all(r == 0.0 for _, r, _ in steps[:-1])
    assert len({play(s)[0] for s in range(8)}) > 1  # seeds give different maps


def test_frozen_lake_steps_holes_walls_and_the_step_limit():
    env = make_env("frozen_lake", 0, map=["SH", ".G"], max_steps=3)
    assert env.reset() == "PH\n.G"
    r = env.step("U")  # off the grid: no move, the step counts
    assert (r.observation, r.done, r.info["steps"]) == ("PH\n.G", False, 1)
    r = env.step(None)  # a malformed turn: no move
    assert (r.observation, r.info["valid"], r.done) == ("PH\n.G", False, False)
    r = env.step("R")  # into the hole: lost
    assert r.done and not r.success and r.reward == 0.0
    env = make_env("frozen_lake", 0, map=["SH", ".G"], max_steps=2)
    env.reset()
    env.step("U")
    assert env.step("L").done and not env.success  # out of steps
    env = make_env("frozen_lake", 0, map=["G..", ".S.", "..."], show_goal="positions")
    assert env.reset() == "G..\n.P.\n...\nP 1 1 G 0 0" and env.step("L").observation.endswith("P 1 0 G 0 0")
    env = make_env("frozen_lake", 0, map=["G..", ".S.", "..."], show_goal="direction")
    assert env.reset().endswith("\nG: U L") and env.step("L").observation.endswith("\nG: U")
    assert env.step("U").observation.endswith("\nG:") and env.success
    env = make_env("frozen_lake", 0, map=["..G", ".S.", "..."], show_goal="direction", show_grid=False)
    assert env.reset() == "G: U R" and env.step("D").observation == "G: U R"
    with pytest.raises(ValueError, match="exactly one S and one G"):
        make_env("frozen_lake", 0, map=["..", ".G"])


def test_no_fixed_move_sequence_beats_the_grid_rewards_blind_bound_on_the_demo_maps():
    """rewards/grid_env.BLIND_BEST_SCORE (the summary's blind ceiling) is the best success rate of one fixed
    sequence of 3 moves (the demo's step limit) over the corner maps, found by trying every sequence."""
    import itertools

    from verl_npu.rewards.grid_env import BLIND_BEST_SCORE
    from verl_npu.tools.envs.frozen_lake import corner_maps

    def wins(moves, layout):
        env = make_env("frozen_lake", 0, map=layout, max_steps=len(moves))
        env.reset()
        for move in moves:
            if env.step(move).done:
                break
        return env.success

    maps = corner_maps(holes=False)
    best = max(sum(wins(moves, m) for m in maps) / len(maps) for moves in itertools.product("UDLR", repeat=3))
    assert len(maps) == 4 and best == BLIND_BEST_SCORE == 0.25
    assert len(corner_maps(holes=True)) == 12 and corner_maps(holes=True)[:4:3] == [maps[0], maps[1]]


def test_sokoban_pushes_the_box_and_walls_stop_it():
    env = make_env("sokoban", 3)
    start = env.reset()
    assert start.count("B") == 1 and start.count("T") == 1 and start.count("P") == 1
    for move in env.solve()[:-1]:
        assert not env.step(move).done
    last = env.step(env.solve()[-1])
    assert last.success and "*" in last.observation


# ---- the interactions on their own -------------------------------------------------------------------
def test_gsm8k_interaction_checks_the_answer_and_ends_when_right():
    it = Gsm8kInteraction({"name": "gsm8k"})
    iid = it.start_interaction("t0", ground_truth="72")
    assert it.generate_response(iid, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "70"}]) == (
        False,
        WRONG,
        0.0,
        {},
    )
    assert it.generate_response(iid, [{"role": "assistant", "content": "it is #### 72"}]) == (True, RIGHT, 1.0, {})
    assert it.calculate_score(iid) == 1.0
    it.finalize_interaction(iid)
    assert iid not in it._state


def test_grid_env_interaction_scores_moves_and_penalises_malformed_turns():
    it = GridEnvInteraction({"name": "grid_env", "max_steps": 4, "format_penalty": -0.25})
    iid = it.start_interaction("t", name="grid_env", env="frozen_lake", seed=1, map=LAKE, size=None)
    said = lambda text: it.generate_response(iid, [{"role": "assistant", "content": text}])  # noqa: E731
    done, text, score, meta = said("hello")
    assert (done, score, meta["valid"]) == (False, -0.25, False) and text.startswith("Not a move.")
    done, text, score, meta = said("U")
    assert (done, text, score) == (False, ".P.\n...\n...".replace(".P.", "GP.", 1), 0.0)
    done, text, score, meta = said("L")
    assert done and score == 1.0 and meta["success"] and text.endswith("Solved.")
    assert it.calculate_score(iid) == 1.0


# ---- the interaction config file ---------------------------------------------------------------------
def write(tmp_path, text):
    path = tmp_path / "interaction.yaml"
    path.write_text(text)
    return path


def test_verl_configs_load_and_names_default_as_in_verl(tmp_path):
    path = write(
        tmp_path,
        "interaction:\n  - class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n"
        "    config: {}\n  - name: lake\n    class_name: grid_env\n    config: {max_steps: 2}\n",
    )
    built = load_interactions(path)
    assert sorted(built) == ["gsm8k", "lake"] and isinstance(built["gsm8k"], Gsm8kInteraction)
    assert built["lake"].config["name"] == "lake" and built["lake"].max_steps == 2
    assert default_name("my.mod.WeatherInteraction") == "weather" and default_name("x.py:Coach") == "coach"


@pytest.mark.parametrize(
    "text,where,what",
    [
        ("interaction: {}\n", "interaction", "non-empty list"),
        ("interaction:\n  - class_name: gsm8k\n  - class_name: gsm8k\n", "interaction[1].name", "names must be unique"),
        (
            "interaction:\n  - class_name: verl.interactions.weather_interaction.WeatherInteraction\n",
            "interaction[0].class_name",
            "a class of verl",
        ),
        ("interaction:\n  - class_name: no_such_pkg.mod.Cls\n", "interaction[0].class_name", "cannot be found"),
        ("interaction:\n  - class_name: missing.py:Cls\n", "interaction[0].class_name", "does not exist"),
        (
            "interaction:\n  - class_name: grid_env\n    config: {group_size: 8}\n",
            "interaction[0].config.group_size",
            "actor_rollout_ref.rollout.n",
        ),
        (
            "interaction:\n  - class_name: grid_env\n    config: {tags: [SimpleSokoban]}\n",
            "interaction[0].config.tags",
            "interaction_kwargs.env",
        ),
        (
            "interaction:\n  - class_name: grid_env\n    config: {format_penalty: 0.5}\n",
            "interaction[0].config.format_penalty",
            "a penalty",
        ),
        (
            "interaction:\n  - class_name: grid_env\n    config: {env: chess}\n",
            "interaction[0].config.env",
            "frozen_lake",
        ),
    ],
)
def test_bad_interaction_configs_are_refused_naming_the_file_and_key(tmp_path, text, where, what):
    path = write(tmp_path, text)
    _, problems = read_interaction_config(path)
    assert any(w.endswith(where) and str(path) in w and what in m for w, m in problems), problems
    with pytest.raises(UserError, match=r"interaction_config_path"):
        load_interactions(path)


def test_a_class_that_is_not_an_interaction_or_fails_to_build_is_refused(tmp_path):
    (tmp_path / "mine.py").write_text(
        "class NotOne:\n    pass\n\nclass Broken:\n    def __init__(self, config):\n"
        "        raise ValueError('no key')\n    def start_interaction(self): pass\n"
        "    def generate_response(self): pass\n"
    )
    path = write(tmp_path, f"interaction:\n  - class_name: {tmp_path / 'mine.py'}:NotOne\n")
    with pytest.raises(
        UserError,
        match=r"interaction\[0\]\.class_name: .* is not an interaction: it has no "
        r"start_interaction, generate_response",
    ):
        load_interactions(path)
    path = write(tmp_path, f"interaction:\n  - class_name: {tmp_path / 'mine.py'}:Broken\n")
    with pytest.raises(UserError, match=r"interaction\[0\]: constructing .* failed: ValueError: no key"):
        load_interactions(path)


def test_a_row_naming_an_unknown_interaction_is_refused_naming_the_row(tmp_path, model_and_tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from omegaconf import OmegaConf

    from verl_npu.data.dataset import RLDataset
    from verl_npu.data.grid_env import prepare_synthetic

    _, tok = model_and_tokenizer
    paths = prepare_synthetic(tmp_path, 4, 2)["paths"]
    table = pq.read_table(paths["train"])
    rows = table.to_pylist()
    rows[2]["extra_info"]["interaction_kwargs"]["name"] = "chess"
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), paths["train"])
    cfg = OmegaConf.create(
        {"prompt_key": "prompt", "max_prompt_length": 96, "truncation": "error", "reward_fn_key": "data_source"}
    )
    try:
        ds = RLDataset(paths["train"], tok, None, cfg)
    except Exception as err:  # the dataset's own settings: skip rather than test them here
        pytest.skip(f"RLDataset settings: {err}")
    with pytest.raises(UserError, match=rf"{paths['train']} row 2: extra_info.interaction_kwargs.name is 'chess'"):
        ds.check_interaction_names(["grid_env"], "single_turn_agent")
    ds.check_interaction_names(["grid_env", "chess"], "single_turn_agent")


# ---- scripted trajectories through the agent loop -----------------------------------------------------
def prompts(tok, pad_id, messages_per_row, extra, agent="tool_agent") -> Batch:
    rows = [
        tok(tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True), add_special_tokens=False)[
            "input_ids"
        ]
        for m in messages_per_row
    ]
    return left_padded(
        rows,
        pad_id,
        P,
        uid=[f"q{i}" for i in range(len(rows))],
        extra_info=extra,
        raw_prompt=messages_per_row,
        agent_name=[agent] * len(rows),
    )


def test_environment_trajectory_mask_token_by_token_and_turn_scores(model_and_tokenizer):
    """One token per model turn (max_tokens_per_step 1): the move is trained (1), the lake's reply, which
    starts with the end-of-turn token the model did not write, is not (0)."""
    model, tok = model_and_tokenizer
    eng = HFRollout(model, tok, seed=0)
    lake = GridEnvInteraction({"name": "grid_env", "max_steps": 3, "max_tokens_per_step": 1})
    scripts = {"q0": ["U", "?", "L"], "q1": ["D", "D", "D"]}
    loop = AgentLoop(
        model,
        tok,
        {},
        section(MULTI_TURN),
        eos_ids=eng.eos_ids,
        pad_id=eng.pad_id,
        suppress_ids=eng.suppress_ids,
        interactions={"grid_env": lake},
        pick_factory=scripted(tok, eng.eos_ids[0], scripts, with_eos=False),
    )
    extra = [{"interaction_kwargs": {"name": "grid_env", "env": "frozen_lake", "seed": 0, "map": LAKE}}] * 2
    batch = prompts(tok, eng.pad_id, [[{"role": "user", "content": "..."}]] * 2, extra)
    out = loop.run(batch, SamplingParams(n=1, max_new_tokens=R))

    turns = out["agent_turns"][0]
    assert [t["role"] for t in turns] == ["assistant", "user"] * 3
    assert [t["tokens"] for t in turns[::2]] == [1, 1, 1]
    assert out["turn_scores"] == [[0.0, -0.1, 1.0], [0.0, 0.0, 0.0]]
    assert out["interaction_info"][0]["success"] and not out["interaction_info"][1]["success"]
    assert turns[-1]["content"].endswith("Solved.") and out["agent_turns"][1][-1]["content"].endswith("Failed.")
    want = []
    for t in turns:
        want += [1] * t["tokens"] if t["role"] == "assistant" else [0] * t["tokens"]
    assert out["response_mask"][0].tolist() == want + [0] * (R - len(want))
    # the model's three tokens are the moves, each env turn starts with the end-of-turn token
    moves = [i for i, m in enumerate(want) if m]
    assert tok.decode(out["responses"][0, moves]) == "U?L"
    assert out["responses"][0, moves[0] + 1].item() == eng.eos_ids[0]
    assert tok.decode(
        out["responses"][0, moves[0] + 1 : moves[1]]
    ) == "<|im_end|>\n<|im_start|>user\n.P.\n...\n...<|im_end|>\n<|im_start|>assistant\n".replace(".P.", "GP.", 1)
    assert torch.equal(out["tool_mask"][0], out["attention_mask"][0, P:] - out["response_mask"][0])
    assert out["__num_turns__"] == [7, 7] and out["tool_call_counts"] == [0, 0]


def test_gsm8k_interaction_trajectory_goes_on_until_the_answer_is_right(model_and_tokenizer):
    model, tok = model_and_tokenizer
    eng = HFRollout(model, tok, seed=0)
    gsm = Gsm8kInteraction({"name": "gsm8k"})
    seen = []
    original = gsm.generate_response

    def spy(instance_id, messages, **kwargs):
        seen.append([m["role"] for m in messages])
        return original(instance_id, messages, **kwargs)

    gsm.generate_response = spy
    scripts = {"q0": ["#### 4", "#### 5"]}
    loop = AgentLoop(
        model,
        tok,
        {},
        section(MULTI_TURN, {"max_assistant_turns": 4}),
        eos_ids=eng.eos_ids,
        pad_id=eng.pad_id,
        suppress_ids=eng.suppress_ids,
        interactions={"gsm8k": gsm},
        pick_factory=scripted(tok, eng.eos_ids[0], scripts),
    )
    extra = [{"interaction_kwargs": {"name": "gsm8k", "ground_truth": "5"}}]
    out = loop.run(
        prompts(tok, eng.pad_id, [[{"role": "user", "content": "2+3?"}]], extra), SamplingParams(n=1, max_new_tokens=R)
    )
    turns = out["agent_turns"][0]
    assert [t["role"] for t in turns] == ["assistant", "user", "assistant", "user"]
    assert turns[1]["content"] == WRONG and turns[3]["content"] == RIGHT
    assert out["turn_scores"] == [[0.0, 1.0]]
    assert seen == [["user", "assistant"], ["user", "assistant", "user", "assistant"]]
    n1, n2, n3 = turns[0]["tokens"], turns[1]["tokens"], turns[2]["tokens"]
    assert out["response_mask"][0, : n1 + n2 + n3 + turns[3]["tokens"] + 2].tolist() == [1] * n1 + [0] * n2 + [
        1
    ] * n3 + [0] * turns[3]["tokens"] + [0, 0]
    assert gsm._state == {}  # finalize_interaction ran


def test_a_row_without_a_known_interaction_stops_the_rollout(model_and_tokenizer):
    model, tok = model_and_tokenizer
    eng = HFRollout(model, tok, seed=0)
    loop = AgentLoop(
        model,
        tok,
        {},
        section(MULTI_TURN),
        eos_ids=eng.eos_ids,
        pad_id=eng.pad_id,
        interactions={"gsm8k": Gsm8kInteraction({})},
    )
    batch = prompts(tok, eng.pad_id, [[{"role": "user", "content": "x"}]], [{"interaction_kwargs": {"name": "b"}}])
    with pytest.raises(UserError, match="interaction_kwargs.name is 'b'"):
        loop.run(batch, SamplingParams(n=1, max_new_tokens=8))


def test_the_reward_gets_the_turn_scores_in_extra_info():
    from verl_npu.rewards import default_compute_score
    from verl_npu.trainer.ppo import multi_turn_extra_info

    batch = Batch(
        {},
        {
            "extra_info": [{"index": 0}],
            "agent_turns": [[]],
            "turn_scores": [[-0.1, 1.0]],
            "tool_rewards": [[]],
            "interaction_info": [{"success": True}],
            "__num_turns__": [5],
        },
    )
    info = multi_turn_extra_info(batch)[0]
    assert info == {
        "index": 0,
        "turn_scores": [-0.1, 1.0],
        "tool_rewards": [],
        "interaction": {"success": True},
        "num_turns": 5,
    }
    got = default_compute_score("grid_env", "", "UL", info)
    assert got == {"score": pytest.approx(0.9), "accuracy": 1.0, "invalid_moves": 1.0}


def test_tiny_grid_env_runs_two_steps_end_to_end(tmp_path):
    """recipes/tiny_grid_env.yaml for 2 small steps: data made by data_prep's function, the interaction
    built from its config file, per-turn scores in the reward and in the trajectory dump."""
    import json

    from verl_npu.config import load_recipe
    from verl_npu.data.grid_env import prepare_synthetic
    from verl_npu.trainer.entry import run_training

    data = tmp_path / "data"
    prepare_synthetic(data, 8, 4)
    values = {
        "af_output_dir": tmp_path / "out",
        "data.train_files": data / "train.parquet",
        "data.val_files": data / "test.parquet",
        "data.train_batch_size": 4,
        "actor_rollout_ref.rollout.n": 2,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8,
        "trainer.total_training_steps": 2,
        "trainer.test_freq": 2,
        "trainer.save_freq": -1,
        "trainer.logger": "[console]",
        "trainer.rollout_data_dir": tmp_path / "rollouts",
        "trainer.validation_data_dir": tmp_path / "validation",
    }
    rc = load_recipe("tiny_grid_env", [f"{k}={v}" for k, v in values.items()])
    assert run_training(rc) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "critic/score/mean" in r]
    assert len(train) == 2
    for r in train:
        assert r["num_turns/min"] >= 3 and r["response_length/max"] <= 3  # one token per model turn, 3 steps
        assert "critic/score/accuracy/mean" in r and "critic/score/invalid_moves/mean" in r
    assert "val-aux/grid_env/accuracy/mean@1" in rows[-1]
    dumped = [json.loads(line) for line in (tmp_path / "rollouts" / "1.jsonl").read_text().splitlines()]
    assert len(dumped) == 8
    for d in dumped:
        users = [t for t in d["turns"] if t["role"] == "user"]
        assert d["turn_scores"] == [t["score"] for t in users] and all(not t["trained"] for t in users)
        assert d["score"] == pytest.approx(sum(d["turn_scores"]), abs=1e-6)
    # the validation dump (rows without a uid: named by their place) shows the turns too
    val = [json.loads(line) for line in (tmp_path / "validation" / "2.jsonl").read_text().splitlines()]
    assert [d["uid"] for d in val] == [f"val-{i}-0" for i in range(4)]
    assert all(d["turns"][0]["role"] == "assistant" and d["turn_scores"] for d in val)


def test_validate_check_paths_names_the_interaction_file_and_key(tmp_path):
    from verl_npu.config import check_paths, load_recipe

    bad = write(tmp_path, "interaction:\n  - class_name: grid_env\n    config: {max_traj_per_env: 4}\n")
    rc = load_recipe("tiny_grid_env", [f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={bad}"])
    problems = [str(p) for p in check_paths(rc)]
    assert any(
        "multi_turn.interaction_config_path" in p
        and f"{bad}: interaction[0].config.max_traj_per_env" in p
        and "not built" in p
        for p in problems
    ), problems


def test_sokoban_rows_play_through_the_interaction(tmp_path):
    """data_prep's sokoban rows: the prompt is the first observation, the row's kwargs rebuild that room,
    and its ground truth (a shortest solution) wins the episode."""
    import pyarrow.parquet as pq

    from verl_npu.data.grid_env import prepare_synthetic

    paths = prepare_synthetic(tmp_path, 3, 1, env="sokoban", layout="random", max_steps=8)["paths"]
    for row in pq.read_table(paths["train"]).to_pylist():
        it = GridEnvInteraction({"name": "grid_env", "max_steps": 12})  # not the rows' limit: same room
        iid = it.start_interaction(
            "t", **{k: v for k, v in row["extra_info"]["interaction_kwargs"].items() if v is not None}
        )
        assert it._envs[iid].render() == row["prompt"][-1]["content"]
        for move in row["reward_model"]["ground_truth"]:
            done, _, score, meta = it.generate_response(iid, [{"role": "assistant", "content": move}])
        assert done and score == 1.0 and meta["success"]
