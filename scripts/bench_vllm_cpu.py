"""mmtrt against vLLM on the same CPU and the same checkpoint: time to first token, decode ms per token and tokens/s,
for 1 and 8 concurrent clients, with images no engine has seen and with one image repeated. Each engine runs alone,
one after the other (mmtrt in this process, vLLM in its worker process and environment), with the same threads and
OpenMP wait policy, on the same images and prompt.

    PYTHONPATH=. python scripts/bench_vllm_cpu.py --work DIR --out docs/results/vllm-cpu.md [--layers 4 4]

The checkpoint is a random-weight LLaVA-OneVision-0.5B (scripts/scale_models.py, written tensor by tensor into
DIR once). mmtrt runs the bundles of its recipes (RECIPES: the model alone, and lossless or lossy passes); vLLM
runs the folder `mmtrt export hf` writes from the bare bundle (the Hub's key layout, the checkpoint's weights).
Decode is timed inside each request, from its first to its last token as this process receives them.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
from bench_vllm import placeholder_ids, serving_submitter, timed, vllm_alone_submitter  # noqa: E402

PROMPT = "Describe the picture in detail."
NEW_TOKENS = 33
SIZE = (500, 300)  # 2,015 prompt tokens on LLaVA-OneVision's any-resolution grid
PROMPT_TOKENS: dict[str, set[int]] = {}  # engine -> the prompt lengths it counted (text and image tokens)


def checkpoint(work: Path, layers, dtype: str = "float32") -> Path:
    """The random checkpoint, its weights stored in `dtype` (bfloat16 halves the pages a compile maps; every
    engine computes in the dtype it is given either way, and mmtrt's bundles are float32)."""
    import torch
    from random_checkpoint import write_checkpoint
    from scale_models import MODELS

    folder = work / "checkpoint"
    if not (folder / "config.json").is_file():
        write_checkpoint(folder, *MODELS["onevision-0.5b"](layers), dtype=getattr(torch, dtype))
    return folder


def mmtrt_cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "mmtrt.cli", *args], check=True, stdout=subprocess.DEVNULL)


# A CPU host runs every component on ONNX Runtime: TensorRT forms of the graphs (a copy of the LLM's for a
# kv_layout) would only cost the compile memory
ON_THE_CPU = "partition: {vision: [onnxruntime], embed: [onnxruntime], llm: [onnxruntime]}\n"
RECIPES = {  # passes after the model; every recipe's envelope is sized for the clients measured
    "bare": "",
    "static": "passes:\n  - kv_layout: {layout: static}\n",
    "int4": "passes:\n  - awq_int4: {}\n  - kv_layout: {layout: static}\n",
    "int8": "passes:\n  - int8_weights: {components: [vision], activations: dynamic}\n"
            "  - kv_layout: {layout: static}\n",
    # the recipe that holds zoo:dino-smollm's budgets (docs/results/int8-activations.md), AWQ's search or not
    "best": "passes:\n  - awq_int4: {group_size: 32, symmetric: false, zero_point: float}\n"
            "  - int8_weights: {components: [vision], activations: dynamic}\n  - kv_layout: {layout: static}\n",
    "best_rtn": "passes:\n  - awq_int4: {method: rtn, group_size: 32, symmetric: false, zero_point: float}\n"
                "  - int8_weights: {components: [vision], activations: dynamic}\n  - kv_layout: {layout: static}\n"
                "  - fuse_projections: {}\n  - pack_qkv_rotary: {}\n",
    # the same, its prompts on int8 GEMMs (recipes/dino-smollm-int4-cpu.yaml holds the budgets with it)
    "best_prefill": "passes:\n  - awq_int4: {method: rtn, group_size: 32, symmetric: false, zero_point: float}\n"
                    "  - int8_weights: {components: [vision], activations: dynamic}\n  - kv_layout: {layout: static}\n"
                    "  - fuse_projections: {}\n  - pack_qkv_rotary: {}\n"
                    "  - int8_prefill: {calibration: {text_windows: 0}, "
                    "exclude: [llm.lm_head, llm.layers.*.down_proj]}\n",
    # the down projections in the prompt graph too, their 32 largest input channels in float32
    "best_down": "passes:\n  - awq_int4: {method: rtn, group_size: 32, symmetric: false, zero_point: float}\n"
                 "  - int8_weights: {components: [vision], activations: dynamic}\n  - kv_layout: {layout: static}\n"
                 "  - fuse_projections: {}\n  - pack_qkv_rotary: {}\n"
                 "  - int8_prefill: {calibration: {text_windows: 0}, exclude: [llm.lm_head], "
                 "float_channels: {llm.layers.*.down_proj: 32}}\n",
}
LABELS = {"bare": "mmtrt, bare recipe (lossless, hf KV layout)", "static": "mmtrt, kv_layout static (lossless)",
          "int4": "mmtrt, awq_int4 + kv_layout static",
          "int8": "mmtrt, vision int8 dynamic + kv_layout static",
          "best": "mmtrt, awq_int4 g32 + vision int8 dynamic + static",
          "best_rtn": "mmtrt, int4 g32 (RTN) + vision int8 dynamic + static + fused",
          "best_prefill": "mmtrt, the same + int8 prompt graph",
          "best_down": "mmtrt, the same, down projections int8 with 32 float channels"}


