"""Polygraphy runners for one partition: of a bundle (ONNX Runtime, a TensorRT engine where this host has a
matching one, or the bundle's chain of segments) or of the PyTorch source the bundle was compiled from.

The source model is held in its checkpoint's dtype, as the compiler holds it, and a partition's modules are
widened to float32 only while its runner is active, each decoder or encoder layer only while it runs (exactly:
every bfloat16 or float16 is a float32): a 7B reference holds one layer in float32 beside its bfloat16 model."""

from __future__ import annotations

import time
from collections import OrderedDict
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from mmtrt.compare import kv_layouts, qwen2_vl
from mmtrt.compare.inputs import NUMPY
from mmtrt.ir.source_float32 import LayerWidening
from mmtrt.ir.logits import LOGITS_FROM
from mmtrt.runtime.executors import component_runner


class FunctionRunner(BaseRunner):
    """A Polygraphy runner around anything with `run(feeds) -> outputs`. Polygraphy's own PytRunner moves every
    input to CUDA (polygraphy/backend/pyt/runner.py), so the PyTorch source runs through this one on the CPU."""

    def __init__(self, make: Callable[[], Any], inputs: list[dict[str, Any]], name: str):
        super().__init__(name=name)
        self._make = make
        self._inputs = inputs

    def activate_impl(self):
        self.impl = self._make()

    def get_input_metadata_impl(self):
        meta = TensorMetadata()
        for spec in self._inputs:
            meta.add(spec["name"], dtype=np.dtype(NUMPY[spec["dtype"]]),
                     shape=[d if isinstance(d, int) else None for d in spec["shape"]])
        return meta

    def infer_impl(self, feed_dict):
        start = time.perf_counter()
        outputs = self.impl.run(dict(feed_dict))
        self.inference_time = time.perf_counter() - start
        return OrderedDict(outputs)

    def deactivate_impl(self):
        del self.impl


def bundle_runner(bundle: Path, manifest: dict[str, Any], component: str, choices: dict, name: str) -> tuple[BaseRunner, str]:
    """Polygraphy's own runner where one fits (OnnxrtRunner, TrtRunner), else the runtime's chain of segments;
    and a description of what runs."""
    from polygraphy.backend.onnxrt import OnnxrtRunner

    segments = (manifest.get("placement") or {}).get(component, {}).get("segments", [])
    engines = {s["id"]: choices[s["id"]][0] for s in segments if choices.get(s["id"], (None,))[0] is not None}
    if not engines:
        path = bundle / manifest["components"][component]["artifact"]
        return OnnxrtRunner(partial(_session, path), name=name), "onnxruntime"
    if len(segments) == 1:
        from mmtrt.backends.tensorrt.runner import trt_runner
        from mmtrt.runtime.executors import engine_flavor

        engine = next(iter(engines.values()))
        profiles = next(e["profiles"] for e in manifest["tensorrt"]["segments"] if e["id"] == segments[0]["id"])
        return trt_runner(engine, profiles, name, engine_flavor(engine)), f"{engine_flavor(engine)} ({engine.name})"
    backends = "+".join(sorted({"tensorrt" if s["id"] in engines else "onnxruntime" for s in segments}))
    chain = partial(component_runner, bundle, manifest, component, choices, None, True)
    return FunctionRunner(chain, manifest["components"][component]["inputs"], name), f"segments ({backends})"


class CacheRowsRunner(BaseRunner):
    """A bundle's LLM on a kv_layout cache, its presents cut to the sequence's rows after each call."""

    def __init__(self, inner: BaseRunner, manifest: dict[str, Any]):
        super().__init__(name=inner.name)
        self._inner = inner
        self._manifest = manifest

    def activate_impl(self):
        self._inner.activate()

    def get_input_metadata_impl(self):
        return self._inner.get_input_metadata(use_numpy_dtypes=False)

    def infer_impl(self, feed_dict):
        outputs = self._inner.infer(feed_dict)
        self.inference_time = self._inner.last_inference_time()
        return kv_layouts.valid_presents(self._manifest, feed_dict, outputs)

    def deactivate_impl(self):
        self._inner.deactivate()


