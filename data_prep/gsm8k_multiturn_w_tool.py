"""Write GSM8K for multi-turn rollout with the GSM8K tool (verl's multi-turn format). Run with --help for the options."""

from _entry import run  # data_prep/_entry.py: names the Python to use when verl_npu is missing

if __name__ == "__main__":
    run("verl_npu.data.gsm8k_multiturn")