def compiled(work: Path, source: Path, name: str, batch: int) -> tuple[Path, float]:
    """The recipe's bundle (compiled once) and its compile seconds (0 when it was already there)."""
    bundle, recipe = work / f"{name}.bundle", work / f"{name}.yaml"
    if (bundle / "manifest.json").is_file():
        return bundle, 0.0
    recipe.write_text(f"model: {{source: hf, path: {source}}}\n{RECIPES[name]}"
                      f"envelope:\n  batch: {{min: 1, opt: 1, max: {batch}}}\n{ON_THE_CPU}")
    started = time.perf_counter()
    mmtrt_cli("compile", str(recipe), "-o", str(bundle), "--force")
    return bundle, time.perf_counter() - started


def exported(work: Path, source: Path, batch: int) -> Path:
    """The bare bundle's Hugging Face folder, which vLLM loads (the bundle compiled for it where it is gone)."""
    folder = work / "hf"
    if not (folder / "config.json").is_file():
        mmtrt_cli("export", "hf", str(compiled(work, source, "bare", batch)[0]), str(folder))
    return folder


def unseen(rng, count: int) -> list:
    """Images of one size whose pixels no engine has met (both engines cache encoder outputs by content)."""
    from PIL import Image

    return [Image.fromarray(rng.integers(0, 256, (SIZE[1], SIZE[0], 3), dtype=np.uint8)) for _ in range(count)]


def measure(name: str, submitter, rng, repeats: int, clients: list[int]) -> list[tuple]:
    """Warm-up, then per case the best TTFT and the median decode of `repeats` runs."""
    submit, flush = submitter
    rows = []
    timed(submit, flush, unseen(rng, 1))
    repeated = unseen(rng, 1)
    timed(submit, flush, repeated)  # the image's first sight: later runs of it are the cached path
    cases = [("unseen", n, lambda n=n: unseen(rng, n)) for n in clients]
    cases.append(("repeated", 1, lambda: repeated))
    for images, n, draw in cases:
        runs = [timed(submit, flush, draw()) for _ in range(repeats if n == 1 else 1)]
        rows.append((name, images, n, min(r["ttft_ms"] for r in runs), statistics.median(r["decode_ms"] for r in runs),
                     statistics.median(r["tokens_per_s"] for r in runs)))
        print(rows[-1], flush=True)
    return rows


def measure_mmtrt(args, source: Path, rng) -> tuple[list[tuple], dict[str, float], dict]:
    """Each recipe's bundle through the serving loop; the prompt ids and facts vLLM's requests need."""
    from mmtrt.runtime import load
    from mmtrt.runtime.serving_loop import ServingLoop

    rows, compiles, facts = [], {}, {}
    for name in args.recipes:
        bundle, compiles[name] = compiled(args.work, source, name, max(args.clients))
        if name == "bare" and args.dtypes:
            exported(args.work, source, max(args.clients))
        pipe = load(bundle, threads=args.threads, spin=False)
        facts = {"ids": placeholder_ids(pipe, PROMPT), "model": pipe.model, "total": pipe.dims["total"]["max"]}
        loop = ServingLoop(pipe, max(args.clients))
        try:
            counted = PROMPT_TOKENS.setdefault("mmtrt", set())
            rows += measure(LABELS[name], serving_submitter(loop, PROMPT, NEW_TOKENS, counted), rng,
                            args.repeats, args.clients)
        finally:
            loop.close()
        del pipe, loop
        gc.collect()
        if args.discard_bundles:
            shutil.rmtree(bundle)
    return rows, compiles, facts


def measure_vllm(args, folder: Path, facts: dict, rng) -> list[tuple]:
    """vLLM alone on the exported folder (its own preprocessing, vision tower and prefix cache), per dtype."""
    from mmtrt.handoff.vllm_pipeline import kv_pool_bytes
    from mmtrt.handoff.vllm_process import VllmProcess

    model, total, batch, rows = facts["model"], facts["total"], max(args.clients), []
    kv_bytes = kv_pool_bytes(model["llm"], batch, total)
    for dtype in args.dtypes:
        engine = VllmProcess().load(folder, model["image_token_id"], dtype, total, batch, kv_bytes, prefix_caching=True)
        try:
            submitter = vllm_alone_submitter(engine, facts["ids"], model["eos_token_ids"], NEW_TOKENS,
                                             PROMPT_TOKENS.setdefault("vLLM", set()))
            rows += measure(f"vLLM {engine.version} ({dtype})", submitter, rng, args.repeats, args.clients)
        finally:
            engine.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--layers", type=int, nargs=2, help="vision and LLM layers, for a cheaper trial")
    parser.add_argument("--checkpoint-dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the random checkpoint's stored dtype")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"], help="vLLM's (none: mmtrt alone)")
    parser.add_argument("--recipes", nargs="+", default=["bare", "static"], choices=sorted(RECIPES),
                        help="mmtrt's (vLLM runs the bare bundle's export)")
    parser.add_argument("--discard-bundles", action="store_true",
                        help="delete each bundle once measured (a real-size bundle is 3.6 GB of disk)")
    args = parser.parse_args()
    args.commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=ROOT).stdout.strip()  # the code that runs, whatever is committed meanwhile
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}"  # all the cores mmtrt gets: none reserved
    args.work.mkdir(parents=True, exist_ok=True)
    source, rng = checkpoint(args.work, args.layers, args.checkpoint_dtype), np.random.default_rng(0)
    rows, compiles, facts = measure_mmtrt(args, source, rng)
    if args.dtypes:
        rows += measure_vllm(args, exported(args.work, source, max(args.clients)), facts, rng)
    if args.out:
        write_table(args, rows, compiles)
    return 0


