"""Write Geometry3K (or --synthetic N polygons) as RL parquet files. Run with --help for the options."""

from verl_npu.data.geometry3k import main

if __name__ == "__main__":
    main()
