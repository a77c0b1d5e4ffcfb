"""Passes that choose the numeric types a component runs in."""
