"""The encoder-output cache: an image's features (what the vision component gives the LLM, after its token
pruning and projector, laid out for the image) kept by the image's content, so a repeated image skips the vision
encoder whatever the request, prompt or chat template around it.

The key is the sha256 of the bundle's digest (which covers the preprocessing spec and the vision graph), the
preprocessed pixel tensor's digest (its dtype, shape and every byte; a Qwen2-VL image's patches with their grid),
and for an any-resolution model the image's size (which places the tiles' padding). Neither a file name nor a
prefix of the file enters it: two images share features only when the vision encoder would see the same input.
Entries are evicted least recently used beyond a bound in bytes; an entry larger than the bound is not kept.

Beside the prefix-KV cache (prefix.py): that one keeps the KV of the template text before the image plus the
image's tokens, so it serves only a request with the same image *and* the same text before it; this one serves
any request with the same image, which then still prefills its prompt. An LRU of the same kind, keyed by
the decoded image's bytes (`image_key`), keeps the preprocessed pixels and their digest, so a repeated image is
neither resized and tiled nor hashed again.
"""

from __future__ import annotations

import hashlib

import numpy as np
from PIL import Image

from mmtrt.runtime.prefix import PrefixCache


def pixel_digest(pixels) -> bytes:
    """sha256 of a vision input (an array, or Qwen2-VL's `Patches` with their grid): its dtype, shape and every
    byte. Taken once per image and kept with its pixels, as hashing a few tiles' floats costs a repeated image's
    request more than its lookups."""
    values = getattr(pixels, "values", pixels)
    h = hashlib.sha256(f"{values.dtype.str}{values.shape}".encode())
    h.update(pixels.tobytes())
    return h.digest()


def encoder_key(bundle_digest: str, pixels: bytes, size: tuple[int, int] | None) -> str:
    """The cache key of one image's features, from its `pixel_digest`."""
    h = hashlib.sha256(bundle_digest.encode())
    h.update(pixels)
    if size is not None:
        h.update(np.asarray(size, np.int64).tobytes())
    return h.hexdigest()


def image_key(img: Image.Image) -> str:
    """The key of a decoded image's preprocessed pixels within one bundle: its mode, size and every byte."""
    h = hashlib.sha256(f"{img.mode}{img.size}".encode())
    h.update(img.tobytes())
    return h.hexdigest()


class EncoderCache(PrefixCache):
    """Image features by `encoder_key`, least recently used evicted beyond `mib` MiB (0: nothing kept): the
    prefix cache's byte-bounded LRU, one array an entry."""

    def __init__(self, mib: float):
        if mib < 0:
            raise ValueError(f"encoder cache size {mib} MiB is negative; pass 0 to keep no image features")
        super().__init__(mib)

    def get(self, key: str) -> np.ndarray | None:
        entry = super().get(key)
        return None if entry is None else entry[0]

    def put(self, key: str, features: np.ndarray) -> None:
        if features.nbytes > self.limit:
            return
        features = features.copy()  # the caller's array may be a view of a runner's output buffer
        features.flags.writeable = False
        super().put(key, [features])
