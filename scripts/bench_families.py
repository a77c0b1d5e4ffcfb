"""Per model family, on its tiny random checkpoint: the bundle's time to first token and decode time per token
against PyTorch eager (transformers' `generate`), at two image sizes, and the image tokens each size takes.

Each family is one entry of FAMILIES (a builder of the model and processor, and two image sizes); the checkpoint
is saved, compiled with the default recipe, and both sides run the same requests side by side (A B A B, medians
over rounds). Time to first token: wall time of a 1-token generation (preprocessing, vision, prefill, one token);
decode: (wall time of N tokens - that) / (N - 1). One thread everywhere, OMP_WAIT_POLICY=PASSIVE, ONNX Runtime
spinning off.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/bench_families.py [--rounds 5] [--tokens 16] [--only qwen2_vl]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from builders import random_image  # noqa: E402

from mmtrt.compiler import compile_recipe  # noqa: E402
from mmtrt.runtime import load  # noqa: E402
from mmtrt.zoo.tiny_qwen2_vl import build_tiny_qwen2_vl  # noqa: E402

PROMPT = "Describe the picture."
# family -> (builder of (model, processor), two (height, width) image sizes)
FAMILIES = {
    "qwen2_vl": (lambda: build_tiny_qwen2_vl("qwen2_vl"), [(64, 64), (112, 140)]),
    "qwen2_5_vl": (lambda: build_tiny_qwen2_vl("qwen2_5_vl"), [(64, 64), (112, 140)]),
}


def eager(model, processor, image, tokens: int) -> tuple[float, int]:
    """Seconds of a greedy generation of `tokens` tokens with transformers, and the prompt's image tokens."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
    t0 = time.perf_counter()
    inputs = processor(images=image, text=processor.apply_chat_template(messages, add_generation_prompt=True),
                       return_tensors="pt")
    with torch.no_grad():
        model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    image_tokens = int((inputs["input_ids"] == model.config.image_token_id).sum())
    return time.perf_counter() - t0, image_tokens


def bundle(pipe, image, tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = pipe.generate(image, PROMPT, max_new_tokens=tokens)
    if len(out.token_ids) != tokens:
        raise SystemExit(f"the bundle stopped after {len(out.token_ids)} tokens; pick another image seed")
    return time.perf_counter() - t0, out.image_tokens


def measure(name: str, rounds: int, tokens: int, folder: Path) -> list[dict]:
    build, sizes = FAMILIES[name]
    model, processor = build()
    model.generation_config.eos_token_id = None  # both sides generate exactly `tokens` (the bundle: its own EOS)
    model.save_pretrained(folder / "checkpoint")
    processor.save_pretrained(folder / "checkpoint")
    (folder / "recipe.yaml").write_text("model: {source: hf, path: checkpoint}\n")
    pipe = load(compile_recipe(folder / "recipe.yaml", folder / "bundle"), threads=1, spin=False)
    rows = []
    for size in sizes:
        image = random_image(np.random.default_rng(0), *size)
        times = {k: [] for k in ("eager_1", "eager_n", "bundle_1", "bundle_n")}
        for _ in range(rounds):  # A B A B
            for key, run, n in (("eager_1", lambda n: eager(model, processor, image, n), 1),
                                ("bundle_1", lambda n: bundle(pipe, image, n), 1),
                                ("eager_n", lambda n: eager(model, processor, image, n), tokens),
                                ("bundle_n", lambda n: bundle(pipe, image, n), tokens)):
                seconds, image_tokens = run(n)
                times[key].append(seconds)
        med = {k: statistics.median(v) for k, v in times.items()}
        decode = {side: (med[f"{side}_n"] - med[f"{side}_1"]) / (tokens - 1) for side in ("eager", "bundle")}
        rows.append({"family": name, "size": f"{size[1]}x{size[0]}", "image_tokens": image_tokens,
                     "ttft_ms": (1e3 * med["bundle_1"], 1e3 * med["eager_1"]),
                     "decode_ms": (1e3 * decode["bundle"], 1e3 * decode["eager"])})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--only", choices=sorted(FAMILIES), action="append")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| family | image (WxH) | image tokens | TTFT bundle / eager (ms) | ratio | decode bundle / eager "
          "(ms/token) | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name in args.only or FAMILIES:
        with tempfile.TemporaryDirectory() as tmp:
            for r in measure(name, args.rounds, args.tokens, Path(tmp)):
                (tb, te), (db, de) = r["ttft_ms"], r["decode_ms"]
                print(f"| {r['family']} | {r['size']} | {r['image_tokens']} | {tb:.1f} / {te:.1f} | {te / tb:.1f}x "
                      f"| {db:.2f} / {de:.2f} | {de / db:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
