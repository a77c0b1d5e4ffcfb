"""The source PyTorch model, current while the passes run, for passes that train or differentiate against it
(recover, awq_int4's Fisher sensitivity)."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

_current: ContextVar[tuple | None] = ContextVar("source_model", default=None)


@contextmanager
def source_model(model, processor) -> Iterator[None]:
    token = _current.set((model, processor))
    try:
        yield
    finally:
        _current.reset(token)


def current_source() -> tuple | None:
    """(model, processor) of the compile in progress, None outside one."""
    return _current.get()


@contextmanager
def frozen(module):
    """No gradient into `module`'s parameters for the duration; their flags as they were afterwards."""
    flags = [p.requires_grad for p in module.parameters()]
    for p in module.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(module.parameters(), flags):
            p.requires_grad_(flag)
