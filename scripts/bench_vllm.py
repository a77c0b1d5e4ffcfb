"""Time to first token, decode ms per token and tokens/s with 1 and 8 concurrent requests, side by side in one run:
`mmtrt run` on a bundle; vLLM alone on the checkpoint's folder (its own preprocessing and vision tower), fp32 and
bf16; and the split (mmtrt's vision side, vLLM's LLM fed with image_embeds) on a plain and a token-pruned bundle.
Every request carries an image no engine has seen (vLLM caches encoder outputs by image content).

    PYTHONPATH=. python scripts/bench_vllm.py --out docs/results/vllm-split.md

The model is a tiny random-weight LLaVA in the Hub's layout (tests/hub_checkpoint.py), compiled twice here.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

PROMPT = "describe the picture in detail"
NEW_TOKENS = 24


def images(rng, n):
    from builders import random_image

    return [random_image(rng, int(rng.integers(48, 96)), int(rng.integers(48, 96))) for _ in range(n)]


def timed(submit, flush, requests) -> dict:
    """submit(image, on_tokens) for each image at once, then flush() (an engine that runs on the caller's thread
    runs them then); TTFT (median), decode ms/token (median), tokens/s overall."""
    done: queue.SimpleQueue = queue.SimpleQueue()
    start = time.perf_counter()
    firsts, ends, counts = {}, {}, {}

    def on_tokens(i, n, final):
        now = time.perf_counter()
        if n:
            firsts.setdefault(i, now)
        counts[i] = counts.get(i, 0) + n
        if final:
            ends[i] = now
            done.put(i)

    for i, image in enumerate(requests):
        submit(image, lambda n, final, i=i: on_tokens(i, n, final))
    flush()
    for _ in requests:
        done.get(timeout=600)
    total = max(ends.values()) - start
    return {"ttft_ms": 1e3 * statistics.median(firsts[i] - start for i in ends),
            "decode_ms": 1e3 * statistics.median((ends[i] - firsts[i]) / max(counts[i] - 1, 1) for i in ends),
            "tokens_per_s": sum(counts.values()) / total}


def mmtrt_submitter(pipe, prompt=PROMPT, new_tokens=NEW_TOKENS):
    """The bundle's own runtime: requests of one call decode together (generate_batch), as `mmtrt run` batches."""
    from mmtrt.runtime import Request
    from mmtrt.runtime.scheduler import run_to_end

    pending = []

    def submit(image, on_tokens):
        pending.append((image, on_tokens))

    def flush():
        preps = [pipe.prepare(i, Request(img, prompt, new_tokens)) for i, (img, _) in enumerate(pending)]
        for seq, delta in run_to_end(pipe, preps):
            pending[seq.prep.index][1](len(delta.token_ids), bool(delta.finish_reason))
        pending.clear()

    return submit, flush


def split_submitter(pipe):
    from mmtrt.handoff.vllm_scheduler import run_to_end
    from mmtrt.runtime import Request

    pending = []

    def submit(image, on_tokens):
        pending.append((image, on_tokens))

    def flush():
        preps = [pipe.prepare(i, Request(img, PROMPT, NEW_TOKENS)) for i, (img, _) in enumerate(pending)]
        for seq, delta in run_to_end(pipe.scheduler(), preps):
            pending[seq.prep.index][1](len(delta.token_ids), bool(delta.finish_reason))
        pending.clear()

    return submit, flush


def vllm_alone_submitter(engine, ids, eos_token_ids, new_tokens=NEW_TOKENS, prompt_tokens: set | None = None):
    """vLLM's own preprocessing and vision tower: the raw image and the prompt `ids` with one image placeholder;
    `prompt_tokens` collects the prompt lengths vLLM expanded them to."""
    greedy = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None, "repetition_penalty": 1.0}

    def on_message(m, on_tokens):
        if prompt_tokens is not None and "prompt_tokens" in m:
            prompt_tokens.add(m["prompt_tokens"])
        on_tokens(len(m["tokens"]), m["finish_reason"] is not None)

    def submit(image, on_tokens):
        engine.submit(engine.new_id(), ids, None, greedy, new_tokens, list(eos_token_ids),
                      lambda m: on_message(m, on_tokens), image=np.asarray(image))

    return submit, lambda: None


