"""Progress for long steps, shown only to a person: on a terminal, never under --json, in pipes or in CI logs.

Every long loop (calibration batches, eval samples, passes, nightly recipes, profile rounds) goes through
`track`, and every long step without a loop through `stage`, so one switch decides for the whole program.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

_quiet = False


def set_quiet(quiet: bool) -> None:
    """The CLI calls this with True under --json, so machine-readable output stays clean."""
    global _quiet
    _quiet = quiet


def enabled() -> bool:
    if _quiet or os.environ.get("CI") or os.environ.get("MMTRT_NO_PROGRESS"):
        return False
    return sys.stderr.isatty()


def track(items: Iterable[T], desc: str, total: int | None = None) -> Iterator[T]:
    """Iterate `items`, drawing a bar on stderr when a person is watching."""
    if not enabled():
        yield from items
        return
    from tqdm import tqdm

    with tqdm(items, desc=desc, total=total, file=sys.stderr, leave=False, dynamic_ncols=True) as bar:
        yield from bar


@contextmanager
def stage(desc: str) -> Iterator[None]:
    """One line on stderr when a long step without a loop starts and when it ends."""
    if not enabled():
        yield
        return
    import time

    start = time.perf_counter()
    print(f"mmtrt: {desc} ...", file=sys.stderr, flush=True)
    yield
    print(f"mmtrt: {desc} done in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


def quiet_libraries() -> None:
    """Third-party bars follow the same switch as ours: transformers' weight loading, and its GGUF conversion
    (a bare tqdm, so its module's `tqdm` is replaced by a disabled one)."""
    if enabled():
        return
    from functools import partial

    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if not isinstance(gguf_utils.tqdm, partial):
        gguf_utils.tqdm = partial(gguf_utils.tqdm, disable=True)