def ratio(rows, name, images, clients, column, reference) -> str:
    """`reference`'s value over `name`'s (time columns) or `name`'s over `reference`'s (tokens/s): above 1 is
    mmtrt ahead."""
    find = {(r[0], r[1], r[2]): r for r in rows}
    ours, theirs = find.get((name, images, clients)), find.get((reference, images, clients))
    if not ours or not theirs:
        return "-"
    return f"{(ours[column] / theirs[column]) if column == 5 else (theirs[column] / ours[column]):.2f}x"


def recipe_line(name: str, seconds: float) -> str:
    passes = ", ".join(line.strip()[2:] for line in RECIPES[name].splitlines() if line.strip().startswith("- "))
    passes = passes or "the model alone"
    return f"{name}: {passes}" + (f" (compiled in {seconds:.0f} s)" if seconds else "")


def write_table(args, rows, compiles: dict[str, float]) -> None:
    shape = f"{args.layers[0]} vision + {args.layers[1]} LLM layers" if args.layers else "all 26 + 24 layers"
    command = "PYTHONPATH=. python scripts/bench_vllm_cpu.py " + " ".join(
        "DIR" if a == str(args.work) else "FILE.md" if a == str(args.out) else a for a in sys.argv[1:])
    lines = [
        "# mmtrt against vLLM on the same CPU", "",
        f"Date: {time.strftime('%Y-%m-%d')}. Commit: {args.commit}. Machine: 2-core x86-64 VM (AVX-512), 24 GB, no GPU. "
        f"Command: `{command}`.", "",
        f"A random-weight LLaVA-OneVision-0.5B ({shape}: SigLIP so400m/14 at 384, Qwen2-0.5B, vocabulary 151,936), "
        f"{args.checkpoint_dtype} weights (mmtrt's bundles float32). Every request: one {SIZE[0]}x{SIZE[1]} image, "
        f"the prompt \"{PROMPT}\", {NEW_TOKENS} new tokens, greedy. {args.threads} threads for every engine (ONNX "
        "Runtime not spinning; vLLM bound to the same cores), OMP_WAIT_POLICY=PASSIVE. mmtrt runs each bundle in the "
        "serving loop `mmtrt serve` runs (requests join between decode steps; beside running ones a prefill goes in "
        "pieces of 256 tokens and the image's encoder a tile per call): "
        + "; ".join(recipe_line(n, s) for n, s in compiles.items())
        + ". vLLM runs `mmtrt export hf` of the bare bundle with its own preprocessing and vision tower, eager (no "
        "torch.compile). \"unseen\": every request's image is new to both engines; \"repeated\": an earlier request "
        "again, the same image and prompt (vLLM's prefix cache holds the prompt; mmtrt's holds it but its last token "
        "under a kv_layout, and the hf layout keeps the image's features and pixels only). "
        f"TTFT: the best of {args.repeats} runs with one client, the median over clients with eight; "
        "decode: the median per request of (last token - first token) / (tokens - 1). Ratios: vLLM's time over "
        "mmtrt's, and mmtrt's tokens/s over vLLM's; above 1 is mmtrt ahead. Prompt tokens per request as each "
        "engine counted them: " + "; ".join(f"{k} {', '.join(map(str, sorted(v)))}" for k, v in PROMPT_TOKENS.items())
        + ".", "",
        "| engine | images | clients | TTFT ms | decode ms/token | tokens/s | TTFT vs vLLM fp32 | decode vs vLLM fp32 "
        "| TTFT vs vLLM bf16 | decode vs vLLM bf16 |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    fp32 = next((r[0] for r in rows if "float32" in r[0] and r[0].startswith("vLLM")), None)
    bf16 = next((r[0] for r in rows if "bfloat16" in r[0]), None)
    for name, images, clients, ttft, decode, tps in rows:
        cells = [ratio(rows, name, images, clients, c, ref) if name.startswith("mmtrt") else ""
                 for ref in (fp32, bf16) for c in (3, 4)]
        lines.append(f"| {name} | {images} | {clients} | {ttft:.0f} | {decode:.1f} | {tps:.2f} | " + " | ".join(cells)
                     + " |")
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
