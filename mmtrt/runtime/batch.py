"""Batched greedy decoding over a static KV cache: one row per sequence, continuous admission.

Each admitted request is prefilled alone into a free row (its own length, logits of the last position only), then
every active row decodes one token per step in one LLM call, each at its own position. A sequence leaves at its own
EOS or token limit; the last active row moves into the freed one, so the active rows are always rows 0..n-1 and a
step binds one run of rows. Waiting requests are admitted as rows free up.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmtrt.errors import UserError
from mmtrt.runtime.kv import StaticCache


@dataclass
class Request:
    image: Any
    prompt: str
    max_new_tokens: int | None = None
    raw_prompt: bool = False


@dataclass
class Prepared:
    """A request inside the envelope, with its image features computed."""

    index: int
    ids: list[int]
    embeds: np.ndarray
    limit: int
    timings: dict[str, float]
    prefix_key: str | None = None  # the image prefix's key when it may be reused (kv layouts only)
    prefix_len: int = 0
    prefix: list[np.ndarray] | None = None  # its stored KV when found at prepare time: embeds then start after it
    positions: np.ndarray | None = None  # the prompt's position_ids when not 0..n-1 (M-RoPE: [3, 1, n])
    rope_delta: int = 0  # what decode positions add to the cache length (M-RoPE)

    def after_prefix(self) -> np.ndarray:
        """The embeddings of the positions after the image prefix."""
        return self.embeds if self.prefix is not None else self.embeds[:, self.prefix_len:]

    def positions_after_prefix(self) -> np.ndarray | None:
        return None if self.positions is None else self.positions[..., self.prefix_len:]


@dataclass
class Sequence:
    prep: Prepared
    tokens: list[int] = field(default_factory=list)
    decode_s: float = 0.0
    margins: list[float] = field(default_factory=list)

    def choose(self, logits: np.ndarray) -> None:
        """Append the greedy token of one position's logits and its top-2 margin (the runner-up is the largest
        logit beside the argmax: two max scans, where np.partition over the vocabulary cost ~25x more per token)."""
        best = int(np.argmax(logits))
        second = max(logits[:best].max(initial=-np.inf), logits[best + 1:].max(initial=-np.inf))
        self.tokens.append(best)
        self.margins.append(float(logits[best] - second))


def step_positions(lengths: np.ndarray, deltas: np.ndarray, seq: int, rows: int) -> np.ndarray:
    """position_ids of `seq` new tokens per sequence after `lengths` held tokens: [batch, seq], or under M-RoPE
    (`rows` 3) the same on each of three rows, each sequence shifted by its rope delta."""
    positions = (lengths + deltas)[:, None] + np.arange(seq, dtype=np.int64)
    return np.ascontiguousarray(np.broadcast_to(positions, (3, *positions.shape))) if rows == 3 else positions


def position_rows(session) -> int:
    """2 for position_ids [batch, seq], 3 for M-RoPE's [3, batch, seq]."""
    return len(next(i for i in session.get_inputs() if i.name == "position_ids").shape)


