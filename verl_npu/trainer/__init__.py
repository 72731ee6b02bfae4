"""The single-controller PPO/GRPO loop, checkpoints and run tracking."""
