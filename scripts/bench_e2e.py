"""PyTorch eager (transformers) against the compiled bundle, stage by stage, measured side by side in one run.

Each stage alternates eager and bundle (A B A B ...) and reports medians, so machine noise hits both alike.
Both use the same thread count with spinning off (OMP_WAIT_POLICY=PASSIVE; ONNX Runtime allow_spinning=0).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
from PIL import Image  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from mmtrt.compiler import compile_recipe  # noqa: E402
from mmtrt.runtime import load  # noqa: E402
from mmtrt.zoo.tiny_llava import build_tiny_llava  # noqa: E402
from benchlib import side_by_side  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "tiny-llava": {},
    "larger (CLIP 224/14 x6, LLaMA 576x12)": dict(
        image_size=224, patch_size=14, vision_hidden=384, vision_layers=6,
        hidden=576, layers=12, heads=9, kv_heads=3),
}
PROMPT = "Describe the picture in one sentence."


class Eager:
    """The same stages in transformers: processor, tower + projector, LLM prefill, one decode step."""

    def __init__(self, model, processor, image, prompt):
        self.model, self.processor, self.image = model, processor, image
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
        self.inputs = processor(images=image, text=text, return_tensors="pt")
        with torch.no_grad():
            self.embeds = model.get_input_embeddings()(self.inputs["input_ids"])
            features = model.model.get_image_features(self.inputs["pixel_values"]).pooler_output[0]
            self.embeds[self.inputs["input_ids"] == model.config.image_token_id] = features
            self.cache = self.prefill()

    def preprocess(self):
        self.processor.image_processor(images=self.image, return_tensors="pt")

    @torch.no_grad()
    def vision(self):
        self.model.model.get_image_features(self.inputs["pixel_values"])

    @torch.no_grad()
    def prefill(self):
        cache = DynamicCache(config=self.model.config.text_config)
        self.model(inputs_embeds=self.embeds, cache=cache, use_cache=True)
        return cache

    @torch.no_grad()
    def decode_step(self):
        cache = DynamicCache(config=self.model.config.text_config)
        for i, layer in enumerate(self.cache.layers):
            cache.update(layer.keys, layer.values, i)
        token = self.model.get_input_embeddings()(torch.tensor([[42]]))
        self.model(inputs_embeds=token, cache=cache, use_cache=True)


class Bundle:
    def __init__(self, path, image, prompt, threads):
        self.pipe = load(path, threads=threads, spin=False)
        self.image = image
        self.ids = np.array([self.pipe.prompt_ids(prompt)], np.int64)
        self.pixels = self.pipe.pixel_values(image)
        self.embeds = self.pipe.embed(self.ids, self.pipe.image_features(self.pixels))
        _, self.cache = self.pipe.step(self.embeds, self.pipe.empty_cache())

    def preprocess(self):
        self.pipe.pixel_values(self.image)

    def vision(self):
        self.pipe.image_features(self.pixels)

    def prefill(self):
        self.pipe.step(self.embeds, self.pipe.empty_cache())

    def decode_step(self):
        self.pipe.step(self.pipe.embed(np.array([[42]], np.int64)), self.cache)


def compile_config(name, sizes, folder: Path) -> tuple[Path, object, object]:
    model, processor = build_tiny_llava(**sizes)
    ckpt = folder / "checkpoint"
    model.save_pretrained(ckpt)
    processor.save_pretrained(ckpt)
    recipe = folder / "recipe.yaml"
    recipe.write_text("model: {source: hf, path: checkpoint}\npasses:\n  - dead_layer_elimination: {}\n  - graph_cleanup: {}\n")
    return compile_recipe(recipe, folder / "bundle"), model, processor


def bench(name, sizes, threads, repeats, folder):
    bundle_path, model, processor = compile_config(name, sizes, folder)
    image = Image.open(ROOT / "examples" / "sample.png")
    eager, bundle = Eager(model, processor, image, PROMPT), Bundle(bundle_path, image, PROMPT, threads)
    times = side_by_side(eager, bundle, ("preprocess", "vision", "prefill", "decode_step"), repeats)
    return [(name, stage, ea, bb, ea / bb) for stage, (ea, bb) in times.items()], int(bundle.ids.shape[1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    print(f"threads={args.threads} (torch and ONNX Runtime), spinning off, medians of {args.repeats} alternating rounds")
    print(f"{'model':<40} {'stage':<18} {'eager ms':>10} {'bundle ms':>10} {'speed-up':>9}")
    for name, sizes in CONFIGS.items():
        with tempfile.TemporaryDirectory() as tmp:
            rows, seq = bench(name, sizes, args.threads, args.repeats, Path(tmp))
        for model, stage, ea, bb, ratio in rows:
            label = f"{stage} ({seq} tok)" if stage == "prefill" else stage
            print(f"{model:<40} {label:<18} {ea:>10.2f} {bb:>10.2f} {ratio:>8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
