"""Per model family, on its tiny random checkpoint: the compiled bundle's time to first token and decode step
against PyTorch eager (transformers), at two image sizes, with the image tokens each size takes.

Measured side by side in one run: each quantity alternates eager and bundle (A B A B ...) and reports medians, so
machine noise hits both alike; both use the same thread count with spinning off (OMP_WAIT_POLICY=PASSIVE, ONNX
Runtime allow_spinning=0). Time to first token is the whole request (preprocessing, vision, prefill, one token);
a decode step is one token through the LLM with the cache of that request's prompt.

FAMILIES is a list of entries: another family is one more `Family(...)` line.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import side_by_side  # noqa: E402
from mmtrt.compiler import compile_recipe  # noqa: E402
from mmtrt.runtime import load  # noqa: E402
from mmtrt.zoo.tiny_anyres import build_tiny_llava_next, build_tiny_llava_onevision  # noqa: E402
from mmtrt.zoo.tiny_llava import build_tiny_llava  # noqa: E402
from mmtrt.zoo.tiny_qwen2_vl import build_tiny_qwen2_vl  # noqa: E402

PROMPT = "Describe the picture in one sentence."


@dataclass
class Family:
    name: str  # the table's row label
    build: Callable[[], tuple]  # () -> (transformers model, processor), fixed seed
    sizes: tuple[tuple[int, int], tuple[int, int]]  # two image sizes, (height, width)
    passes: str = "  - dead_layer_elimination: {}\n"  # the recipe's passes (YAML list items; empty: the defaults)


FAMILIES = [
    Family("llava (tiny-llava)", build_tiny_llava, ((24, 24), (480, 640))),
    Family("llava_next", build_tiny_llava_next, ((24, 24), (480, 640))),
    Family("llava_onevision", build_tiny_llava_onevision, ((24, 24), (480, 640))),
    Family("qwen2_vl", lambda: build_tiny_qwen2_vl("qwen2_vl"), ((24, 24), (480, 640)), passes=""),
    Family("qwen2_5_vl", lambda: build_tiny_qwen2_vl("qwen2_5_vl"), ((24, 24), (480, 640)), passes=""),
]


def image(height: int, width: int):
    from PIL import Image

    rng = np.random.default_rng(height * 10007 + width)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / width, y / height, (x + y) / (width + height)], -1) * 200
    return Image.fromarray(np.clip(base + rng.normal(0, 25, (height, width, 3)), 0, 255).astype(np.uint8))


class Eager:
    """transformers: the processor and generate for the first token; one decode step on the prompt's cache."""

    def __init__(self, model, processor, picture):
        self.model, self.processor, self.picture = model, processor, picture
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}]
        self.text = processor.apply_chat_template(messages, add_generation_prompt=True)
        inputs = processor(images=picture, text=self.text, return_tensors="pt")
        self.image_tokens = int((inputs["input_ids"] == model.config.image_token_id).sum())
        with torch.no_grad():
            self.cache = DynamicCache(config=model.config.text_config)
            model(**inputs, cache=self.cache, use_cache=True)

    @torch.no_grad()
    def first_token(self):
        inputs = self.processor(images=self.picture, text=self.text, return_tensors="pt")
        self.model.generate(**inputs, max_new_tokens=1, do_sample=False)

    @torch.no_grad()
    def decode_step(self):
        cache = DynamicCache(config=self.model.config.text_config)
        for i, layer in enumerate(self.cache.layers):
            cache.update(layer.keys, layer.values, i)
        self.model(inputs_embeds=self.model.get_input_embeddings()(torch.tensor([[42]])), cache=cache, use_cache=True)


class Bundle:
    def __init__(self, path: Path, picture, threads: int):
        self.pipe, self.picture = load(path, threads=threads, spin=False), picture
        ids, features = self.pipe.encode_image(picture, self.pipe.prompt_ids(PROMPT))
        self.image_tokens = ids.count(self.pipe.model["image_token_id"])
        family = self.pipe.family  # M-RoPE: the prompt's three rows of positions and its rope delta
        positions, self.delta = family.positions(ids, [self.pipe.pixel_values(picture)]) if family else (None, 0)
        _, self.cache = self.pipe.step(self.pipe.embed(np.array([ids], np.int64), features), self.pipe.empty_cache(),
                                       positions)

    def first_token(self):
        self.pipe.generate(self.picture, PROMPT, max_new_tokens=1)

    def decode_step(self):
        self.pipe.step(self.pipe.embed(np.array([[42]], np.int64)), self.cache, delta=self.delta)


def compile_family(family: Family, folder: Path):
    model, processor = family.build()
    model.save_pretrained(folder / "checkpoint")
    processor.save_pretrained(folder / "checkpoint")
    passes = f"passes:\n{family.passes}" if family.passes else ""
    (folder / "recipe.yaml").write_text(f"model: {{source: hf, path: checkpoint}}\n{passes}")
    return compile_recipe(folder / "recipe.yaml", folder / "bundle"), model, processor


def bench(family: Family, threads: int, rounds: int) -> list[tuple]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        bundle, model, processor = compile_family(family, Path(tmp))
        for height, width in family.sizes:
            picture = image(height, width)
            eager, ours = Eager(model, processor, picture), Bundle(bundle, picture, threads)
            assert eager.image_tokens == ours.image_tokens, (family.name, eager.image_tokens, ours.image_tokens)
            times = side_by_side(eager, ours, ("first_token", "decode_step"), rounds)
            rows.append((family.name, f"{width}x{height}", ours.image_tokens, *times["first_token"],
                         *times["decode_step"]))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--family", action="append", help="only these families (row labels); default: all")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    chosen = [f for f in FAMILIES if not args.family or f.name in args.family]
    print(f"threads={args.threads} (torch and ONNX Runtime), spinning off, medians of {args.rounds} alternating "
          "rounds (each the median of 3 calls)\n")
    print("| family | image (WxH) | image tokens | first token, eager ms | first token, bundle ms | speed-up "
          "| decode step, eager ms | decode step, bundle ms | speed-up |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for family in chosen:
        for name, size, tokens, ttft_e, ttft_b, dec_e, dec_b in bench(family, args.threads, args.rounds):
            print(f"| {name} | {size} | {tokens} | {ttft_e:.2f} | {ttft_b:.2f} | {ttft_e / ttft_b:.2f}x "
                  f"| {dec_e:.2f} | {dec_b:.2f} | {dec_e / dec_b:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
