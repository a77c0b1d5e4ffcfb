"""Reuse of an image's KV across questions: the prefix (chat template text before the image, then the image's
tokens) is computed once and kept, keyed by the pixels and the prefix token ids, in an LRU bounded in MiB.

A later request with the same key skips the vision encoder and the prefix's prefill: its rows are copied into the
request's cache row (static) or slots (paged), and only the question after the image is prefilled. Each prefill
also keeps its whole prompt but the last token, so the same request again (a retry, a regenerated answer, the same
question from another client) prefills one token, as a serving engine's prefix cache does.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import numpy as np


def prefix_length(ids: list[int], image_token_id: int) -> int:
    """Tokens up to and including the last image token (0 when the image is the last thing in the prompt)."""
    last = max(i for i, t in enumerate(ids) if t == image_token_id)
    return last + 1 if last + 1 < len(ids) else 0


def prefix_keys(images: list[bytes], ids: list[int], lengths: list[int]) -> list[str]:
    """The keys of a prompt's prefixes of each length: its images' digests (`RequestInputs._keyed`) and the
    prompt's first `length` ids."""
    h = hashlib.sha256()
    for image in images:
        h.update(image)
    keys = []
    for length in lengths:
        key = h.copy()
        key.update(np.asarray(ids[:length], np.int64).tobytes())
        keys.append(key.hexdigest())
    return keys


def stored_prefix(pipe, prep) -> list[np.ndarray] | None:
    """The stored KV `prep` starts from: found when it was prepared, or put since by an earlier prefill."""
    if prep.prefix is not None:
        return prep.prefix
    return pipe.prefixes.entries.get(prep.prefix_key) if prep.prefix_key else None


def keep_prefixes(pipe, stepper, handle, prep, fresh: bool) -> None:
    """After `prep`'s prefill into `handle`: keep its image prefix (when it was computed here, `fresh`) and its
    prompt before the last token."""
    if not pipe.prefixes.limit:
        return
    if fresh and prep.prefix_key:
        pipe.prefixes.put(prep.prefix_key, stepper.save_prefix(handle, prep.prefix_len))
    if prep.prompt_key:
        pipe.prefixes.put(prep.prompt_key, stepper.save_prefix(handle, len(prep.ids) - 1))


class PrefixCache:
    """Entries (each a list of arrays: one per cache buffer for a prefix), least recently used evicted beyond
    `mib` MiB; an entry larger than the bound is not kept. Safe to share between threads (a serving loop's and a
    caller's generate)."""

    def __init__(self, mib: float):
        self.limit = int(mib * 2**20)
        self.entries: OrderedDict[str, list[np.ndarray]] = OrderedDict()
        self.nbytes = 0
        self.hits = self.misses = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> list[np.ndarray] | None:
        with self._lock:
            entry = self.entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self.hits += 1
            self.entries.move_to_end(key)
            return entry

    def put(self, key: str, arrays: list[np.ndarray]) -> None:
        size = sum(a.nbytes for a in arrays)
        with self._lock:
            if key in self.entries or size > self.limit:
                return
            while self.nbytes + size > self.limit:
                _, old = self.entries.popitem(last=False)
                self.nbytes -= sum(a.nbytes for a in old)
            self.entries[key] = arrays
            self.nbytes += size