def _session(path: Path):
    """The session the runtime would open (mmtrt's OrtRunner), without spinning threads: Polygraphy's
    SessionFromOnnx takes no session options, and a spinning pool starves the other runner on a small host."""
    from mmtrt.backends.onnxruntime_backend import OrtRunner

    return OrtRunner(path, spin=False).session


class TorchPartition:
    """One partition of the PyTorch source, wrapped exactly as the exporter wrapped it (the wrappers call
    transformers' modules; the LLM's builds transformers' DynamicCache from the past inputs)."""

    def __init__(self, module, inputs: list[str], outputs: list[str], cache: dict[str, Any] | None = None):
        self.module = module.eval()
        self.inputs = inputs
        self.outputs = outputs
        self.cache = cache  # a kv_layout bundle's manifest: its feeds are read as the hf layout's

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        if self.cache is not None:
            feeds = kv_layouts.hf_feed(self.cache, feeds)
        args = [torch.from_numpy(np.ascontiguousarray(feeds[name])) for name in self.inputs]
        past = [a for name, a in zip(self.inputs, args) if name.startswith("past.")]
        args = [a for name, a in zip(self.inputs, args) if not name.startswith("past.")] + ([past] if past else [])
        with torch.no_grad():
            result = self.module(*args)
        result = result if isinstance(result, tuple) else (result,)
        return {name: t.numpy() for name, t in zip(self.outputs, result)}


class TorchRunner(FunctionRunner):
    """A partition of the source model in float32 while active, a layer at a time (ir/source_float32.py)."""

    def __init__(self, make: Callable[[], Any], modules: list, inputs: list[dict[str, Any]], name: str):
        super().__init__(make, inputs, name)
        self._widening = LayerWidening(modules)

    def activate_impl(self):
        self._widening.widen()
        super().activate_impl()

    def deactivate_impl(self):
        super().deactivate_impl()
        self._widening.narrow()


TORCH = "pytorch (cpu, fp32)"
TORCH_FAMILIES = ("llava", "llava_next", "llava_onevision", *qwen2_vl.QWEN_FAMILIES)


def torch_runner(model, manifest: dict[str, Any], component: str, name: str) -> tuple[BaseRunner, str]:
    """A Qwen2-VL tower runs as transformers' own forward on the feeds' grid (the exporter's wrapper
    re-implements it); every other partition as the exporter wrapped it."""
    from mmtrt.ir import export

    vision = manifest["model"]["vision"]
    spec = manifest["components"][component]
    lm = model.model.language_model
    qwen = manifest["model"]["architecture"] in qwen2_vl.QWEN_FAMILIES
    modules = {"vision": [model.model.visual] if qwen else export.vision_modules(model), "embed": [lm.embed_tokens],
               "llm": [lm, model.lm_head]}[component]
    if component == "vision" and qwen:
        return TorchRunner(partial(qwen2_vl.VisionReference, model, vision), modules, spec["inputs"], name), TORCH

    def make() -> TorchPartition:
        module = {
            "vision": lambda: export.VisionWithProjector(model, vision["feature_layer"], vision["select_strategy"]),
            "embed": lambda: export.TokenEmbedding(model),
            "llm": lambda: export.DecoderWithCache(model),
        }[component]()
        # the exporter's wrapper returns every position's logits, which is what compare's logits_from of 0 asks for
        inputs = [s["name"] for s in spec["inputs"] if s["name"] != LOGITS_FROM]
        outputs = [s["name"] for s in spec["outputs"]]
        if not kv_layouts.rewritten(manifest, component):
            return TorchPartition(module, inputs, outputs)
        past = [name for name in inputs if name.startswith("past.")]
        return TorchPartition(module, ["inputs_embeds", "attention_mask", "position_ids", *past], outputs, manifest)

    return TorchRunner(make, modules, spec["inputs"], name), TORCH
