"""Continuous batching over a loaded pipeline: sequences join and leave between decode steps.

`Scheduler.admit` prefills one request into a free place of the bundle's KV layout and chooses its first token;
`step` decodes one token for every running sequence in one LLM call; a sequence leaves at an end-of-sequence
token, a stop string or its token limit (or when `release`d, e.g. cancelled), and its place is free at once.
The places, per layout:
- paged: a block table per sequence (`paged.PagedCache`); admitted when a batch place is free and the pool holds
  its worst case beside what the running ones may still take; a request whose image prefix a running sequence
  holds forks that sequence's blocks and prefills only what follows the image;
- static: a row of the shared buffers; a leaving row is refilled from the last one, so rows 0..n-1 run;
- hf (no kv_layout): a grown cache per sequence, each decoded by its own LLM call in the step (any batch).
`admit_together` prefills several requests in one LLM call where the layout allows it (paged:
batched_prefill.py); a request admitted beside running ones is prefilled in pieces of `Pipeline.prefill_chunk`
tokens with a decode step of the running ones after each (chunked_prefill.py). `generate_batch`,
`Pipeline.stream` and the serving loop all drive this one class.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Iterator

import numpy as np

from mmtrt.errors import UserError
from mmtrt.runtime.batch import Prepared, Sequence
from mmtrt.runtime.batched_prefill import prefill_together
from mmtrt.runtime.chunked_prefill import chunked, chunked_own_cache
from mmtrt.runtime.paged import PagedStepper, prefill_sharing
from mmtrt.runtime.prefix import keep_prefixes, stored_prefix
from mmtrt.runtime.speculative import Speculator
from mmtrt.runtime.streaming import Delta, TextStream


class Scheduler:
    def __init__(self, pipe, max_batch: int | None = None, text: bool = False):
        """`text`: every sequence streams its text (deltas carry it); otherwise only those with stop strings.
        One scheduler at a time per pipeline (they share its KV cache): `close` lets the next one start."""
        self.pipe, self.text = pipe, text
        self.places = (Blocks(pipe) if isinstance(pipe.stepper, PagedStepper) else Rows(pipe) if pipe.stepper
                       else OwnCaches(pipe))
        if max_batch and max_batch > self.places.batch and pipe.stepper:
            raise UserError(f"max_batch {max_batch} is more than the {self.places.batch} sequences this bundle's KV "
                            "cache holds; pass at most that or recompile with a larger envelope.batch.max")
        self.max_batch = max_batch or self.places.batch
        self.speculator = Speculator(pipe, pipe.speculative) if pipe.speculative else None
        if not pipe.decoding.acquire(blocking=False):
            raise RuntimeError("this bundle is decoding already (an unfinished stream or a serving loop); finish "
                               "or close it first, or load the bundle again")
        self.eos = set(pipe.model["eos_token_ids"])
        self.active: list[Sequence] = []

    def fits(self, prep: Prepared, joining: tuple[Prepared, ...] = ()) -> bool:
        """Whether `prep` can be admitted now (a batch place, and blocks for its worst case under paged) beside
        the `joining` ones admitted with it."""
        return len(self.active) + len(joining) < self.max_batch and self.places.fits(prep, joining)

    def joins(self, prep: Prepared, joining: tuple[Prepared, ...]) -> bool:
        """Whether `prep` may be prefilled in one call with `joining`: the layout batches prefills, and no fresh
        one of them holds its image prefix (it then forks that one's blocks once it is admitted)."""
        return self.places.batches and not (prep.prefix_key and prep.prefix_key in {p.prefix_key for p in joining})

    def admit(self, prep: Prepared) -> tuple[Sequence, Delta]:
        """Prefill `prep` and choose its first token; the sequence runs unless that token already ends it."""
        return self.admit_together([prep])[0]

    def admit_together(self, preps: list[Prepared], between: Callable[[], None] | None = None
                       ) -> list[tuple[Sequence, Delta]]:
        """Prefill several requests (one LLM call where `joins` allowed them) and choose their first tokens.
        `between`: what the caller runs between the pieces of one request's prefill while others run (their
        decode step, `step`, whose events it delivers)."""
        seqs = [self._sequence(prep) for prep in preps]
        t0 = time.perf_counter()
        try:
            rows = (self.places.prefill_together(seqs) if len(seqs) > 1 else
                    [self.places.prefill(seqs[0], self.active, between if self.active else None)])
        except BaseException:
            for seq in seqs:
                self.places.close(seq)
            raise
        spent = 1e3 * (time.perf_counter() - t0)
        events = []
        for seq, logits in zip(seqs, rows):
            seq.prep.timings["prefill_ms"] = spent
            delta = self._advance(seq, logits)
            if delta.finish_reason:
                self.places.close(seq)
            else:
                self.active.append(seq)
            events.append((seq, delta))
        return events

    def _sequence(self, prep: Prepared) -> Sequence:
        seq = Sequence(prep)
        if self.text or prep.sampling.stop:
            seq.text = TextStream(self.pipe.tokenizer, prep.sampling.stop)
        return seq

    def step(self) -> list[tuple[Sequence, Delta]]:
        """One token for every running sequence; the finished ones leave."""
        if not self.active:
            return []
        events = self.speculator.step(self) if self.speculator else None
        if events is not None:
            return events
        t0 = time.perf_counter()
        logits = self.places.decode(self.active)
        spent = time.perf_counter() - t0
        events = []
        for seq, row in zip(self.active, logits):
            seq.decode_s += spent
            events.append((seq, self._advance(seq, row)))
        for seq, delta in events:
            if delta.finish_reason:
                self.release(seq)
        return events

    def release(self, seq: Sequence) -> None:
        """Take a running sequence out and free its place (its KV blocks or row) now."""
        self.places.remove(self.active, self.active.index(seq))
        self.places.close(seq)

    def close(self) -> None:
        """Free every running sequence's place and let another scheduler drive the pipeline."""
        for seq in list(self.active):
            self.release(seq)
        self.pipe.decoding.release()

    def usage(self) -> tuple[int, int]:
        """KV places in use and in all: blocks (paged), rows (static) or sequences (hf)."""
        return self.places.usage(len(self.active), self.max_batch)

    def _advance(self, seq: Sequence, logits: np.ndarray) -> Delta:
        seq.choose(logits)
        return self.emit(seq)

    def emit(self, seq: Sequence) -> Delta:
        """The event of the sequence's newest token: its text, and whether it ends the sequence."""
        token = seq.tokens[-1]
        text = seq.text.push(token) if seq.text else ""
        if token in self.eos or (seq.text and seq.text.stopped):
            seq.finish_reason = "stop"
        elif len(seq.tokens) == seq.prep.limit:
            seq.finish_reason = "length"
        if seq.finish_reason and seq.text:
            text += seq.text.flush()
        return Delta((token,), text, seq.finish_reason)


def run_to_end(pipe, prepared: list[Prepared], text: bool = False) -> Iterator[tuple[Sequence, Delta]]:
    """Every prepared request through a scheduler of its own, admitted in order as places free up (those that
    join prefilled in one call); each token's event. The scheduler starts at the first event and is closed at the
    end (or when the caller drops this)."""
    waiting, scheduler = deque(prepared), Scheduler(pipe, text=text)
    try:
        while waiting or scheduler.active:
            group: list[Prepared] = []
            while waiting and scheduler.fits(waiting[0], tuple(group)) and (
                    not group or scheduler.joins(waiting[0], tuple(group))):
                group.append(waiting.popleft())
            if group:
                between: list[tuple[Sequence, Delta]] = []  # the running ones' tokens between prefill pieces
                admitted = scheduler.admit_together(group, lambda: between.extend(scheduler.step()))
                yield from between
                yield from admitted
            yield from scheduler.step()
    finally:
        scheduler.close()


class Rows:
    """The static layout: the active sequence i owns row i of the shared buffers."""

    def __init__(self, pipe):
        self.pipe, self.stepper = pipe, pipe.stepper
        self.batch = self.stepper.cache.rows
        self.batches = False

    def fits(self, prep: Prepared, joining: tuple[Prepared, ...]) -> bool:
        return True

    def prefill(self, seq: Sequence, active: list[Sequence], between) -> np.ndarray:
        row = len(active)
        stepper = chunked(self.stepper, self.pipe.prefill_chunk, between)
        logits = self.pipe.prefill(stepper, row, seq.prep)[0, -1]
        if len(active) != row:  # sequences left between its pieces: it takes the row after the last one
            self.stepper.cache.copy_row(row, len(active))
        return logits

    def decode(self, active: list[Sequence]) -> np.ndarray:
        embeds = self.pipe.embed(np.array([[s.tokens[-1]] for s in active], np.int64))
        return self.stepper.run(embeds, 0, len(active), last_only=True)[:, -1]

    def remove(self, active: list[Sequence], row: int) -> None:
        """The last active row moves into the hole, so rows 0..n-1 stay the active ones."""
        last = len(active) - 1
        if row != last:
            self.stepper.cache.copy_row(last, row)
        active[row] = active[last]
        active.pop()

    def close(self, seq: Sequence) -> None:
        """A row holds nothing once it is outside 0..n-1."""

    def usage(self, running: int, limit: int) -> tuple[int, int]:
        return running, self.batch


class Blocks:
    """The paged layout: a block table per sequence (keyed by the request's index), image prefixes forked."""

    def __init__(self, pipe):
        self.pipe, self.stepper, self.cache = pipe, pipe.stepper, pipe.stepper.cache
        self.batch = self.stepper.batch_max
        self.holders: dict[str, list[int]] = {}  # running sequences holding each image prefix, by its key
        self.batches = True

    def fits(self, prep: Prepared, joining: tuple[Prepared, ...]) -> bool:
        """The blocks of `prep`'s worst case fit beside the worst cases of the running and `joining` ones."""
        need = sum(self._need(p) for p in (*joining, prep))
        return need <= self.cache.allocator.available - sum(self.cache.promised.values())

    def _need(self, prep: Prepared) -> int:
        shared = prep.prefix_len if self.holders.get(prep.prefix_key) else 0
        return self.cache.blocks_for(len(prep.ids) + prep.limit) - shared // self.cache.block_tokens

    def prefill(self, seq: Sequence, _active: list[Sequence], between) -> np.ndarray:
        prep = seq.prep
        self.cache.open(prep.index, len(prep.ids) + prep.limit)
        stepper = chunked(self.stepper, self.pipe.prefill_chunk, between)
        return prefill_sharing(self.pipe, stepper, self.holders, prep)[0, -1]

    def prefill_together(self, seqs: list[Sequence]) -> list[np.ndarray]:
        for seq in seqs:
            self.cache.open(seq.prep.index, len(seq.prep.ids) + seq.prep.limit)
        return prefill_together(self.pipe, self.stepper, self.holders, [seq.prep for seq in seqs])

    def decode(self, active: list[Sequence]) -> np.ndarray:
        embeds = self.pipe.embed(np.array([[s.tokens[-1]] for s in active], np.int64))
        return self.stepper.run(embeds, [s.prep.index for s in active], last_only=True)[:, -1]

    def remove(self, active: list[Sequence], i: int) -> None:
        active.pop(i)

    def close(self, seq: Sequence) -> None:
        """Every block of the sequence back to the pool (a shared one when its last holder lets go)."""
        index, key = seq.prep.index, seq.prep.prefix_key
        if index in self.cache.tables:
            self.cache.close(index)
        if key and index in self.holders.get(key, ()):
            self.holders[key].remove(index)
            if not self.holders[key]:
                del self.holders[key]

    def usage(self, running: int, limit: int) -> tuple[int, int]:
        allocator = self.cache.allocator
        return allocator.total - allocator.available, allocator.total


class OwnCaches:
    """The hf layout (no kv_layout): each sequence keeps the cache arrays its calls return, one call each."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.batch = pipe.dims["batch"]["max"]
        self.batches = False

    def fits(self, prep: Prepared, joining: tuple[Prepared, ...]) -> bool:
        return True

    def prefill(self, seq: Sequence, _active: list[Sequence], between) -> np.ndarray:
        """From a stored prefix when there is one (its arrays are read, never written); the prefixes kept after."""
        pipe, prep = self.pipe, seq.prep
        arrays = stored_prefix(pipe, prep)
        start = None if arrays is None else pipe.hf.load_prefix(arrays)
        embeds, positions = (prep.embeds, prep.positions) if start is None else (
            prep.after_prefix(), prep.positions_after_prefix())
        logits, seq.cache = chunked_own_cache(pipe, embeds, positions, pipe.prefill_chunk, between, start)
        keep_prefixes(pipe, pipe.hf, seq.cache, prep, fresh=start is None)
        return logits

    def decode(self, active: list[Sequence]) -> list[np.ndarray]:
        rows = []
        for seq in active:
            embeds = self.pipe.embed(np.array([[seq.tokens[-1]]], np.int64))
            logits, seq.cache = self.pipe.step(embeds, seq.cache, delta=seq.prep.rope_delta)
            rows.append(logits[0, -1])
        return rows

    def remove(self, active: list[Sequence], i: int) -> None:
        active.pop(i)

    def close(self, seq: Sequence) -> None:
        seq.cache = None

    def usage(self, running: int, limit: int) -> tuple[int, int]:
        return running, limit
