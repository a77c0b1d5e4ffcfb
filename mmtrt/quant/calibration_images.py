"""The calibration images' vision features, computed as the runtime computes them, one encoder layer at a time.

One session on the whole vision graph holds the tower's weights widened to float32 (1.6 GB for SigLIP so400m) and,
through the LLaVA export's stack of every hidden state (ir/hidden_states.py), all 27 of them for every image at
once: the peak of a bfloat16 LLaVA-OneVision-0.5B awq_int4 compile. Cut after each MLP's down projection (a linear
whose output is narrower than its input), the graph runs as layerwise's stages: one layer's weights at a time,
and between stages the images' residual stream (two tensors of the hidden width per token). The feature layers are
read straight from their layers, so no stage's output is carried to the end.
"""

from __future__ import annotations

import io
from typing import Callable

import numpy as np
import onnx

from mmtrt.ir.graph import ModelIR
from mmtrt.ir.hidden_states import stacked_selects
from mmtrt.ir.rewrite import attr
from mmtrt.preprocess.anyres import NEWLINE_ASSET, build_tiler, pack
from mmtrt.ir.resident import give_back_freed_memory
from mmtrt.quant.layerwise import captured

WEIGHT_PRODUCTS = {"MatMul", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}  # input, [K, N] weight, ...
Prepared = tuple[dict[str, np.ndarray], list, tuple | None]  # feeds, vision inputs kept for calibration, grid


def encoded(ir: ModelIR, images: list) -> list[tuple[list, np.ndarray, tuple | None]]:
    """Each image's (vision inputs: pixel values, an any-resolution image's tiles one by one, a native-resolution
    image's whole feeds; its tokens' features [T, D]; its patch grid where M-RoPE needs it)."""
    prepare, features = _encoder(ir)
    prepared = [prepare(image) for image in images]
    outputs = by_layer(ir.components["vision"].onnx, "vision", [feeds for feeds, _, _ in prepared])
    give_back_freed_memory()
    return [(inputs, features(out, image), grid)
            for image, (_, inputs, grid), out in zip(images, prepared, outputs)]


def by_layer(model, component: str, batches: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The graph's outputs for each batch, its stages cut after every down projection (one stage, the whole
    graph, where it has none), each selected hidden state read from its layer rather than from the stack."""
    outputs = [o.name for o in model.graph.output]
    chunks = [[name] for name in narrowing_products(model)] + [outputs]
    selects = stacked_selects(model.graph)
    nodes = [_reading(node, selects) for node in model.graph.node]
    stages = captured(model, chunks, batches, f"{component} encoder", nodes)
    for _ in chunks[:-1]:
        next(stages)  # each stage's runs are drained when the next one is asked for
    return [{n: out[n] for n in outputs} for out in next(stages)]


def narrowing_products(model: onnx.ModelProto) -> list[str]:
    """The outputs of the graph's weight products narrower than their inputs (each MLP's down projection), in
    graph order, in whatever form earlier passes left them: float MatMul, a MatMul of a dequantized int8 or INT4
    weight, int8_weights' DynamicQuantizeMatMul or MatMulIntegerToFloat, awq_int4's MatMulNBits. (Counting float
    MatMuls alone, a calibrated pass after int8_weights would run the whole tower in one session: 2.8 GB above
    the pass's start at LLaVA-OneVision-0.5B's size.)"""
    dims = {t.name: t.dims for t in model.graph.initializer}
    for node in model.graph.node:  # a dequantized weight: the [K, N] of the int8 or INT4 initializer it reads
        if node.op_type == "DequantizeLinear" and node.input[0] in dims:
            dims[node.output[0]] = dims[node.input[0]]
    narrowing = []
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            k, n = attr(node, "K"), attr(node, "N")
        elif node.op_type in WEIGHT_PRODUCTS and len(dims.get(node.input[1], ())) == 2:
            k, n = dims[node.input[1]]
        else:
            continue
        if n < k:
            narrowing.append(node.output[0])
    return narrowing


def _reading(node: onnx.NodeProto, renamed: dict[str, str]) -> onnx.NodeProto:
    """`node`, or a copy of it reading renamed inputs."""
    if not any(name in renamed for name in node.input):
        return node
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.input[:] = [renamed.get(name, name) for name in node.input]
    return copy


def _encoder(ir: ModelIR) -> tuple[Callable[[object], Prepared], Callable[[dict, object], np.ndarray]]:
    """(image -> its feeds, its kept vision inputs and grid; (the graph's outputs, image) -> its features)."""
    spec, anyres = ir.components["preprocess"].spec, ir.config["vision"].get("anyres")
    if spec.get("family") == "qwen2_vl":
        from mmtrt.runtime.qwen2_vl import preprocess, vision_feeds

        def prepare_native(image) -> Prepared:
            patches = preprocess(image, spec)
            feeds = vision_feeds(patches, ir.config["vision"])
            return feeds, [feeds], patches.grid
        return prepare_native, lambda out, image: out["image_features"][0]
    if anyres is None:
        from mmtrt.preprocess.torchvision_transform import build_transform

        transform = build_transform(spec)

        def prepare(image) -> Prepared:
            p = transform(image)[None].numpy()
            return {"pixel_values": p}, list(p), None

        def flat(out, image):
            features = out["image_features"]
            return features.reshape(-1, features.shape[-1])
        return prepare, flat
    tiler = build_tiler(spec)
    newline = np.load(io.BytesIO(ir.assets[NEWLINE_ASSET])) if anyres["layout"] == "grid" else None

    def prepare_tiles(image) -> Prepared:
        p = tiler(image)
        return {"pixel_values": p}, list(p), None

    def packed(out, image):
        return pack(out["image_features"], out.get("image_token_count"), image.height, image.width, anyres, newline)
    return prepare_tiles, packed