def placeholder_ids(pipe, prompt=PROMPT) -> list[int]:
    """The prompt's ids with the image's run of tokens as one placeholder, which vLLM expands itself."""
    from mmtrt.handoff.vllm_scheduler import collapse_image_runs

    return collapse_image_runs(pipe.prompt_ids(prompt), pipe.model["image_token_id"])


def measure(name, submitter, rng, rows, repeats):
    submit, flush = submitter
    for clients in (8, 1):  # warm-up: the CPU kernels' first calls at new shapes
        timed(submit, flush, images(rng, clients))
    for clients in (1, 8):
        runs = [timed(submit, flush, images(rng, clients)) for _ in range(repeats)]
        rows.append((name, clients, *(statistics.median(r[k] for r in runs)
                                      for k in ("ttft_ms", "decode_ms", "tokens_per_s"))))
        print(rows[-1], flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from hub_checkpoint import compile_plain_and_pruned, save_hub_llava

    from mmtrt.handoff.vllm_pipeline import load as load_split
    from mmtrt.runtime import load

    tmp = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    folder = save_hub_llava(tmp / "hub")
    bundles = compile_plain_and_pruned(folder)
    rng, rows = np.random.default_rng(0), []
    for name, bundle in bundles.items():
        measure(f"mmtrt run ({name} bundle)", mmtrt_submitter(load(bundle, threads=1, spin=False)), rng, rows,
                args.repeats)
    for dtype in ("float32", "bfloat16"):
        plain = load_split(bundles["plain"], folder, dtype, max_batch=8, threads=1, spin=False)
        pruned = load_split(bundles["pruned"], folder, dtype, max_batch=8, threads=1, spin=False, engine=plain.engine)
        alone = vllm_alone_submitter(plain.engine, placeholder_ids(plain), plain.model["eos_token_ids"])
        measure(f"vLLM alone ({dtype})", alone, rng, rows, args.repeats)
        for label, pipe in (("plain", plain), ("token-pruned", pruned)):
            measure(f"split, {label} bundle + vLLM {dtype}", split_submitter(pipe), rng, rows, args.repeats)
        plain.close()
    if args.out:
        write_table(args.out, rows, args.repeats)
    return 0


def write_table(out: Path, rows, repeats) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    lines = [
        "# vLLM beside mmtrt: the split against mmtrt alone and vLLM alone", "",
        f"Date: {time.strftime('%Y-%m-%d')}. Commit: {commit}. Machine: 2-core x86-64 VM, 24 GB, no GPU, shared with "
        "other jobs. Command: `PYTHONPATH=. python scripts/bench_vllm.py --out docs/results/vllm-split.md`.", "",
        f"A tiny random-weight LLaVA (CLIP 64 px / 8, 64 image tokens; LLaMA 4 layers, hidden 128, head 32), {NEW_TOKENS} "
        f"new tokens, greedy; every request with an image not seen before; medians of {repeats} runs after one warm-up round per engine. One thread "
        "for ONNX Runtime (not spinning) and vLLM's one OpenMP thread (it reserves the other core); OMP_WAIT_POLICY="
        "PASSIVE. 8 clients: 8 requests at once, decoded together by each engine. The token-pruned bundle keeps 32 "
        "of 64 image tokens (token_prune keep 0.5). On a model this small the times are the engines' overheads, "
        "not the model's arithmetic: read the ratios, not the absolute numbers.", "",
        "| engine | clients | TTFT ms | decode ms/token | tokens/s |", "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {n} | {c} | {t:.0f} | {d:.1f} | {s:.1f} |" for n, c, t, d, s in rows]
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
