"""Lossless passes that remove work without changing any output."""
