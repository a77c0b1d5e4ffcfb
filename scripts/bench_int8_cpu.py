"""A bundle's int8 vision matmuls against float32 on this CPU: the vision encoder's time and its features' error.

`python scripts/bench_int8_cpu.py FLOAT_BUNDLE INT8_BUNDLE [--images 2] [--runs 3] [--threads 2]
    [--prefill BUNDLE --tokens 2048]`

FLOAT_BUNDLE is compiled from a checkpoint without lossy passes, INT8_BUNDLE from the same checkpoint with
`int8_weights: {components: [vision], activations: dynamic}` (or `per_token`). Each image (random, of a size drawn
per image) is preprocessed by the float bundle, and the same pixels go through three sessions on the bundles' vision
graphs, side by side (A B C A B C, medians): float32, int8 as mmtrt's runtimes run it (ONNX Runtime's exact uint8 x
uint8 GEMM where this CPU's uint8 x int8 GEMM saturates: no VNNI; mmtrt/backends/int8_gemm.py), and, on such a CPU,
int8 on the saturating GEMM (ONNX Runtime's default). The error is each int8 form's largest deviation from the
float32 features, relative to their largest magnitude, and the mean deviation relative to their mean magnitude.

`--prefill`: a bundle with `int8_prefill` (static KV layout) whose prompt graph runs a prompt of `--tokens` random
tokens (embedded by the bundle's table) on each GEMM beside its INT4 graph, which it stands in for; the error is
the last position's logits' largest deviation from the INT4 graph's, relative to their largest magnitude.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

from mmtrt.backends.int8_gemm import graph_ops, saturates
from mmtrt.backends.onnxruntime_backend import session_options
from mmtrt.runtime import load


def image(rng) -> Image.Image:
    """A smooth random image (a coarse grid of colours, upsampled) with some noise, of a random size."""
    width, height = int(rng.integers(320, 700)), int(rng.integers(240, 520))
    coarse = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((width, height), Image.BICUBIC)
    noisy = np.asarray(coarse, np.int16) + rng.integers(-12, 13, (height, width, 3))
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def component_session(bundle: Path, name: str, threads: int, exact: bool) -> ort.InferenceSession:
    path = bundle / json.loads((bundle / "manifest.json").read_text())["components"][name]["artifact"]
    options = session_options(threads, False, ops=graph_ops(path) if exact else ())
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def static_feeds(session: ort.InferenceSession, embeds: np.ndarray) -> dict[str, np.ndarray]:
    """One prompt into empty static KV buffers as long as the prompt, the last position's logits only."""
    seq = embeds.shape[1]
    feeds = {"inputs_embeds": embeds, "position_ids": np.arange(seq, dtype=np.int64)[None],
             "seqlens_k": np.array([seq - 1], np.int32), "total_sequence_length": np.array(seq, np.int32),
             "logits_from": np.array([seq - 1], np.int64)}
    for i in session.get_inputs():
        if i.name.startswith("past."):
            feeds[i.name] = np.zeros((1, i.shape[1], seq, i.shape[3]), np.float32)
    return feeds


def prefill_rows(bundle: Path, tokens: int, runs: int, threads: int, rng) -> None:
    pipe = load(bundle, threads=threads, spin=False)
    vocab = json.loads((bundle / "manifest.json").read_text())["model"]["llm"]["vocab_size"]
    embeds = pipe.embed(rng.integers(0, vocab, (1, tokens)))
    prompt = json.loads((bundle / "manifest.json").read_text())["model"]["prefill"]["component"]
    sessions = {"INT4 graph": component_session(bundle, "llm", threads, True),
                "int8 prompt graph, exact GEMM": component_session(bundle, prompt, threads, True)}
    if saturates():
        sessions["int8 prompt graph, saturating GEMM"] = component_session(bundle, prompt, threads, False)
    times, logits = {name: [] for name in sessions}, {}
    for _ in range(runs):
        for name, session in sessions.items():
            feeds = static_feeds(session, embeds)
            t0 = time.perf_counter()
            logits[name] = session.run(["logits"], feeds)[0]
            times[name].append(1e3 * (time.perf_counter() - t0))
    ref, base = logits["INT4 graph"], statistics.median(times["INT4 graph"])
    print(f"\n| prompt of {tokens} tokens | prefill ms | INT4 graph's time / this | max error |")
    print("| --- | ---: | ---: | ---: |")
    for name, out in logits.items():
        ms = statistics.median(times[name])
        print(f"| {name} | {ms:,.0f} | {base / ms:.2f}x | {np.abs(out - ref).max() / np.abs(ref).max():.2%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("float_bundle", type=Path)
    parser.add_argument("int8_bundle", type=Path)
    for name, default in (("images", 2), ("runs", 3), ("threads", 2), ("tokens", 2048)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--prefill", type=Path)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    pipe = load(args.float_bundle, threads=args.threads, spin=False)
    sessions = {"float32": component_session(args.float_bundle, "vision", args.threads, False),
                "int8, exact GEMM": component_session(args.int8_bundle, "vision", args.threads, True)}
    if saturates():
        sessions["int8, saturating GEMM"] = component_session(args.int8_bundle, "vision", args.threads, False)
    flags = open("/proc/cpuinfo").read().split()
    print(f"onnxruntime {ort.__version__}; CPU flags: "
          + ", ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni") if f in flags)
          + f"; uint8 x int8 GEMM saturates: {saturates()}; {args.threads} threads, median of {args.runs}\n")
    print("| image | tiles | form | vision ms | float32 time / this | max error | mean error |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for _ in range(args.images):
        img = image(rng)
        pixels = pipe.pixel_values(img)
        times = {name: [] for name in sessions}
        outputs = {}
        for _ in range(args.runs):
            for name, session in sessions.items():
                t0 = time.perf_counter()
                outputs[name] = session.run(["image_features"], {"pixel_values": pixels})[0]
                times[name].append(1e3 * (time.perf_counter() - t0))
        ref = outputs["float32"]
        base = statistics.median(times["float32"])
        for name, out in outputs.items():
            ms = statistics.median(times[name])
            diff = np.abs(out - ref)
            print(f"| {img.width}x{img.height} | {len(pixels)} | {name} | {ms:,.0f} | {base / ms:.2f}x | "
                  f"{diff.max() / np.abs(ref).max():.2%} | {diff.mean() / np.abs(ref).mean():.2%} |")
    if args.prefill:
        prefill_rows(args.prefill, args.tokens, args.runs, args.threads, rng)


if __name__ == "__main__":
    main()
