"""Passes that remove structure (channels, heads) from the model."""