class StaticStepper:
    """One LLM call over rows start..start+count of the shared buffers, through IOBinding."""

    def __init__(self, session, cache: StaticCache):
        self.session, self.cache = session, cache
        self.rows = position_rows(session)
        self.embed_dtype = np.float16 if session.get_inputs()[0].type == "tensor(float16)" else np.float32
        self.bound: tuple[int, int] | None = None  # the rows the binding's cache buffers cover
        self.io = session.io_binding()
        head = next(o for o in session.get_outputs() if o.name == "logits")
        self.logits_dtype, self.vocab = (np.float16 if head.type == "tensor(float16)" else np.float32), head.shape[-1]

    def reset(self, batch: int) -> None:
        self.cache.lengths[:batch] = 0
        self.cache.deltas[:batch] = 0

    def clear(self, row: int) -> None:
        self.cache.lengths[row] = 0

    def prefill(self, row: int, embeds: np.ndarray, positions: np.ndarray | None = None,
                delta: int = 0) -> np.ndarray:
        """The prompt's `positions` where they are not its cache indices (M-RoPE), and the rope delta its decode
        steps add."""
        self.cache.deltas[row] = delta
        return self.run(embeds, row, 1, last_only=True, positions=positions)

    def load_prefix(self, row: int, arrays: list[np.ndarray]) -> None:
        self.cache.load_row(row, arrays)

    def save_prefix(self, row: int, tokens: int) -> list[np.ndarray]:
        return self.cache.save_row(row, tokens)

    def run_all(self, embeds: np.ndarray, positions: np.ndarray | None = None, delta: int = 0) -> np.ndarray:
        """Rows 0..batch-1 from their lengths on (positions shifted by `delta` unless given); the logits of every
        position."""
        self.cache.deltas[:embeds.shape[0]] = delta
        return self.run(embeds, 0, embeds.shape[0], last_only=False, positions=positions)

    def run(self, embeds: np.ndarray, start: int, count: int, last_only: bool,
            positions: np.ndarray | None = None) -> np.ndarray:
        lengths = self.cache.lengths[start:start + count]
        seq = embeds.shape[1]
        if int(lengths.max()) + seq > self.cache.capacity:
            raise UserError(f"the sequence would hold {int(lengths.max()) + seq} tokens; the bundle's KV capacity is "
                            f"{self.cache.capacity}; recompile with a larger envelope")
        io = self._binding(start, count)
        logits = np.empty((count, 1 if last_only else seq, self.vocab), self.logits_dtype)
        io.bind_output("logits", "cpu", 0, self.logits_dtype, logits.shape, logits.ctypes.data)
        io.bind_cpu_input("inputs_embeds", np.ascontiguousarray(embeds, self.embed_dtype))
        if positions is None:
            positions = step_positions(lengths, self.cache.deltas[start:start + count], seq, self.rows)
        io.bind_cpu_input("position_ids", np.ascontiguousarray(positions, np.int64))
        io.bind_cpu_input("seqlens_k", (lengths + seq - 1).astype(np.int32))
        io.bind_cpu_input("total_sequence_length", np.array(int(lengths.max()) + seq, np.int32))
        io.bind_cpu_input("logits_from", np.array([seq - 1 if last_only else 0], np.int64))
        self.session.run_with_iobinding(io)
        self.cache.lengths[start:start + count] += seq
        return logits.astype(np.float32, copy=False)

    def _binding(self, start: int, count: int):
        """The one IOBinding, its cache buffers bound again only when the rows change (a decode step binds the
        rows of the last one: 2 x layers buffers not bound per token). Binding a name again replaces it, so the
        small inputs and the logits are bound every call; the logits go into an array of ours, so the presents
        are never wrapped as outputs (get_outputs cost about as much as the rest of the step's Python)."""
        if self.bound != (start, count):
            self.io.clear_binding_inputs()
            self.io.clear_binding_outputs()
            self.cache.bind(self.io, start, count)
            self.bound = (start, count)
        return self.io


def decode_static(pipe, stepper: StaticStepper, prepared: list[Prepared]) -> dict[int, Sequence]:
    """Greedy tokens for every prepared request; returns the finished sequences by request index."""
    cache, eos = stepper.cache, set(pipe.model["eos_token_ids"])
    waiting, active, done = deque(prepared), [], {}

    def finished(seq: Sequence) -> bool:
        return seq.tokens[-1] in eos or len(seq.tokens) == seq.prep.limit

    while waiting or active:
        while waiting and len(active) < cache.rows:
            seq = Sequence(waiting.popleft())
            t0 = time.perf_counter()
            logits = pipe.prefill(stepper, len(active), seq.prep)
            seq.choose(logits[0, -1])
            seq.prep.timings["prefill_ms"] = 1e3 * (time.perf_counter() - t0)
            if finished(seq):
                done[seq.prep.index] = seq
            else:
                active.append(seq)
        if not active:
            continue
        t0 = time.perf_counter()
        embeds = pipe.embed(np.array([[s.tokens[-1]] for s in active], np.int64))
        logits = stepper.run(embeds, 0, len(active), last_only=True)
        spent = time.perf_counter() - t0
        for seq, row_logits in zip(active, logits):
            seq.choose(row_logits[-1])
            seq.decode_s += spent
        active = _retire(cache, active, done, finished)
    return done


def _retire(cache: StaticCache, active: list[Sequence], done: dict, finished) -> list[Sequence]:
    """Drop finished rows; the last active row fills each hole, so rows 0..n-1 stay the active ones."""
    row = 0
    while row < len(active):
        if not finished(active[row]):
            row += 1
            continue
        done[active[row].prep.index] = active[row]
        last = len(active) - 1
        if row != last:
            cache.copy_row(last, row)
        active[row] = active[last]
        active.pop()
    return active
