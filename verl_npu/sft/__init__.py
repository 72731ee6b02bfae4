"""Supervised fine-tuning (verl 0.9.1's engine SFT trainer, in its keys): a role over the shared training engine
(`worker.py`) and the SPMD step loop with validation, checkpoints and resume (`loop.py`); docs/sft.md."""
