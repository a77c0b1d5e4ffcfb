"""Where one request's time and memory go, stage by stage, through the runtime's public pieces.

A request is the runtime's own steps (`Pipeline.prompt_ids`, `pixel_values`, `image_features`, `embed`, `step`,
the tokenizer's decode), each timed alone: tokenise, preprocess, vision (encoder and projector: one graph, split
afterwards by the ORT trace's kernel-time shares), embedding and merge, prefill, decode (every step after the
first token, with its argmax and token embedding) and detokenise. Every stage also records the peak resident
memory while it ran (Linux: `/proc/self/clear_refs` resets the high-water mark, `VmHWM` reads it), how far that
peak rose above the resident memory at the stage's start, and the KV cache bytes it holds. After the warm-up
ONNX Runtime's arenas and the allocator reuse their memory, so the rise is what a stage needs beyond that. The
stages cover the request end to end, so their sum is its wall time less the few Python statements between them.

Batch B runs the same graphs with B copies of the image and prompt, through `Pipeline.step`'s batch dimension;
a runtime with batched generation (`Pipeline.generate_batch`, several prompts) would replace `request` here.
Decoding makes exactly `new_tokens` tokens, EOS or not, so every round does the same work.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from mmtrt.errors import UserError
from mmtrt.progress import track

STAGES = ("tokenise", "preprocess", "vision", "embed_merge", "prefill", "decode", "detokenise")
CLEAR_REFS = Path("/proc/self/clear_refs")


def peak_rss_reset() -> None:
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        pass


def _status_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss_bytes() -> int | None:
    return _status_bytes("VmHWM:")


def rss_bytes() -> int | None:
    return _status_bytes("VmRSS:")


class Clock:
    """Per stage: milliseconds, peak RSS and KV bytes; `kv` is set by the stage that holds a cache."""

    def __init__(self):
        self.ms: dict[str, float] = {}
        self.rss: dict[str, int | None] = {}
        self.growth: dict[str, int | None] = {}
        self.kv: dict[str, int] = {}

    @contextmanager
    def __call__(self, stage: str):
        start = time.perf_counter()
        peak_rss_reset()
        before = rss_bytes()
        yield
        self.rss[stage] = peak = peak_rss_bytes()
        self.growth[stage] = None if peak is None or before is None else peak - before
        self.ms[stage] = 1e3 * (time.perf_counter() - start)


def cache_bytes(cache: dict[str, np.ndarray]) -> int:
    return int(sum(v.nbytes for v in cache.values()))


def request(pipe, image, prompt: str, new_tokens: int, batch: int = 1) -> dict[str, Any]:
    """One request of `batch` copies, timed stage by stage; `wall_ms` is measured around all of it."""
    clock = Clock()
    start = time.perf_counter()
    with clock("tokenise"):
        ids = np.array([pipe.prompt_ids(prompt)] * batch, np.int64)
    with clock("preprocess"):
        pixels = np.concatenate([pipe.pixel_values(image) for _ in range(batch)])
    with clock("vision"):
        features = pipe.image_features(pixels)
    with clock("embed_merge"):
        embeds = pipe.embed(ids, features)
    with clock("prefill"):
        logits, cache = pipe.step(embeds, pipe.empty_cache(batch))
    clock.kv["prefill"] = cache_bytes(cache)
    with clock("decode"):
        generated = [np.argmax(logits[:, -1], axis=-1)]
        for _ in range(new_tokens - 1):
            logits, cache = pipe.step(pipe.embed(generated[-1][:, None].astype(np.int64)), cache)
            generated.append(np.argmax(logits[:, -1], axis=-1))
    clock.kv["decode"] = cache_bytes(cache)
    with clock("detokenise"):
        rows = np.stack(generated, axis=1)
        texts = [pipe.tokenizer.decode(row.tolist(), skip_special_tokens=True) for row in rows]
    wall = 1e3 * (time.perf_counter() - start)
    return {"ms": clock.ms, "wall_ms": wall, "peak_rss_bytes": clock.rss, "rss_growth_bytes": clock.growth,
            "kv_bytes": clock.kv, "prompt_tokens": int(ids.shape[1]), "new_tokens": new_tokens, "batch": batch, "text": texts[0]}


def check_request(pipe, batch: int, new_tokens: int) -> None:
    """Refuse a batch or a length the bundle's envelope cannot run, naming the limit."""
    limit = min(pipe.dims["batch"]["max"], pipe.dims["num_images"]["max"])
    if not 1 <= batch <= limit:
        raise UserError(f"batch {batch} is outside 1..{limit}, this bundle's envelope.batch; pass --batch within "
                        "it or recompile with a larger envelope.batch.max")
    cap = pipe.manifest["envelope"]["max_new_tokens"]
    if not 2 <= new_tokens <= cap:
        raise UserError(f"--new-tokens {new_tokens} is outside 2..{cap} (one prefill token plus decode steps, "
                        "within the bundle's envelope.max_new_tokens)")


