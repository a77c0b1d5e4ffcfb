"""Accuracy recovery after lossy passes: distillation of the compiled model towards its source model."""
