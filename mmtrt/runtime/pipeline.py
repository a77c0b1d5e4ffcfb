"""The Python runtime: load a bundle, run each partition on its backend, decode greedily with the KV cache."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from mmtrt.backends.torchvision_backend import build_transform
from mmtrt.bundle.manifest import bundle_hash, read_manifest
from mmtrt.bundle.verify import verify_bundle
from mmtrt.errors import UserError
from mmtrt.ir.graph import TensorSpec
from mmtrt.partition.shapes import check_shape
from mmtrt.runtime.executors import component_runner, engine_choices
from mmtrt.runtime.image_bounds import check_image
from mmtrt.runtime.prompt import format_prompt, tokenize

log = logging.getLogger("mmtrt.runtime")


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    timings: dict[str, float]
    backends: dict[str, str] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": self.token_ids, "prompt_tokens": self.prompt_tokens,
                "timings": self.timings, "backends": self.backends, "fallbacks": self.fallbacks}


def open_image(image) -> Image.Image:
    if isinstance(image, Image.Image):
        return image
    try:
        with Image.open(image) as img:
            img.load()
            return img
    except (FileNotFoundError, IsADirectoryError):
        raise UserError(f"image {image} does not exist; pass the path of a PNG or JPEG file") from None
    except Image.DecompressionBombError as exc:
        raise UserError(f"image {image} is refused as a decompression bomb ({exc}); pass a smaller image") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise UserError(f"cannot read image {image} ({exc}); pass a PNG or JPEG file") from None


class Pipeline:
    """A loaded bundle. `generate` takes one image and one prompt."""

    def __init__(self, path: str | Path, threads: int | None = None, spin: bool = True):
        from transformers import AutoTokenizer

        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        verify_bundle(self.path, self.manifest)
        self.hash = bundle_hash(self.path)
        self.model = self.manifest["model"]
        self.dims = self.manifest["dims"]
        self.image_side = self.manifest["components"]["preprocess"]["outputs"][0]["shape"][-1]
        self.specs = {name: [TensorSpec.from_json(s) for s in comp["inputs"]]
                      for name, comp in self.manifest["components"].items()}
        self.preprocess_spec = read_json(self.path / self.manifest["components"]["preprocess"]["artifact"])
        self.transform = build_transform(self.preprocess_spec)
        choices = engine_choices(self.path, self.manifest)
        self.fallbacks = {seg: why for seg, (engine, why) in choices.items() if engine is None}
        _log_fallbacks(self.fallbacks)
        self.runners = {name: component_runner(self.path, self.manifest, name, choices, threads, spin)
                        for name in ("vision", "embed", "llm")}
        self.tokenizer = AutoTokenizer.from_pretrained(self.path / "tokenizer")
        self.backends = {name: "+".join(r.providers) for name, r in self.runners.items()}
        self.backends["preprocess"] = "torchvision"

    def _run(self, name: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for spec in self.specs[name]:
            check_shape(name, spec, feeds[spec.name].shape, self.dims)
        return self.runners[name].run(feeds)

    def prompt_ids(self, prompt: str, raw_prompt: bool = False) -> list[int]:
        text = format_prompt(self.tokenizer, self.model["chat_template"], prompt, raw_prompt)
        ids = tokenize(self.tokenizer, text, self.model["image_token"], self.model["vision"]["image_tokens"])
        limit = self.dims["seq"]["max"]
        if len(ids) > limit:
            text_tokens = len(ids) - self.model["vision"]["image_tokens"]
            raise UserError(f"the prompt is {text_tokens} tokens after the chat template; this bundle accepts at most "
                            f"{limit - self.model['vision']['image_tokens']}; shorten it or recompile with a larger "
                            "envelope.prompt_tokens.max")
        return ids

    def pixel_values(self, image) -> np.ndarray:
        img = open_image(image)
        check_image(img, self.manifest["envelope"]["image"], self.preprocess_spec)
        return self.transform(img)[None].numpy()

    def image_features(self, pixels: np.ndarray) -> np.ndarray:
        return self._run("vision", {"pixel_values": pixels})["image_features"]

    def embed(self, ids: np.ndarray, features: np.ndarray | None = None) -> np.ndarray:
        embeds = self._run("embed", {"input_ids": ids})["inputs_embeds"]
        if features is not None:
            embeds[ids == self.model["image_token_id"]] = features.reshape(-1, features.shape[-1])
        return embeds

    def empty_cache(self, batch: int = 1) -> dict[str, np.ndarray]:
        llm = self.model["llm"]
        shape = (batch, llm["num_kv_heads"], 0, llm["head_dim"])
        return {s.name: np.zeros(shape, np.float32) for s in self.specs["llm"] if s.name.startswith("past.")}

    def step(self, embeds: np.ndarray, cache: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One LLM call from position `past`: returns logits and the grown cache."""
        past = next(iter(cache.values())).shape[2]
        batch, seq = embeds.shape[:2]
        feeds = {
            "inputs_embeds": embeds,
            "attention_mask": np.ones((batch, past + seq), np.int64),
            "position_ids": np.tile(np.arange(past, past + seq, dtype=np.int64), (batch, 1)),
            **cache,
        }
        out = self._run("llm", feeds)
        return out["logits"], {k.replace("present.", "past."): v for k, v in out.items() if k.startswith("present.")}

    def generate(self, image, prompt: str, max_new_tokens: int | None = None, raw_prompt: bool = False) -> Generation:
        limit = self.manifest["envelope"]["max_new_tokens"]
        max_new_tokens = limit if max_new_tokens is None else max_new_tokens
        if not 1 <= max_new_tokens <= limit:
            raise UserError(f"max_new_tokens {max_new_tokens} is outside 1..{limit}, the bundle's KV capacity; "
                            "recompile with a larger envelope.max_new_tokens")
        ids = self.prompt_ids(prompt, raw_prompt)
        t0 = time.perf_counter()
        pixels = self.pixel_values(image)
        t1 = time.perf_counter()
        features = self.image_features(pixels)
        t2 = time.perf_counter()
        logits, cache = self.step(self.embed(np.array([ids], np.int64), features), self.empty_cache())
        t3 = time.perf_counter()
        generated = self._decode(logits, cache, max_new_tokens)
        t4 = time.perf_counter()
        steps = max(len(generated) - 1, 1)
        timings = {"preprocess_ms": 1e3 * (t1 - t0), "vision_ms": 1e3 * (t2 - t1), "prefill_ms": 1e3 * (t3 - t2),
                   "decode_ms_per_token": 1e3 * (t4 - t3) / steps}
        text = self.tokenizer.decode(generated, skip_special_tokens=True)
        return Generation(text, generated, len(ids), {k: round(v, 3) for k, v in timings.items()}, dict(self.backends),
                          dict(self.fallbacks))

    def _decode(self, logits: np.ndarray, cache: dict[str, np.ndarray], max_new_tokens: int) -> list[int]:
        eos = set(self.model["eos_token_ids"])
        generated = []
        while True:
            token = int(np.argmax(logits[0, -1]))
            generated.append(token)
            if token in eos or len(generated) == max_new_tokens:
                return generated
            logits, cache = self.step(self.embed(np.array([[token]], np.int64)), cache)


def _log_fallbacks(fallbacks: dict[str, str]) -> None:
    """Once per load and reason. A host without TensorRT is expected (info); a TensorRT host without a matching
    engine is worth a warning, since `mmtrt build-engines` fixes it."""
    by_reason: dict[str, list[str]] = {}
    for segment, why in fallbacks.items():
        by_reason.setdefault(why, []).append(segment)
    for why, segments in by_reason.items():
        level = logging.INFO if why.startswith("tensorrt is not importable") else logging.WARNING
        log.log(level, "TensorRT segments %s run on ONNX Runtime: %s", ", ".join(segments), why)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def load(path: str | Path, threads: int | None = None, spin: bool = True) -> Pipeline:
    """Load a bundle written by `mmtrt compile`."""
    return Pipeline(path, threads, spin)