def summarise(samples: list[float]) -> dict[str, float]:
    q = np.percentile(samples, [25, 75])
    return {"median": statistics.median(samples), "p25": float(q[0]), "p75": float(q[1]),
            "min": min(samples), "max": max(samples), "rounds": len(samples)}


def measure(pipes: list, image, prompt: str, new_tokens: int, batch: int, rounds: int) -> list[dict[str, Any]]:
    """Per pipeline, `rounds` requests after one warm-up, the pipelines alternating round by round (A B A B) so
    a shared machine's noise falls on all alike: per stage the median and spread, its share, peak memory."""
    for pipe in pipes:
        check_request(pipe, batch, new_tokens)
        request(pipe, image, prompt, new_tokens, batch)
    runs: list[list[dict[str, Any]]] = [[] for _ in pipes]
    for _ in track(range(rounds), f"batch {batch}", total=rounds):
        for pipe, out in zip(pipes, runs):
            out.append(request(pipe, image, prompt, new_tokens, batch))
    return [_summary(pipe, r, new_tokens, batch) for pipe, r in zip(pipes, runs)]


def _summary(pipe, runs: list[dict[str, Any]], new_tokens: int, batch: int) -> dict[str, Any]:
    stages = {s: summarise([r["ms"][s] for r in runs]) for s in STAGES}
    total = sum(v["median"] for v in stages.values())
    for s, v in stages.items():
        v["share"] = v["median"] / total
        v["peak_rss_bytes"] = max((r["peak_rss_bytes"][s] or 0) for r in runs) or None
        v["rss_growth_bytes"] = max((r["rss_growth_bytes"][s] or 0) for r in runs)
        v["kv_bytes"] = runs[-1]["kv_bytes"].get(s, 0)
    wall = summarise([r["wall_ms"] for r in runs])
    steps = new_tokens - 1
    return {
        "batch": batch, "new_tokens": new_tokens, "prompt_tokens": runs[-1]["prompt_tokens"],
        "image_tokens": pipe.model["vision"]["image_tokens"], "stages": stages, "wall_ms": wall,
        "stage_sum_ms": [sum(r["ms"].values()) for r in runs], "wall_ms_rounds": [r["wall_ms"] for r in runs],
        "decode_ms_per_token": stages["decode"]["median"] / steps,
        "requests_per_s": batch / (wall["median"] / 1e3),
        "tokens_per_s": batch * new_tokens / (wall["median"] / 1e3),
        "decode_tokens_per_s": batch * steps / (stages["decode"]["median"] / 1e3),
        "text": runs[-1]["text"],
    }


def split_vision(stages: dict[str, Any], projector_share: float | None) -> None:
    """Split the vision stage into encoder and projector by the projector's share of the vision kernel time."""
    vision = stages.pop("vision")
    enc, proj = vision, None
    if projector_share is not None:
        keys = ("median", "p25", "p75", "min", "max", "share")
        enc = {**vision, **{k: vision[k] * (1 - projector_share) for k in keys}}
        proj = {**vision, **{k: vision[k] * projector_share for k in keys}}
    items = list(stages.items())
    at = [name for name, _ in items].index("embed_merge")
    stages.clear()
    stages.update(items[:at] + [("vision_encoder", enc), ("projector", proj)] + items[at:])
