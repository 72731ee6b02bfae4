"""Grid-environment rows for multi-turn rollout with the `grid_env` interaction (`data_prep/grid_env.py`).

Each row is one environment episode in verl's multi-turn format:

    data_source   "grid_env"                      (reward: verl_npu.rewards.grid_env)
    prompt        [{"role": "system", "content": <the game's rules>}, {"role": "user", "content": <first observation>}]
    agent_name    "tool_agent"                    (the multi-turn agent loop; interactions run in it, as in verl)
    reward_model  {"style": "rule", "ground_truth": <a shortest solution, e.g. "UL">}
    extra_info    {split, index, interaction_kwargs: {name: "grid_env", env, seed, size, map}}

`interaction_kwargs` is what the interaction's `start_interaction` receives: the environment, its seed and
options; every sample of a row (`rollout.n`) plays that seed (GRPO's group). Layouts (`--layout`):

- `random` (default): the environment's own seeded maps (`--env frozen_lake` or `sokoban`, `--size`), row i
  of a split has seed `<seed> * 1_000_003 + <split offset> + i`;
- `corners` (the CPU demo, frozen_lake only): a 3x3 lake, start in the middle, the goal in one of the four
  corners (4 maps, each shortest solution two moves), observations the goal's direction alone (`show_goal: direction`, `show_grid: false`, e.g.
  `G: U L`), no system message;
- `corners_holes`: those four plus, for each, a hole on one of the two shortest paths (12 maps: the hole
  decides the order of the two moves).
"""

from __future__ import annotations

import argparse
import os
import random

import pyarrow as pa

from verl_npu.data.split_files import write_split_files
from verl_npu.tools.envs import env_class, make_env
from verl_npu.tools.envs.frozen_lake import corner_maps

DATA_SOURCE = "grid_env"
AGENT_NAME = "tool_agent"
INTERACTION = "grid_env"
LAYOUTS = ("random", "corners", "corners_holes")


def episode_row(
    split: str, index: int, env: str, seed: int, size: int | None, layout_map: list[str] | None, max_steps: int
) -> dict:
    options = {"map": layout_map} if layout_map is not None else ({"size": size} if size else {})
    # the demo layouts observe the goal's direction alone (FrozenLake's show_goal, show_grid: false) and
    # have no system message: a short context is what a random-init model learns to read in minutes
    show = "direction" if layout_map is not None else None
    if show:
        options.update(show_goal=show, show_grid=False)
    game = make_env(env, seed, max_steps=max_steps, **options)
    first = game.reset()
    solution = game.shortest_path() if hasattr(game, "shortest_path") else game.solve()
    return {
        "data_source": DATA_SOURCE,
        "prompt": ([] if show else [{"role": "system", "content": env_class(env).RULES}])
        + [{"role": "user", "content": first}],
        "ability": "agent",
        "reward_model": {"style": "rule", "ground_truth": "".join(solution or [])},
        "extra_info": {
            "split": split,
            "index": index,
            "interaction_kwargs": {
                "name": INTERACTION,
                "env": env,
                "seed": seed,
                "size": size,
                "map": layout_map,
                "show_goal": show,
                "show_grid": False if show else None,
            },
        },
        "agent_name": AGENT_NAME,
    }


def schema() -> pa.Schema:
    msg = pa.struct([("role", pa.string()), ("content", pa.string())])
    kwargs = pa.struct(
        [
            ("name", pa.string()),
            ("env", pa.string()),
            ("seed", pa.int64()),
            ("size", pa.int64()),
            ("map", pa.list_(pa.string())),
            ("show_goal", pa.string()),
            ("show_grid", pa.bool_()),
        ]
    )
    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(msg)),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64()), ("interaction_kwargs", kwargs)])),
            ("agent_name", pa.string()),
        ]
    )


def rows(
    split: str,
    n: int,
    seed: int,
    env: str = "frozen_lake",
    layout: str = "random",
    size: int | None = None,
    max_steps: int = 8,
) -> list[dict]:
    """`n` rows of one split (see the module docstring for the layouts and seeds)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    if layout != "random":
        if env != "frozen_lake":
            raise ValueError(f"layout {layout!r} is a frozen_lake layout")
        maps = corner_maps(holes=layout == "corners_holes")
        rng = random.Random(f"grid_env:{split}:{seed}")
        # balanced: every map equally often, in a seeded order
        order = [maps[i % len(maps)] for i in range(n)]
        rng.shuffle(order)
        return [episode_row(split, i, env, seed, None, m, max_steps) for i, m in enumerate(order)]
    offset = 0 if split == "train" else 500_000
    return [episode_row(split, i, env, seed * 1_000_003 + offset + i, size, None, max_steps) for i in range(n)]


def prepare_synthetic(
    save_dir,
    n_train: int,
    n_test: int,
    seed: int = 0,
    progress: bool = False,
    env: str = "frozen_lake",
    layout: str = "corners",
    size: int | None = None,
    max_steps: int = 3,
) -> dict:
    """Write `<save_dir>/{train,test}.parquet`; returns {"paths": {split: path}, "rows": {split: n}}
    (the demo-data writer's contract, verl_npu/demo.py). Defaults: the CPU demo's corner maps."""
    return write_split_files(
        save_dir,
        (
            (split, rows(split, n, seed, env, layout, size, max_steps))
            for split, n in (("train", n_train), ("test", n_test))
        ),
        schema(),
        progress=progress,
    )


def main(argv: list[str] | None = None) -> None:
    """CLI entry point of ``data_prep/grid_env.py``."""
    p = argparse.ArgumentParser(
        prog="data_prep/grid_env.py",
        description=(
            "Write grid-environment episodes (FrozenLake-like or Sokoban-like) as multi-turn RL parquet files for the "
            "grid_env interaction: train.parquet, test.parquet. No network."
        ),
    )
    p.add_argument("--synthetic", type=int, default=512, metavar="N", help="train rows (default 512)")
    p.add_argument("--test-rows", type=int, default=64, help="test rows (default 64)")
    p.add_argument("--local-save-dir", default="~/data/grid_env", help="output folder (default ~/data/grid_env)")
    p.add_argument("--env", default="frozen_lake", choices=("frozen_lake", "sokoban"))
    p.add_argument(
        "--layout",
        default="random",
        choices=LAYOUTS,
        help="random: seeded maps; corners / corners_holes: the CPU demo's 3x3 maps (frozen_lake)",
    )
    p.add_argument("--size", type=int, default=None, help="grid size for --layout random (default: the env's)")
    p.add_argument("--max-steps", type=int, default=8, help="the episode step limit the rows are written for")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--dry-run", "--dry_run", dest="dry_run", action="store_true", help="say what would be written, write nothing"
    )
    args = p.parse_args(argv)
    if args.dry_run:
        print(
            f"would write {args.synthetic} train / {args.test_rows} test {args.env} episodes (layout {args.layout}, "
            f"seed {args.seed}) to {os.path.expanduser(args.local_save_dir)}/{{train,test}}.parquet"
        )
        return
    prepare_synthetic(
        args.local_save_dir,
        args.synthetic,
        args.test_rows,
        seed=args.seed,
        progress=True,
        env=args.env,
        layout=args.layout,
        size=args.size,
        max_steps=args.max_steps,
    )
