"""The serving loop: continuous batching for served traffic, on a thread of its own.

`submit` checks a request on the caller's thread (token limit, sampling values, prompt, images: a UserError at
once) and queues it in a bounded queue (`QueueFull` when full, so an overloaded server refuses rather than times
out): it holds `max_queue` requests beyond the batch places free now, since a burst that fits the free places is
no overload. Between decode steps the loop thread cancels what was cancelled, admits queued requests while the
scheduler has places (the vision encoder runs then, the encoder and image-prefix caches shared by every request;
the prefills of the admitted ones in one LLM call where the KV layout allows it), and decodes one token for every
running sequence. While sequences run, an admission's any-resolution image is encoded a tile per call and its
prefill runs in pieces, each followed by their decode step, so an admission never stalls them for long. Each step's `Delta`s go to the requests' handles (iterate one) or callbacks.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from mmtrt.errors import UserError
from mmtrt.runtime.batch import Request, Sequence
from mmtrt.runtime.sampling import SamplingParams
from mmtrt.runtime.scheduler import Scheduler
from mmtrt.runtime.serving_handle import Handle
from mmtrt.runtime.streaming import Delta


class Unavailable(RuntimeError):
    """The loop takes no request now (HTTP 503): it is draining or closed."""


class QueueFull(Unavailable):
    """The bounded queue is full (HTTP 429): retry later or scale out."""


@dataclass(frozen=True)
class Metrics:
    queued: int
    running: int
    kv_blocks_used: int  # paged: blocks of the pool; static: rows of the buffers; hf: running sequences
    kv_blocks_total: int
    requests_finished: int  # every reason: stop, length, abort, error
    requests_refused: int  # QueueFull and Unavailable at submit
    tokens_generated: int
    time_to_first_token_s: float | None  # mean over the requests that got a first token
    tokens_per_s: float | None  # tokens generated per second of the loop's busy time (some sequence running)
    encoder_cache_hits: int = 0  # images whose features came from the encoder cache
    encoder_cache_misses: int = 0  # images the vision encoder ran for (the cache on)
    encoder_cache_bytes: int = 0
    speculative_acceptance: float | None = None  # drafted tokens accepted / proposed so far (None: no draft ran)


class ServingLoop:
    """Continuous batching over one loaded pipeline (it holds the pipeline's KV cache until `close`)."""

    def __init__(self, pipeline, max_batch: int | None = None, max_queue: int = 64, batch_admissions: bool = True,
                 scheduler=None):
        """`batch_admissions`: the requests waiting between two decode steps are prefilled in one LLM call where
        the KV layout allows it (paged); off, each is prefilled alone. `scheduler`: one with Scheduler's interface
        that runs the LLM elsewhere (mmtrt.handoff's vLLM)."""
        self.pipe, self.max_queue, self.batch_admissions = pipeline, max_queue, batch_admissions
        self.scheduler = scheduler or Scheduler(pipeline, max_batch, text=True)
        self._cv = threading.Condition()
        self._queue: deque[Handle] = deque()
        self._cancelled: list[Handle] = []
        self._running: dict[int, Handle] = {}
        self._state = "open"  # then "draining" (no new requests), "closed", or "stopped" by a fault of the loop
        self._ids = itertools.count()
        self._counts = dict(finished=0, refused=0, tokens=0, first_tokens=0)
        self._ttft_sum = self._busy_s = 0.0
        self._usage = self.scheduler.usage()
        self._thread = threading.Thread(target=self._run, name="mmtrt-serving-loop", daemon=True)
        self._thread.start()

    def submit(self, request: Request, sampling: SamplingParams | None = None,
               on_delta: Callable[[Delta], None] | None = None) -> Handle:
        """Queue a request (`sampling` replaces the request's own). Raises UserError for a bad request (bad
        sampling values even when the queue is full), QueueFull or Unavailable when the loop takes none now. `on_delta` runs on the loop's thread: keep it short."""
        if sampling is not None:
            request = dataclasses.replace(request, sampling=sampling)
        (request.sampling or SamplingParams()).validate(self.pipe.manifest["envelope"]["max_new_tokens"])
        self._refuse_if_unavailable()
        handle = Handle(self, self.pipe.check(next(self._ids), request), on_delta)
        with self._cv:
            self._refuse_if_unavailable()
            self._queue.append(handle)
            self._cv.notify_all()
        return handle

    def metrics(self) -> Metrics:
        with self._cv:
            c = self._counts
            used, total = self._usage
            cache = self.pipe.encoder_cache
            return Metrics(len(self._queue), len(self._running), used, total, c["finished"], c["refused"],
                           c["tokens"], self._ttft_sum / c["first_tokens"] if c["first_tokens"] else None,
                           c["tokens"] / self._busy_s if self._busy_s else None, cache.hits, cache.misses,
                           cache.nbytes, self._acceptance())

    def _acceptance(self) -> float | None:
        speculator = getattr(self.scheduler, "speculator", None)  # a vLLM scheduler drafts nothing of ours
        return speculator.totals.rate if speculator else None

    def drain(self, timeout: float | None = None) -> bool:
        """Refuse new requests; wait until the queued and running ones have finished. False on timeout."""
        with self._cv:
            if self._state == "open":
                self._state = "draining"
            return self._cv.wait_for(lambda: not self._queue and not self._running, timeout)

    def close(self) -> None:
        """Stop: queued and running requests end with finish_reason "abort"; the pipeline is free again."""
        with self._cv:
            if self._state == "closed":
                return
            self._state = "closed"
            self._cv.notify_all()
        self._thread.join()
        self.scheduler.close()

    def __enter__(self) -> ServingLoop:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _refuse_if_unavailable(self) -> None:
        with self._cv:
            if self._state != "open":
                self._counts["refused"] += 1
                raise Unavailable(f"the server is {self._state} and takes no new requests")
            if len(self._queue) >= self.max_queue + self._free_places():
                self._counts["refused"] += 1
                raise QueueFull(f"the queue holds {len(self._queue)} requests already; retry later")

    def _free_places(self) -> int:
        """Batch places no request holds or waits for: a burst that fits them is admitted, not refused."""
        return max(self.scheduler.max_batch - len(self._running), 0)

    def _cancel(self, handle: Handle, timeout: float | None) -> None:
        with self._cv:
            if handle.done:
                return
            if handle in self._queue:
                self._queue.remove(handle)
                handle.generation = self.pipe.generation(Sequence(handle.prep, finish_reason="abort"))
                self._finish(handle, Delta((), "", "abort"))
                return
            self._cancelled.append(handle)
            self._cv.notify_all()
        if threading.current_thread() is not self._thread:
            handle._done.wait(timeout)

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # a fault of the loop itself: no request waits forever for it
            with self._cv:
                self._state = "stopped"  # close() still frees the pipeline
                waiting, self._queue = list(self._queue), deque()
            for handle in waiting + list(self._running.values()):
                if not handle.done:
                    self._fail(handle, exc)
            raise

    def _serve(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._cancelled or self._running or self._state == "closed")
                if self._state == "closed":
                    break
                cancelled, self._cancelled = self._cancelled, []
            for handle in cancelled:
                self._abort(handle)
            started = time.monotonic()
            self._admit()
            self._step()
            with self._cv:
                self._busy_s += time.monotonic() - started if self._running else 0.0
                self._usage = self.scheduler.usage()
                self._cv.notify_all()
        with self._cv:
            waiting, self._queue = list(self._queue), deque()
        for handle in waiting + list(self._running.values()):
            self._abort(handle)

    def _admit(self) -> None:
        while group := self._take_admissions():
            embedded = []
            for handle in group:
                try:
                    between = self._step if self.scheduler.active else None
                    embedded.append((handle, self.pipe.embed_request(handle.prep, between=between)))
                except Exception as exc:  # this request's failure (its places are already free); the others run on
                    self._fail(handle, exc)
            if not embedded:
                continue
            try:
                events = self.scheduler.admit_together([prep for _, prep in embedded], between=self._step)
            except Exception as exc:  # the call's requests fail (their places are free again); the others run on
                for handle, _ in embedded:
                    self._fail(handle, exc)
                continue
            for (handle, _), (seq, delta) in zip(embedded, events):
                handle.seq = seq
                self._deliver(handle, delta)

    def _take_admissions(self) -> list[Handle]:
        """The queued requests admitted in one prefill call next: from the head on, while each fits beside the
        ones before it (one at a time where the layout or `batch_admissions` does not batch them)."""
        with self._cv:
            group: list[Handle] = []
            while self._queue:
                prep, joining = self._queue[0].prep, tuple(h.prep for h in group)
                if group and not (self.batch_admissions and self.scheduler.joins(prep, joining)):
                    break
                if not self.scheduler.fits(prep, joining):
                    if group or self.scheduler.active:
                        break  # it waits for places to free up
                    handle = self._queue.popleft()  # it would wait forever
                    self._fail(handle, UserError("the request needs more KV cache than the bundle has free"))
                    continue
                group.append(self._queue.popleft())
                self._running[group[-1].id] = group[-1]  # drain waits for it from here on
            return group

    def _step(self) -> None:
        try:
            events = self.scheduler.step()
        except Exception as exc:  # the step's sequences cannot go on; each gets the error
            for handle in list(self._running.values()):
                if handle.seq in self.scheduler.active:
                    self.scheduler.release(handle.seq)
                self._fail(handle, exc)
            return
        for seq, delta in events:
            self._deliver(self._running[seq.prep.index], delta)

    def _deliver(self, handle: Handle, delta: Delta) -> None:
        with self._cv:
            self._counts["tokens"] += len(delta.token_ids)
            if handle.time_to_first_token_s is None and delta.token_ids:
                handle.time_to_first_token_s = time.monotonic() - handle.submitted
                self._counts["first_tokens"] += 1
                self._ttft_sum += handle.time_to_first_token_s
            if delta.finish_reason:
                handle.generation = self.pipe.generation(handle.seq)
                self._running.pop(handle.id, None)
        try:
            self._finish(handle, delta) if delta.finish_reason else self._send(handle, delta)
        except Exception:  # a callback that fails loses its request, not the loop
            if not handle.done:
                self._abort(handle)

    def _abort(self, handle: Handle) -> None:
        """Cancel a request the loop holds: its place is freed before anything else runs."""
        if handle.done:
            return
        if handle.seq is not None and handle.seq in self.scheduler.active:
            self.scheduler.release(handle.seq)
        if handle.seq is not None:
            handle.seq.finish_reason = "abort"
            handle.generation = self.pipe.generation(handle.seq)
        with self._cv:
            self._running.pop(handle.id, None)
        self._finish(handle, Delta((), "", "abort"))

    def _fail(self, handle: Handle, exc: BaseException) -> None:
        handle.error = exc
        with self._cv:
            self._running.pop(handle.id, None)
        self._finish(handle, Delta((), "", "error", str(exc)))

    def _finish(self, handle: Handle, delta: Delta) -> None:
        handle.finish_reason = delta.finish_reason
        with self._cv:
            self._counts["finished"] += 1
            self._usage = self.scheduler.usage()  # its place is free already: drain's waiter sees it so
            self._cv.notify_all()
        try:
            self._send(handle, delta)
        finally:
            handle._done.set()

    def _send(self, handle: Handle, delta: Delta) -> None:
        if handle.on_delta is not None:
            handle.on_delta(delta)
        else:
            handle._deltas.put(delta)
