"""The serving loop's continuous batching against one request at a time, on one bundle, in one process.

`python scripts/bench_serving_loop.py BUNDLE [--requests 24] [--clients 8] [--rounds 3] [--threads 2] [--serve-pool]`

The same requests (mixed prompt lengths and token limits, several images) go through one `ServingLoop` twice per
round: by one client that waits for each answer before sending the next, and by `--clients` closed-loop clients
at once; rounds alternate the two (A B A B) and the table gives medians: tokens/s, requests/s, time to first token
and inter-token latency at p50 and p99 over every request of the mode's rounds. Greedy decoding; the image-prefix
LRU is off (each request runs its vision encoder), ONNX Runtime with `--threads` intra-op threads and no spinning,
OMP_WAIT_POLICY=PASSIVE. The runtime alone: no server, no HTTP. `admission share`: the requests' vision encoder and
prefill time over the wall time (admissions run one at a time on the loop's thread, between decode steps).
`--serve-pool`: scripts/bench_serve.py's request pool instead (`--requests` of them, in its order), with the
image-prefix LRU on as `mmtrt serve` runs it, so the loop alone is compared with the server on the same requests.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--serve-pool", action="store_true")
    args = parser.parse_args()
    pipe = load(args.bundle, threads=args.threads, spin=False, prefix_cache_mib=256 if args.serve_pool else 0)
    requests = (serve_pool(args.requests) if args.serve_pool
                else workload(args.requests, pipe.manifest["envelope"]["max_new_tokens"]))
    modes = {"1 client": 1, f"{args.clients} clients": args.clients}
    results = {mode: [] for mode in modes}
    with ServingLoop(pipe, max_queue=len(requests)) as loop:
        run(loop, requests[:12 if args.serve_pool else 2], 1)  # warm-up (the serve pool: each image's prefix kept)
        for _ in range(args.rounds):
            for mode, clients in modes.items():
                results[mode].append(run(loop, requests, clients))
    rows = {mode: summary(runs) for mode, runs in results.items()}
    keys = list(next(iter(rows.values())))
    print("| mode | " + " | ".join(keys) + " |")
    print("| --- " * (len(keys) + 1) + "|")
    for mode, row in rows.items():
        print(f"| {mode} | " + " | ".join(f"{row[k]:.2f}" for k in keys) + " |")
    one, many = rows["1 client"], rows[f"{args.clients} clients"]
    print(f"\ntokens/s ratio, {args.clients} clients / 1 client: {many['tokens/s'] / one['tokens/s']:.2f}x "
          f"(medians of {args.rounds} alternating rounds, {args.requests} requests each)")


if __name__ == "__main__":
    main()
