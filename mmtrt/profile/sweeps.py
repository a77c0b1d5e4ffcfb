"""Costs measured at other shapes than the request's: KV cache and decode step against context, and prefill with
fewer image tokens (what `token_prune` would hand the LLM).

KV bytes follow from the model facts (2 tensors x layers x KV heads x head size x context x the cache's element
size) and are checked against the arrays actually passed; a decode step is timed with a cache of that length
where the bundle's KV capacity allows. The prefill estimate runs the LLM graph on the request's own embeddings
with image positions thinned to `keep` of them, so it is a measurement at that length, not a proportion.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from mmtrt.progress import track

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def kv_bytes(pipe, context: int, batch: int = 1) -> int:
    llm = pipe.model["llm"]
    spec = next(s for s in pipe.specs["llm"] if s.name.startswith("past."))
    return 2 * llm["num_layers"] * llm["num_kv_heads"] * llm["head_dim"] * context * batch * ITEMSIZE[spec.dtype]


def timed(fn, rounds: int) -> float:
    """Median milliseconds of `rounds` calls after one warm-up."""
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def context_sweep(pipe, contexts: list[int], rounds: int, rng: np.random.Generator) -> list[dict]:
    """Per context: KV bytes at batch 1, and the decode step time with a cache that long."""
    capacity = pipe.dims["past + seq"]["max"]
    token = np.array([[int(pipe.model["eos_token_ids"][0])]], np.int64)
    rows = []
    for context in track(contexts, "context sweep", total=len(contexts)):
        row = {"context": context, "kv_bytes": kv_bytes(pipe, context)}
        if context > capacity:
            row["decode_step_ms"] = None
            row["why_not_measured"] = f"beyond the bundle's KV capacity of {capacity} tokens"
        else:
            cache = {k: rng.standard_normal(v.shape[:2] + (context - 1,) + v.shape[3:]).astype(v.dtype)
                     for k, v in pipe.empty_cache().items()}
            embeds = pipe.embed(token)
            grown = pipe.step(embeds, cache)[1]
            row["kv_bytes_measured"] = int(sum(v.nbytes for v in grown.values()))
            row["decode_step_ms"] = timed(lambda: pipe.step(embeds, cache), rounds)
        rows.append(row)
    return rows


def prefill_at_keeps(pipe, embeds: np.ndarray, ids: np.ndarray, keeps: tuple[float, ...], rounds: int) -> list[dict]:
    """Prefill time with the image tokens thinned to `keep` of them (evenly spaced, the rest of the prompt as is)."""
    image = np.flatnonzero(ids[0] == pipe.model["image_token_id"])
    text = np.flatnonzero(ids[0] != pipe.model["image_token_id"])
    rows = []
    for keep in keeps:
        kept = image[np.linspace(0, len(image) - 1, max(1, round(keep * len(image)))).round().astype(int)]
        positions = np.sort(np.concatenate([text, np.unique(kept)]))
        sub = np.ascontiguousarray(embeds[:, positions])
        ms = timed(lambda: pipe.step(sub, pipe.empty_cache(1)), rounds)
        rows.append({"keep": keep, "image_tokens": int(len(np.unique(kept))), "sequence": int(len(positions)),
                     "prefill_ms": ms})
    return rows
