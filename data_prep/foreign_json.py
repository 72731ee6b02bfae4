"""Trinity-RFT tasksets and ROLL data files (JSON / JSONL / parquet) -> verl RL parquet. Run with --help."""

from _entry import run  # data_prep/_entry.py: names the Python to use when verl_npu is missing

if __name__ == "__main__":
    run("verl_npu.data.foreign_json")
