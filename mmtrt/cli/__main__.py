"""`python -m mmtrt.cli`."""

from mmtrt.cli import run_as_module

run_as_module()
