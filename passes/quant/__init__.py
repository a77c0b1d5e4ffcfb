"""Passes that quantize weights."""
