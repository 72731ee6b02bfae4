"""The memory planner (`verl-npu plan`, docs/memory.md): per-device memory formulas (`plan`: weights,
gradients, AdamW, activations, logits, KV cache) and the plan of a resolved recipe (`recipe`: phases,
host figure, verdict, knobs). Reads a resolved config; imports no torch."""
