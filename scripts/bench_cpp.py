"""The C++ runtime against the Python runtime on the same bundles: load time, time to first token and decode
ms/token, one ONNX Runtime thread each and spinning off, measured side by side (A B A B) in one process (the
C++ one through its C API), medians and ratios. `make cpp` first. The machine is shared: trust the ratios.

    .venv/bin/python scripts/bench_cpp.py [BUNDLE ...] [--repeats 5] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from builders import random_image  # noqa: E402
from cpp_harness import CApi  # noqa: E402
from mmtrt.bundle.manifest import read_manifest, verify_artifacts  # noqa: E402
from mmtrt.runtime import load  # noqa: E402

import numpy as np  # noqa: E402

DEFAULT_BUNDLES = ["/work/bundles/tiny-llava.bundle", "/work/bundles/dino-smollm.bundle"]
PROMPT = "Describe the picture in detail."


class Python:
    name = "python"

    def load(self, bundle):
        t = time.perf_counter()
        self.pipe = load(bundle, threads=1, spin=False)
        return time.perf_counter() - t

    def generate(self, image, tokens):
        return self.pipe.generate(image, PROMPT, max_new_tokens=tokens).to_json()

    def close(self):
        self.pipe = None


class Cpp:
    name = "cpp"

    def __init__(self):
        self.api = CApi()
        self.handle = None

    def load(self, bundle):
        self.close()
        t = time.perf_counter()
        status, handle = self.api.load(bundle, threads=1, spin=False)
        elapsed = time.perf_counter() - t
        assert status == 0, self.api.error()
        self.handle = handle
        return elapsed

    def generate(self, image, tokens):
        status, result = self.api.generate(self.handle, image, PROMPT, tokens)
        assert status == 0, self.api.error()
        return result

    def close(self):
        if self.handle:
            self.api.free(self.handle)
            self.handle = None


def measure(bundle: Path, repeats: int, new_tokens: int, image: Path) -> dict[str, dict[str, float]]:
    runtimes = [Python(), Cpp()]
    samples = {r.name: {"load_s": [], "ttft_ms": [], "decode_ms_per_token": []} for r in runtimes}
    tokens, hashing = {}, []
    for rep in range(repeats):
        t = time.perf_counter()  # the sha256 check the C++ load does (Python's verify_artifacts, same OpenSSL)
        assert not verify_artifacts(bundle, read_manifest(bundle))
        hashing.append(time.perf_counter() - t)
        for runtime in runtimes if rep % 2 == 0 else runtimes[::-1]:
            s = samples[runtime.name]
            s["load_s"].append(runtime.load(bundle))
            runtime.generate(image, 1)  # warm-up: first-run allocations are not what a service sees
            t = time.perf_counter()
            runtime.generate(image, 1)
            s["ttft_ms"].append(1e3 * (time.perf_counter() - t))
            result = runtime.generate(image, new_tokens)
            s["decode_ms_per_token"].append(result["timings"]["decode_ms_per_token"])
            tokens[runtime.name] = result["token_ids"]
            runtime.close()
    assert tokens["python"] == tokens["cpp"], "the runtimes generated different tokens"
    return {name: {k: statistics.median(v) for k, v in s.items()} for name, s in samples.items()} | {
        "new_tokens": len(tokens["cpp"]), "sha256_s": statistics.median(hashing)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", nargs="*", default=DEFAULT_BUNDLES)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        image = Path(tmp) / "image.png"
        random_image(np.random.default_rng(0), 180, 240).save(image)
        print("| bundle | metric | Python | C++ | C++ / Python |")
        print("|---|---|---:|---:|---:|")
        for bundle in map(Path, args.bundles):
            m = measure(bundle, args.repeats, args.new_tokens, image)
            for metric, unit in (("load_s", "s"), ("ttft_ms", "ms"), ("decode_ms_per_token", "ms")):
                py, cpp = m["python"][metric], m["cpp"][metric]
                print(f"| {bundle.name} | {metric} | {py:.3f} {unit} | {cpp:.3f} {unit} | {cpp / py:.2f}x |")
            print(f"| {bundle.name} | of which the sha256 check (hashlib) | | {m['sha256_s']:.3f} s | |")
            print(f"| {bundle.name} | tokens decoded (identical) | {m['new_tokens']} | {m['new_tokens']} | |",
                  flush=True)


if __name__ == "__main__":
    main()
