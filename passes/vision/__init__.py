"""Passes that change what the vision component hands the LLM."""
