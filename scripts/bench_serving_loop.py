"""The serving loop's continuous batching against one request at a time, on one bundle, in one process.

`python scripts/bench_serving_loop.py BUNDLE [--requests 24] [--clients 8] [--rounds 3] [--threads 2] [--serve-pool]
[--repeated-image N]`

The same requests (mixed prompt lengths and token limits, several images) go through one `ServingLoop` twice per
round: by one client that waits for each answer before sending the next, and by `--clients` closed-loop clients
at once; rounds alternate the two (A B A B) and the table gives medians: tokens/s, requests/s, time to first token
and inter-token latency at p50 and p99 over every request of the mode's rounds. Greedy decoding; the image-prefix
LRU and the encoder cache are off (each request runs its vision encoder), ONNX Runtime with `--threads` intra-op
threads and no spinning, OMP_WAIT_POLICY=PASSIVE. The runtime alone: no server, no HTTP. `admission share`: the
requests' vision encoder and prefill time over the wall time (admissions run on the loop's thread, between decode
steps). Each mode runs with the waiting admissions prefilled together (`batched`, where the KV layout allows it)
and one at a time (`solo`), in the same rounds.
`--serve-pool`: scripts/bench_serve.py's request pool instead (`--requests` of them, in its order), with the
image-prefix LRU on as `mmtrt serve` runs it, so the loop alone is compared with the server on the same requests.
`--repeated-image N`: instead, N requests on one image seen before (each with another question, one at a time),
with the encoder cache on and off in alternating rounds: time to first token p50 and its ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from mmtrt.runtime import Request, SamplingParams, ServingLoop, load  # noqa: E402
from mmtrt.runtime.encoder_cache import EncoderCache  # noqa: E402

WORDS = "what is the digit in the picture describe its shape and the colours around it please".split()


def workload(n: int, limit: int, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    images = [Image.fromarray(rng.integers(0, 256, (int(rng.integers(60, 200)), int(rng.integers(60, 200)), 3),
                                           dtype=np.uint8)) for _ in range(4)]
    return [Request(images[i % 4], " ".join(rng.choice(WORDS, int(rng.integers(3, 30)))),
                    sampling=SamplingParams(int(rng.integers(limit // 3, limit + 1)))) for i in range(n)]


def run(loop: ServingLoop, requests: list[Request], clients: int) -> dict:
    """Closed-loop clients pull the next request when their last one finished; timings per request."""
    todo, lock, records = list(enumerate(requests)), threading.Lock(), []

    def client():
        while True:
            with lock:
                if not todo:
                    return
                _, request = todo.pop(0)
            stamps = []
            handle = loop.submit(request, on_delta=lambda d: stamps.append(time.monotonic()) if d.token_ids else None)
            generation = handle.result()
            gaps = np.diff(stamps).tolist()
            admission = (generation.timings.get("vision_ms", 0) + generation.timings["prefill_ms"]) / 1e3
            records.append((handle.time_to_first_token_s, gaps, len(generation.token_ids), admission))

    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    return {"wall": wall, "tokens": sum(r[2] for r in records), "ttft": [r[0] for r in records],
            "itl": [g for r in records for g in r[1]], "requests": len(records),
            "admission": sum(r[3] for r in records)}


def summary(runs: list[dict]) -> dict:
    ttft = [t for r in runs for t in r["ttft"]]
    itl = [g for r in runs for g in r["itl"]]
    return {"tokens/s": statistics.median(r["tokens"] / r["wall"] for r in runs),
            "requests/s": statistics.median(r["requests"] / r["wall"] for r in runs),
            "ttft p50 ms": 1e3 * np.percentile(ttft, 50), "ttft p99 ms": 1e3 * np.percentile(ttft, 99),
            "itl p50 ms": 1e3 * np.percentile(itl, 50), "itl p99 ms": 1e3 * np.percentile(itl, 99),
            "admission share": statistics.median(r["admission"] / r["wall"] for r in runs)}


def serve_pool(n: int) -> list[Request]:
    from bench_serve import pool_items

    items = pool_items(np.random.default_rng(0))
    return [Request(image, prompt, sampling=SamplingParams(limit, **sampling))
            for image, prompt, limit, sampling in (items[i % len(items)] for i in range(n))]


def print_table(rows: dict[str, dict]) -> None:
    keys = list(next(iter(rows.values())))
    print("| mode | " + " | ".join(keys) + " |")
    print("| --- " * (len(keys) + 1) + "|")
    for mode, row in rows.items():
        print(f"| {mode} | " + " | ".join(f"{row[k]:.2f}" for k in keys) + " |")


def admissions(loop: ServingLoop, requests: list[Request], clients: int, rounds: int, serve: bool) -> None:
    """1 and `clients` clients, admissions batched and solo, alternating within each round."""
    modes = {f"{n} client{'s' * (n > 1)}, {how}": (n, how == "batched") for how in ("batched", "solo")
             for n in (1, clients)}
    results = {mode: [] for mode in modes}
    run(loop, requests[:12 if serve else 2], 1)  # warm-up (the serve pool: each image's prefix kept)
    for _ in range(rounds):
        for mode, (n, batched) in modes.items():
            loop.batch_admissions = batched
            results[mode].append(run(loop, requests, n))
    rows = {mode: summary(runs) for mode, runs in results.items()}
    print_table(rows)
    for how in ("batched", "solo"):
        one, many = rows[f"1 client, {how}"], rows[f"{clients} clients, {how}"]
        print(f"tokens/s ratio, {clients} clients / 1 client, admissions {how}: "
              f"{many['tokens/s'] / one['tokens/s']:.2f}x")
    print(f"(medians of {rounds} alternating rounds, {len(requests)} requests each)")


def repeated_image(pipe, loop: ServingLoop, n: int, rounds: int) -> None:
    """TTFT of requests on an image seen before, the encoder cache on and off in alternating rounds."""
    rng = np.random.default_rng(1)
    image = Image.fromarray(rng.integers(0, 256, (180, 150, 3), dtype=np.uint8))
    asks = [Request(image, " ".join(rng.choice(WORDS, int(rng.integers(3, 12)))), sampling=SamplingParams(4))
            for _ in range(n)]
    ttft = {"encoder cache on": [], "encoder cache off": []}
    for _ in range(rounds):
        for mode in ttft:
            pipe.encoder_cache = EncoderCache(256 if mode.endswith("on") else 0)
            run(loop, asks[:1], 1)  # the image is seen once
            ttft[mode] += run(loop, asks, 1)["ttft"]
    rows = {mode: {"ttft p50 ms": 1e3 * np.percentile(t, 50), "ttft min ms": 1e3 * min(t)} for mode, t in ttft.items()}
    print_table(rows)
    on, off = rows["encoder cache on"]["ttft p50 ms"], rows["encoder cache off"]["ttft p50 ms"]
    print(f"TTFT p50, encoder cache off / on: {off / on:.2f}x ({rounds} alternating rounds of {n} requests)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--serve-pool", action="store_true")
    parser.add_argument("--repeated-image", type=int, metavar="N")
    args = parser.parse_args()
    # the encoder cache off (as the image-prefix LRU) unless the serve pool runs as `mmtrt serve` does
    pipe = load(args.bundle, threads=args.threads, spin=False, prefix_cache_mib=256 if args.serve_pool else 0,
                encoder_cache_mib=256 if args.serve_pool else 0)
    requests = (serve_pool(args.requests) if args.serve_pool
                else workload(args.requests, pipe.manifest["envelope"]["max_new_tokens"]))
    with ServingLoop(pipe, max_queue=len(requests)) as loop:
        if args.repeated_image:
            repeated_image(pipe, loop, args.repeated_image, args.rounds)
        else:
            admissions(loop, requests, args.clients, args.rounds, args.serve_pool)


if __name__ == "__main__":
    main()
