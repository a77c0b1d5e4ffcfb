"""The hf layout (a bundle without kv_layout): each call takes the cache arrays and returns them grown by its
tokens (`present.N.*` = `past.N.*` + the new rows), so a sequence keeps its own arrays between calls.

A graph that takes `logits_from` (every bundle compiled since it existed) runs the lm_head only from that position
on: a prefill asks for its last position; a bundle from before runs it on every position and the caller reads
the last row, with the same values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mmtrt.ir.spec import LOGITS_FROM, TensorSpec


class HfLayout:
    """How to call one bundle's LLM graph with grown caches."""

    def __init__(self, specs: list[TensorSpec], llm: dict[str, Any]):
        self.pasts = [s.name for s in specs if s.name.startswith("past.")]
        self.position_dims = next(s for s in specs if s.name == "position_ids").shape[:-2]  # (3,) under M-RoPE
        self.logits_from = any(s.name == LOGITS_FROM for s in specs)
        self.kv_shape = (llm["num_kv_heads"], llm["head_dim"])

    def empty(self, batch: int) -> dict[str, np.ndarray]:
        shape = (batch, self.kv_shape[0], 0, self.kv_shape[1])
        return {name: np.zeros(shape, np.float32) for name in self.pasts}

    def save_prefix(self, cache: dict[str, np.ndarray], tokens: int) -> list[np.ndarray]:
        """The first `tokens` positions of a sequence's cache, one array per past (a prefix cache entry)."""
        return [np.ascontiguousarray(cache[name][:, :, :tokens]) for name in self.pasts]

    def load_prefix(self, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
        """A cache that starts with a stored prefix (calls read the pasts and return new presents: no copy)."""
        return dict(zip(self.pasts, arrays))

    def feeds(self, embeds: np.ndarray, cache: dict[str, np.ndarray], positions: np.ndarray | None, delta: int,
              last_only: bool) -> dict[str, np.ndarray]:
        """The call's inputs; positions count on from the cache's length plus `delta` unless given."""
        past = next(iter(cache.values())).shape[2]
        batch, seq = embeds.shape[:2]
        if positions is None:
            positions = np.broadcast_to(np.arange(past, past + seq, dtype=np.int64) + delta,
                                        self.position_dims + (batch, seq))
        feeds = {"inputs_embeds": embeds, "attention_mask": np.ones((batch, past + seq), np.int64),
                 "position_ids": np.ascontiguousarray(positions), **cache}
        if self.logits_from:
            feeds[LOGITS_FROM] = np.array([seq - 1 if last_only else 0], np.int64)
        return feeds


def grown(out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The call's presents as the next call's pasts."""
    return {k.replace("present.", "past."): v for k, v in out.items() if k.startswith("present.")}
