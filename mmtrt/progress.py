"""Progress for long steps, shown only to a person: on a terminal, never under --json, in pipes or in CI logs.

Every long loop (calibration batches, eval samples, passes, nightly recipes, profile rounds) goes through
`track`, and every long step without a loop through `stage`, so one switch decides for the whole program. A stage
with a `key` records how long it took in the user's cache folder, and the next run of the same step (the same
model shapes, the same pass config) shows that time as its estimate.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_quiet = False
TICK_S = 1.0
TIMES_FILE = "step_times.json"


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

    _Ticker.end_line()
    with tqdm(items, desc=desc, total=total, file=sys.stderr, leave=False, dynamic_ncols=True) as bar:
        yield from bar


def duration(seconds: float) -> str:
    """`0.4 s`, `42 s`, `3 min 5 s`: how long a step took or will take."""
    if seconds < 1:
        return f"{seconds:.1f} s"
    seconds = round(seconds)
    return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min {seconds % 60} s"


@contextmanager
def stage(desc: str, key: str | None = None) -> Iterator[None]:
    """One line on stderr for a long step: what it is, the last run's time as the estimate (given a `key`), the
    elapsed time while it runs, and how long it took."""
    start = time.perf_counter()
    estimate = _recorded(key) if key else None
    ticker = None
    if enabled():
        about = f" (about {duration(estimate)}, as last time)" if estimate is not None else ""
        ticker = _Ticker(f"mmtrt: {desc}{about} ...")
    try:
        yield
    except BaseException:
        if ticker:
            ticker.finish("")
        raise
    took = time.perf_counter() - start
    if ticker and not ticker.finish(f" done in {duration(took)}"):
        print(f"mmtrt: {desc} done in {duration(took)}", file=sys.stderr, flush=True)
    if key:
        _record(key, took)


class _Ticker(threading.Thread):
    """Redraws a stage's line with the elapsed time until the stage ends or something else draws on stderr (a
    nested stage, a bar), which ends the line where it is."""

    current: _Ticker | None = None

    def __init__(self, line: str):
        super().__init__(daemon=True)
        _Ticker.end_line()
        self.line, self.started, self.done = line, time.perf_counter(), threading.Event()
        print(line, file=sys.stderr, end="", flush=True)
        _Ticker.current = self
        self.start()

    def run(self) -> None:
        while not self.done.wait(TICK_S):
            print(f"\r{self.line} {duration(time.perf_counter() - self.started)}", file=sys.stderr, end="",
                  flush=True)

    def _halt(self) -> None:
        self.done.set()
        self.join()
        _Ticker.current = None

    def finish(self, suffix: str) -> bool:
        """End the line with `suffix` if it is still this stage's; False when something else ended it."""
        if _Ticker.current is not self:
            return False
        self._halt()
        print(f"\r{self.line}{suffix}", file=sys.stderr, flush=True)
        return True

    @staticmethod
    def end_line() -> None:
        """Stop the running stage's ticker and end its line, so the next output starts on a line of its own."""
        ticker = _Ticker.current
        if ticker:
            ticker._halt()
            print(file=sys.stderr, flush=True)


def facts_digest(facts: dict) -> str:
    """A key for steps whose time follows the model's shapes (layers, sizes, image tokens), not its weights."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _times_path() -> Path:
    from mmtrt.bundle.verify import cache_folder

    return cache_folder() / TIMES_FILE


def _read_times() -> dict[str, float]:
    try:
        times = json.loads(_times_path().read_text())
    except (OSError, ValueError):
        return {}
    return times if isinstance(times, dict) else {}


def _recorded(key: str) -> float | None:
    value = _read_times().get(key)
    return value if isinstance(value, (int, float)) else None


def _record(key: str, seconds: float) -> None:
    """Best effort: an unwritable cache folder costs the estimate next time, nothing else."""
    times = {**_read_times(), key: round(seconds, 1)}
    path = _times_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(times, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass


def quiet_libraries() -> None:
    """Third-party bars stay off: transformers' weight loading, and its GGUF conversion (a bare tqdm, so its
    module's `tqdm` is replaced by a disabled one). Our stages show those steps, and a second bar drawn on the
    stage's line would garble it."""
    from functools import partial

    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if not isinstance(gguf_utils.tqdm, partial):
        gguf_utils.tqdm = partial(gguf_utils.tqdm, disable=True)
