"""A request submitted to the serving loop, as its caller holds it: its deltas, its result, its cancel."""

from __future__ import annotations

import threading
import time
from queue import SimpleQueue
from typing import Callable, Iterator

from mmtrt.runtime.batch import Prepared
from mmtrt.runtime.streaming import Delta


class Handle:
    """One submitted request. Iterate it for its `Delta`s (the last has a finish_reason; a request that failed
    inside the loop raises its error instead), or wait for `result()`. With a callback, the callback gets every
    Delta (an error as finish_reason "error" with its message) and iterating gets none."""

    def __init__(self, loop, prep: Prepared, on_delta: Callable[[Delta], None] | None):
        self.loop, self.prep, self.on_delta = loop, prep, on_delta
        self.id, self.prompt_tokens = prep.index, len(prep.ids)
        self.seq = None
        self.finish_reason: str | None = None
        self.generation = None  # a runtime.pipeline.Generation once finished (not after an error)
        self.error: BaseException | None = None
        self.submitted = time.monotonic()
        self.time_to_first_token_s: float | None = None
        self._deltas: SimpleQueue[Delta] = SimpleQueue()
        self._done = threading.Event()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def __iter__(self) -> Iterator[Delta]:
        while True:
            delta = self._deltas.get()
            if delta.finish_reason == "error":
                raise self.error
            yield delta
            if delta.finish_reason:
                return

    def cancel(self, timeout: float | None = 30) -> None:
        """Stop the request: its KV blocks (or row) are free when this returns (on the loop's thread, at once)."""
        self.loop._cancel(self, timeout)

    def result(self, timeout: float | None = None):
        """The finished request's Generation (finish_reason "abort" when cancelled); its error if it failed."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} is still running")
        if self.error is not None:
            raise self.error
        return self.generation
