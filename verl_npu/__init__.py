"""verl-npu: RL post-training recipes for LLMs and VLMs on Ascend NPU, CUDA and CPU."""

__version__ = "0.1.0"
