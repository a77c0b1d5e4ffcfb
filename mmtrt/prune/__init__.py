"""Structured pruning: dependency groups, importance, and the graph slicing that applies a decision."""
