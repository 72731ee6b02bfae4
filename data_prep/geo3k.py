"""verl's name for data_prep/geometry3k.py (same options): Geometry3K, or --synthetic N polygons, as RL parquet.

Upstream verl's script is examples/data_preprocess/geo3k.py; this file lets the name typed from habit work.
"""

from _entry import run  # data_prep/_entry.py: names the Python to use when verl_npu is missing

if __name__ == "__main__":
    run("verl_npu.data.geometry3k")
