"""verl's name for data_prep/geometry3k.py (same options): Geometry3K, or --synthetic N polygons, as RL parquet.

Upstream verl's script is examples/data_preprocess/geo3k.py; this file lets the name typed from habit work.
"""

from verl_npu.data.geometry3k import main

if __name__ == "__main__":
    main()
