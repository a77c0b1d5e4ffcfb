"""Evaluation suites that run a bundle itself: digits accuracy, perplexity, parity with the source model."""
