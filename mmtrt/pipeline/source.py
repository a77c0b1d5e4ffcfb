"""The source PyTorch model, current while the passes run, for passes that train against it (recover)."""

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
