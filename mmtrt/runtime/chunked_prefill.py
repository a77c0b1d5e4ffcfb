"""A long prompt's prefill in pieces, with the running sequences' decode steps between them (chunked prefill, as
vLLM's scheduler interleaves them): admitting a request of thousands of tokens then stalls the others' tokens for
one piece, not for the whole prompt. Each piece attends to the cache the pieces before it wrote, so the logits are
those of one call (a prefix reuse runs the same arithmetic: the text after a stored image prefix).

`ChunkedSteps` stands in for a static or paged stepper in `Pipeline.prefill`; `chunked_own_cache` is the hf
layout's, whose cache each call returns.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

PREFILL_CHUNK = 256  # tokens a piece: about a second of a 0.5B LLM's prefill on two cores


def pieces(length: int, tokens: int, between: Callable[[], None]):
    """The slices of `length` positions, `tokens` each, with `between()` run before every one but the first."""
    for start in range(0, length, tokens):
        if start:
            between()
        yield slice(start, min(start + tokens, length))


def _part(positions: np.ndarray | None, piece: slice) -> np.ndarray | None:
    return None if positions is None else positions[..., piece]


class ChunkedSteps:
    """The stepper, its `prefill` run `tokens` at a time with `between()` after every piece but the last."""

    def __init__(self, stepper, tokens: int, between: Callable[[], None]):
        self.stepper, self.tokens, self.between = stepper, tokens, between

    def __getattr__(self, name: str):
        return getattr(self.stepper, name)

    def prefill(self, handle, embeds: np.ndarray, positions: np.ndarray | None = None, delta: int = 0) -> np.ndarray:
        logits = None
        for piece in pieces(embeds.shape[1], self.tokens, self.between):
            logits = self.stepper.prefill(handle, embeds[:, piece], _part(positions, piece), delta)
        return logits


def chunked(stepper, tokens: int, between: Callable[[], None] | None):
    """`stepper` itself where nothing runs beside the prefill."""
    return ChunkedSteps(stepper, tokens, between) if between else stepper


def chunked_own_cache(pipe, embeds: np.ndarray, positions: np.ndarray | None, tokens: int,
                      between: Callable[[], None] | None, cache: dict[str, np.ndarray] | None = None):
    """The hf layout's prefill after `cache` (a stored prefix; None: from an empty cache): the last position's
    logits and the grown cache."""
    cache = pipe.empty_cache() if cache is None else cache
    logits = None
    for piece in pieces(embeds.shape[1], tokens if between else embeds.shape[1], between):
        logits, cache = pipe.step(embeds[:, piece], cache, _part(positions, piece), last_only=True)
    return logits[0, -1], cache
