"""Passes that choose how the LLM stores its KV cache."""
