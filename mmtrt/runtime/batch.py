"""Requests and sequences, and the static KV layout's stepper: one LLM call over a run of rows.

Each admitted request is prefilled alone into a free row (its own length, logits of the last position only), then
every active row decodes one token per step in one LLM call, each at its own position (`scheduler.Rows` hands
the rows out and keeps the active ones at 0..n-1, so a step binds one run of rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmtrt.errors import UserError
from mmtrt.runtime.kv import StaticCache
from mmtrt.runtime.sampling import Sampler, SamplingParams


@dataclass
class Request:
    """`image`: one image (a path or a PIL image), a list of them (one placeholder each in the prompt) or None
    (text only). `sampling.max_new_tokens`, when set, wins over `max_new_tokens`. `text_spans`: the (start, end)
    character ranges of a raw prompt that are a client's text, tokenized with special tokens split (chat.py)."""

    image: Any
    prompt: str
    max_new_tokens: int | None = None
    raw_prompt: bool = False
    sampling: SamplingParams | None = None
    text_spans: tuple[tuple[int, int], ...] = ()

    def images(self) -> list[Any]:
        if self.image is None:
            return []
        return list(self.image) if isinstance(self.image, (list, tuple)) else [self.image]


@dataclass
class Prepared:
    """A request inside the envelope, with its image features computed."""

    index: int
    ids: list[int]
    embeds: np.ndarray
    limit: int
    timings: dict[str, float]
    prefix_key: str | None = None  # the reused (or reusable) prefix's key (kv layouts only)
    prefix_len: int = 0
    prompt_key: str | None = None  # the key of the prompt before its last token, to keep after the prefill
    prefix: list[np.ndarray] | None = None  # its stored KV when found at prepare time: embeds then start after it
    pixels: list[np.ndarray] = field(default_factory=list, repr=False)  # [1, 3, H, W] per image, until embedded
    pixel_keys: list[bytes] = field(default_factory=list, repr=False)  # each image's pixel_digest
    sizes: list[tuple[int, int]] = field(default_factory=list)  # each image's (height, width)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    positions: np.ndarray | None = None  # the prompt's position_ids when not 0..n-1 (M-RoPE: [3, 1, n])
    rope_delta: int = 0  # what decode positions add to the cache length (M-RoPE)

    def after_prefix(self) -> np.ndarray:
        """The embeddings of the positions after the image prefix."""
        return self.embeds if self.prefix is not None else self.embeds[:, self.prefix_len:]

    def positions_after_prefix(self) -> np.ndarray | None:
        return None if self.positions is None else self.positions[..., self.prefix_len:]


@dataclass(eq=False)
class Sequence:
    prep: Prepared
    tokens: list[int] = field(default_factory=list)
    decode_s: float = 0.0
    margins: list[float] = field(default_factory=list)
    sampler: Sampler | None = None  # made at the first token unless the request is greedy
    text: Any = None  # a streaming.TextStream when text is streamed or stop strings are watched
    finish_reason: str | None = None
    cache: Any = None  # the hf layout's grown cache arrays
    speculative: Any = None  # speculative.Counts: drafted tokens proposed and accepted, when a draft runs

    def choose(self, logits: np.ndarray) -> None:
        """Append the next token of one position's logits and how near it was to flipping. Greedy: the argmax and
        the top-2 margin (the runner-up is the largest logit beside the argmax: two max scans, where np.partition
        over the vocabulary cost ~25x more per token); otherwise the sequence's sampler decides."""
        if not self.prep.sampling.greedy:
            if self.sampler is None:
                self.sampler = Sampler(self.prep.sampling, self.prep.ids, len(logits))
            token, margin = self.sampler.choose(logits)
            self.tokens.append(token)
            self.margins.append(margin)
            return
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

    def __init__(self, session, cache: StaticCache, prompt_session=None, prompt_tokens: int = 0):
        """`prompt_session`: the int8_prefill graph over the same buffers, for calls of at least `prompt_tokens`
        new tokens per row."""
        self.session, self.cache = session, cache
        self.rows = position_rows(session)
        self.embed_dtype = np.float16 if session.get_inputs()[0].type == "tensor(float16)" else np.float32
        self.bindings = {graph: Binding(graph) for graph in (session, prompt_session) if graph is not None}
        self.prompt_session, self.prompt_tokens = prompt_session, prompt_tokens
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

    def run_all(self, embeds: np.ndarray, positions: np.ndarray | None = None, delta: int = 0,
                last_only: bool = False) -> np.ndarray:
        """Rows 0..batch-1 from their lengths on (positions shifted by `delta` unless given); the logits of every
        position, or of the last one."""
        self.cache.deltas[:embeds.shape[0]] = delta
        return self.run(embeds, 0, embeds.shape[0], last_only=last_only, positions=positions)

    def run(self, embeds: np.ndarray, start: int, count: int, last_only: bool,
            positions: np.ndarray | None = None) -> np.ndarray:
        lengths = self.cache.lengths[start:start + count]
        seq = embeds.shape[1]
        if int(lengths.max()) + seq > self.cache.capacity:
            raise UserError(f"the sequence would hold {int(lengths.max()) + seq} tokens; the bundle's KV capacity is "
                            f"{self.cache.capacity}; recompile with a larger envelope")
        graph = self.prompt_session if self.prompt_session is not None and seq >= self.prompt_tokens else self.session
        io = self.bindings[graph].rows(self.cache, start, count)
        logits = np.empty((count, 1 if last_only else seq, self.vocab), self.logits_dtype)
        io.bind_output("logits", "cpu", 0, self.logits_dtype, logits.shape, logits.ctypes.data)
        io.bind_cpu_input("inputs_embeds", np.ascontiguousarray(embeds, self.embed_dtype))
        if positions is None:
            positions = step_positions(lengths, self.cache.deltas[start:start + count], seq, self.rows)
        io.bind_cpu_input("position_ids", np.ascontiguousarray(positions, np.int64))
        io.bind_cpu_input("seqlens_k", (lengths + seq - 1).astype(np.int32))
        io.bind_cpu_input("total_sequence_length", np.array(int(lengths.max()) + seq, np.int32))
        io.bind_cpu_input("logits_from", np.array([seq - 1 if last_only else 0], np.int64))
        graph.run_with_iobinding(io)
        self.cache.lengths[start:start + count] += seq
        return logits.astype(np.float32, copy=False)


class Binding:
    """A session's one IOBinding, its cache buffers bound again only when the rows change (a decode step binds the
    rows of the last one: 2 x layers buffers not bound per token). Binding a name again replaces it, so the small
    inputs and the logits are bound every call; the logits go into an array of ours, so the presents are never
    wrapped as outputs (get_outputs cost about as much as the rest of the step's Python)."""

    def __init__(self, session):
        self.io = session.io_binding()
        self.bound: tuple[int, int] | None = None  # the rows the binding's cache buffers cover

    def rows(self, cache: StaticCache, start: int, count: int):
        if self.bound != (start, count):
            self.io.clear_binding_inputs()
            self.io.clear_binding_outputs()
            cache.bind(self.io, start, count)
            self.bound = (start, count)
        return self.io
