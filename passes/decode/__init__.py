"""Passes that change how the LLM decodes."""
