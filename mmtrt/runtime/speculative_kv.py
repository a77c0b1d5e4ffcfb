"""Verification calls, rollback and the lower layers' cache per KV layout: each sequence's last token and its
draft scored by the LLM, then its cache cut back to the positions that were kept.

The LLM graph of every layout takes several new tokens after a cache (as an image prefix's question does):
- hf: one call per sequence (its own grown arrays, as its plain steps are); the arrays are sliced back to the
  kept length;
- static: one call per row: ONNX Runtime's GroupQueryAttention, which the static graph attends with, takes several
  new tokens after a cache for one sequence at a time; the row's length is set back, and the graph writes the next
  tokens over the rejected ones' positions;
- paged: every running sequence in one call (`verify_all`, the drafts padded to one width); the length is set back
  and the blocks past it return to the pool (and to the sequence's promise, so admission's worst-case accounting
  is unchanged).
`lower_cache` gives a sequence's cache of the first layers in the hf layout, for the early-exit draft.
"""

from __future__ import annotations

import numpy as np

from mmtrt.runtime.batch import Sequence


class OwnCacheVerifier:
    """hf: the sequence's own grown cache arrays."""

    batches = False  # the caches differ in length: batching them would copy every one into padded arrays per step

    def __init__(self, pipe):
        self.pipe = pipe

    def verify(self, seq: Sequence, _row: int, embeds: np.ndarray) -> np.ndarray:
        logits, seq.cache = self.pipe.step(embeds, seq.cache, delta=seq.prep.rope_delta)
        return logits[0]

    def rollback(self, seq: Sequence, _row: int, keep: int) -> None:
        if keep < self.length(seq, _row):
            seq.cache = {name: np.ascontiguousarray(a[:, :, :keep]) for name, a in seq.cache.items()}

    def length(self, seq: Sequence, _row: int) -> int:
        return next(iter(seq.cache.values())).shape[2]

    def lower_cache(self, seq: Sequence, _row: int, layers: int) -> dict[str, np.ndarray]:
        return {name: a for name, a in seq.cache.items() if int(name.split(".")[1]) < layers}


class RowVerifier:
    """static: row `row` of the shared buffers."""

    batches = False  # GroupQueryAttention refuses a batch above one with several new tokens after a cache

    def __init__(self, pipe):
        self.stepper = pipe.stepper

    def verify(self, seq: Sequence, row: int, embeds: np.ndarray) -> np.ndarray:
        return self.stepper.run(embeds, row, 1, last_only=False)[0]

    def rollback(self, seq: Sequence, row: int, keep: int) -> None:
        self.stepper.cache.lengths[row] = keep

    def length(self, seq: Sequence, row: int) -> int:
        return int(self.stepper.cache.lengths[row])

    def lower_cache(self, seq: Sequence, row: int, layers: int) -> dict[str, np.ndarray]:
        cache, tokens = self.stepper.cache, int(self.stepper.cache.lengths[row])
        names = hf_names(cache.names, layers)
        if cache.copier is None:
            return {hf: cache.host[past][row:row + 1, :, :tokens] for past, hf in names}
        return {hf: cache.copier.row_to_host(cache._row(past, row), tokens)[None] for past, hf in names}


class BlockVerifier:
    """paged: the sequence's block table (all running sequences' in one call: `verify_all`)."""

    batches = True

    def __init__(self, pipe):
        self.stepper = pipe.stepper

    def verify(self, seq: Sequence, _row: int, embeds: np.ndarray) -> np.ndarray:
        return self.stepper.run(embeds, [seq.prep.index], last_only=False)[0]

    def verify_all(self, active: list[Sequence], embeds: np.ndarray) -> np.ndarray:
        return self.stepper.run(embeds, [seq.prep.index for seq in active], last_only=False)

    def rollback(self, seq: Sequence, _row: int, keep: int) -> None:
        self.stepper.cache.truncate(seq.prep.index, keep)

    def length(self, seq: Sequence, _row: int) -> int:
        return self.stepper.cache.lengths[seq.prep.index]

    def lower_cache(self, seq: Sequence, _row: int, layers: int) -> dict[str, np.ndarray]:
        cache = self.stepper.cache
        slots = cache.slots(seq.prep.index, 0, cache.lengths[seq.prep.index])
        return {hf: cache.host[past][slots].transpose(1, 0, 2)[None] for past, hf in hf_names(cache.names, layers)}


def hf_names(names: list[tuple[str, str]], layers: int) -> list[tuple[str, str]]:
    """(buffer name, the hf graph's `past.N.kind` input) for the buffers of layers 0..layers-1, which the cache
    lists layer by layer, each layer's kinds in the manifest's order (key, value)."""
    kinds = ("key", "value")
    return [(past, f"past.{i // 2}.{kinds[i % 2]}") for i, (past, _) in enumerate(names[:2 * layers])]


def verifier_for(pipe):
    from mmtrt.runtime.paged import PagedStepper

    if pipe.stepper is None:
        return OwnCacheVerifier(pipe)
    return BlockVerifier(pipe) if isinstance(pipe.stepper, PagedStepper) else RowVerifier(pipe)
