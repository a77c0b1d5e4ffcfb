"""A request's inputs, before the LLM: the prompt's ids through the chat template, each image's pixels and
features (tiled, by patches, or at one size), the image-token run fitted to each image's own count, and the image
prefix's key. `Pipeline` takes these methods; they read its manifest, tokenizer, runners and KV stepper.

An any-resolution image's tiles are independent inputs of the vision encoder (its batch), so a request admitted
beside running ones is encoded `vision_chunk` tiles per call with the running ones' decode step between calls
(`between`), as its prefill is chunked (chunked_prefill.py): the admission then stalls their tokens for one call,
not for the whole encoder.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
from PIL import Image

from mmtrt.preprocess.anyres import grid_tiles, pack
from mmtrt.errors import UserError
from mmtrt.runtime.batch import Prepared, Request
from mmtrt.runtime.chunked_prefill import pieces
from mmtrt.runtime.encoder_cache import encoder_key, image_key, pixel_digest
from mmtrt.runtime.image_bounds import check_image
from mmtrt.runtime.image_file import open_image
from mmtrt.runtime.paged import PagedStepper
from mmtrt.runtime.prefix import prefix_keys, prefix_length
from mmtrt.runtime.prompt import (check_prompt, format_prompt, holds_special_tokens, tokenize, tokenize_spans,
                                  tokenize_user_text)
from mmtrt.runtime.sampling import SamplingParams


class RequestInputs:
    """What can be refused before the encoders run (`check`, on any thread), then the embedding (`embed_request`)."""

    vision_chunk = 1  # tiles per vision call of an image encoded while other sequences run

    def prompt_ids(self, prompt: str, raw_prompt: bool = False, images: int = 1, text_spans=()) -> list[int]:
        """`text_spans` of a raw prompt: a client's text in it (special tokens split, see Request)."""
        check_prompt(prompt)
        image_token, count = self.model["image_token"], self.model["vision"]["image_tokens"]
        if raw_prompt and text_spans and not self.parse_special_tokens:
            ids = tokenize_spans(self.tokenizer, prompt, text_spans, image_token, count, images)
        elif raw_prompt or self.parse_special_tokens or not holds_special_tokens(self.tokenizer, prompt):
            text = format_prompt(self.tokenizer, self.model["chat_template"], prompt, raw_prompt, images)
            ids = tokenize(self.tokenizer, text, image_token, count, images)
        else:
            ids = tokenize_user_text(self.tokenizer, self.model["chat_template"], prompt, image_token, count, images)
        limit, image_tokens = self.dims["seq"]["max"], images * count
        if len(ids) > limit:
            raise UserError(f"the prompt is {len(ids) - image_tokens} tokens after the chat template; this bundle "
                            f"accepts at most {limit - image_tokens}"
                            f"{f' beside {images} images' if images > 1 else ''}; shorten it or recompile with a "
                            "larger envelope.prompt_tokens.max")
        return ids

    def pixel_values(self, image) -> np.ndarray:
        """The vision input: [1, 3, H, W], or an any-resolution image's base and tiles [1 + tiles, 3, H, W]."""
        return self.keyed_pixels(image)[0]

    def keyed_pixels(self, image) -> tuple[np.ndarray, bytes]:
        """The vision input and its `pixel_digest`; an image seen before (the same decoded pixels) from the pixel
        cache, as its resize, tiling and hashing cost a repeated image's request more than its one-token prefill."""
        img = open_image(image)
        check_image(img, self.manifest["envelope"]["image"], self.preprocess_spec)
        if self.family:
            pixels = self.family.pixels(img)
            return pixels, pixel_digest(pixels)
        key = image_key(img) if self.pixel_cache.limit else None
        entry = self.pixel_cache.get(key) if key else None
        if entry is not None:
            return entry[0], entry[1].tobytes()
        pixels = self._transformed(img)
        digest = pixel_digest(pixels)
        if key:
            pixels.flags.writeable = False  # shared by every later request of the image
            self.pixel_cache.put(key, [pixels, np.frombuffer(digest, np.uint8)])
        return pixels, digest

    def _transformed(self, img: Image.Image) -> np.ndarray:
        if self.anyres:
            self._check_tiles(img)
            return self.transform(img)
        return self.transform(img)[None]

    def _check_tiles(self, img: Image.Image) -> None:
        rows, cols = grid_tiles(img.height, img.width, self.anyres["pinpoints"], self.anyres["tile"])
        if rows * cols > self.anyres["max_tiles"]:
            raise UserError(f"image is {img.width}x{img.height}, which the model cuts into {rows}x{cols} tiles; this "
                            f"bundle takes at most {self.anyres['max_tiles']}; pass a smaller image or recompile "
                            "with a larger envelope.image.max_tiles")

    def image_features(self, pixels: np.ndarray, size: tuple[int, int] | None = None,
                       between: Callable[[], None] | None = None) -> np.ndarray:
        """The image's tokens [1, count, D]: under a dynamic budget the first `image_token_count` of the block;
        for an any-resolution model its tiles' features packed by the image's (height, width) `size`, its tiles
        encoded `vision_chunk` at a time with `between()` after every call but the last where given."""
        if self.family:
            return self._run("vision", self.family.vision_feeds(pixels))["image_features"]
        out = self._tiles(pixels, between) if self.anyres and between else self._run("vision", {"pixel_values": pixels})
        if self.anyres:
            if size is None:
                raise ValueError("an any-resolution model's image features need the image's (height, width)")
            return pack(out["image_features"], out.get("image_token_count"), *size, self.anyres, self.newline)[None]
        if not self.dynamic_tokens:
            return out["image_features"]
        return out["image_features"][:, :int(out["image_token_count"][0])]

    def _tiles(self, pixels: np.ndarray, between: Callable[[], None]) -> dict[str, np.ndarray]:
        """The vision outputs of the tiles in pieces, joined along the tiles."""
        outs = [self._run("vision", {"pixel_values": pixels[piece]})
                for piece in pieces(len(pixels), self.vision_chunk, between)]
        return {name: np.concatenate([out[name] for out in outs]) for name in outs[0]}

    def encode_image(self, image, ids: list[int]) -> tuple[list[int], np.ndarray]:
        """The image's features [1, count, D] and `ids` (from `prompt_ids`) with the expanded placeholder cut to
        the image's own count where it has one (a dynamic token budget, an any-resolution image)."""
        img = open_image(image)
        features = self.image_features(self.pixel_values(img), (img.height, img.width))
        if self.variable_tokens:
            ids = self.fit_image_tokens(ids, features.shape[1])
        return ids, features

    def fit_image_tokens(self, ids: list[int], count: int | list[int]) -> list[int]:
        """The prompt with each image's expanded placeholder (a run of the bundle's image-token count, adjacent
        images one after the other) cut to that image's count."""
        token, counts = self.model["image_token_id"], iter([count] if isinstance(count, int) else count)
        per_image, out, at = self.model["vision"]["image_tokens"], [], 0
        while at < len(ids):
            if ids[at] != token:
                out.append(ids[at])
                at += 1
                continue
            out += [token] * next(counts)
            at += per_image
        return out

    def prepare(self, index: int, req: Request, seen: dict[str, np.ndarray] | None = None) -> Prepared:
        """Check a request against the envelope and embed it (`check`, then `embed_request`)."""
        return self.embed_request(self.check(index, req), seen)

    def check(self, index: int, req: Request) -> Prepared:
        """What can be refused before the encoders run (token limit, sampling values, prompt length, images), on
        any thread: a request with its ids and pixels, not embedded yet."""
        limit = self.manifest["envelope"]["max_new_tokens"]
        max_new = limit if req.max_new_tokens is None else req.max_new_tokens
        if not isinstance(max_new, int) or isinstance(max_new, bool):
            raise UserError(f"max_new_tokens must be an integer, not {type(max_new).__name__}")
        sampling = (req.sampling or SamplingParams()).validate(limit)
        max_new = next((n for n in (sampling.max_new_tokens, max_new) if n is not None), limit)
        if not 1 <= max_new <= limit:
            raise UserError(f"max_new_tokens {max_new} is outside 1..{limit}, the bundle's KV capacity; "
                            "recompile with a larger envelope.max_new_tokens")
        images = req.images()
        if len(images) > (most := self.dims.get("num_images", {}).get("max") or 1):
            raise UserError(f"the request holds {len(images)} images; this bundle takes at most {most}")
        ids = self.prompt_ids(req.prompt, req.raw_prompt, len(images), req.text_spans)
        t0 = time.perf_counter()
        opened = [open_image(image) for image in images]
        keyed = [self.keyed_pixels(img) for img in opened]
        prep = Prepared(index, ids, None, max_new, {"preprocess_ms": 1e3 * (time.perf_counter() - t0)},
                        pixels=[p for p, _ in keyed], pixel_keys=[k for _, k in keyed],
                        sizes=[(i.height, i.width) for i in opened], sampling=sampling)
        if not self.variable_tokens:
            self._locate_prefix(prep)
            if isinstance(self.stepper, PagedStepper):
                self.stepper.check(prep)
        return prep

    def embed_request(self, prep: Prepared, seen: dict[str, np.ndarray] | None = None,
                      between: Callable[[], None] | None = None) -> Prepared:
        """Embed a checked request: the vision encoder is skipped when the image's prefix is stored, or when the
        encoder cache or `seen` (by `encoder_key`, filled here) has the same pixels' features already.
        `between`: what runs between the vision calls of an any-resolution image's tiles (the running sequences'
        decode step); its time is not counted in the request's `vision_ms`."""
        t1, aside = time.perf_counter(), [0.0]
        if between is not None:
            between = _timed(between, aside)
        features = self._all_features(prep, seen, between) if self.variable_tokens else None
        if features is not None:
            prep.ids = self.fit_image_tokens(prep.ids, [f.shape[1] for f in features]) if features else prep.ids
            if self.family:
                prep.positions, prep.rope_delta = self.family.positions(prep.ids, prep.pixels)
            self._locate_prefix(prep)
            if isinstance(self.stepper, PagedStepper):
                self.stepper.check(prep)
        stored = self.prefixes.get(prep.prefix_key) if prep.prefix_key else None
        if stored is not None:
            prep.embeds, prep.prefix = self.embed(np.array([prep.ids[prep.prefix_len:]], np.int64)), stored
        else:
            if features is None:
                features = self._all_features(prep, seen, between)
            prep.embeds = self.embed(np.array([prep.ids], np.int64),
                                     np.concatenate(features, axis=1) if features else None)
        prep.timings["vision_ms"], prep.pixels = 1e3 * (time.perf_counter() - t1 - aside[0]), []
        return prep

    @property
    def keeps_prefixes(self) -> bool:
        """Whether the LLM's KV may be reused across requests: a kv_layout's rows or blocks, or the hf layout's own
        arrays (not when TensorRT-LLM decodes, as it prefills whole prompts)."""
        return self.stepper is not None or (not self.kv and self.trtllm is None and "llm" in self.runners)

    @property
    def variable_tokens(self) -> bool:
        """Whether an image's token count is its own (a dynamic budget, any resolution): known after the encoder."""
        return bool(self.dynamic_tokens or self.anyres)

    def _locate_prefix(self, prep: Prepared) -> None:
        """What the LLM's cache may reuse: the prompt before its last token when it is stored, else the image prefix
        (the text before the last image token, and that image's tokens); their lengths and keys."""
        n = prefix_length(prep.ids, self.model["image_token_id"]) if self.keeps_prefixes and prep.pixels else 0
        prep.prefix_len, prep.prefix_key, prep.prompt_key = n, None, None
        if not n:
            return
        whole = len(prep.ids) - 1
        images = [self._keyed(key, size) for key, size in zip(prep.pixel_keys, prep.sizes)]
        prep.prefix_key, prompt_key = prefix_keys(images, prep.ids, [n, whole])
        prep.prompt_key = prompt_key if whole > n else None
        if prep.prompt_key in self.prefixes.entries:
            prep.prefix_len, prep.prefix_key, prep.prompt_key = whole, prep.prompt_key, None

    def _all_features(self, prep: Prepared, seen: dict[str, np.ndarray] | None,
                      between: Callable[[], None] | None = None) -> list[np.ndarray]:
        return [self._features(p, key, size, seen, between)
                for p, key, size in zip(prep.pixels, prep.pixel_keys, prep.sizes)]

    def _keyed(self, digest: bytes, size: tuple[int, int]) -> bytes:
        """What identifies an image's features: its pixels' digest, and for an any-resolution model its size too
        (the size places the tiles' padding, which the layout cuts away)."""
        return digest + np.asarray(size, np.int64).tobytes() if self.anyres else digest

    def _features(self, pixels, digest: bytes, size: tuple[int, int], seen: dict[str, np.ndarray] | None,
                  between: Callable[[], None] | None) -> np.ndarray:
        """The image's features from `seen` (this batch's), the encoder cache (every request's), or the encoder."""
        key = encoder_key(self.hash, digest, size if self.anyres else None)
        features = seen.get(key) if seen is not None else None
        if features is None and self.encoder_cache.limit:
            features = self.encoder_cache.get(key)
        if features is None:
            features = self.image_features(pixels, size, between)
            self.encoder_cache.put(key, features)
        if seen is not None:
            seen[key] = features
        return features


def _timed(between: Callable[[], None], spent: list[float]) -> Callable[[], None]:
    """`between`, adding its seconds to spent[0]."""
    def run() -> None:
        t0 = time.perf_counter()
        between()
        spent[0] += time.perf_counter() - t0
    return run
