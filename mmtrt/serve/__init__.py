"""Serving above the runtime: Triton Inference Server through PyTriton, the OpenAI-compatible endpoint, and the
Triton model repository export. Imports nothing heavy until a command runs."""
