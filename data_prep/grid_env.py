"""Write grid-environment episodes (FrozenLake-like / Sokoban-like) for the grid_env interaction. Run with --help."""

from _entry import run  # data_prep/_entry.py: names the Python to use when verl_npu is missing

if __name__ == "__main__":
    run("verl_npu.data.grid_env")
