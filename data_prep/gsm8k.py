"""Write GSM8K as RL parquet files. Run with --help for the options."""

from verl_npu.data.gsm8k import main

if __name__ == "__main__":
    main()
