"""Write Search-R1 question answering for the search tool (verl's Search-R1 format; --synthetic N also writes
its corpus for `verl-npu retrieval-server`). Run with --help for the options."""

from _entry import run  # data_prep/_entry.py: names the Python to use when verl_npu is missing

if __name__ == "__main__":
    run("verl_npu.data.search_r1")
