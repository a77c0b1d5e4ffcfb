"""Passes that fit parameters back after lossy passes."""
