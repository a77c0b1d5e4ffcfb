"""max |x| per channel of linears' inputs over calibration prompts, one decoder layer at a time.

SmoothQuant's scales and LLM.int8's outlier channels need only these maxima. One session over the whole INT4 LLM
held the graph's weights, ONNX Runtime's prepacked copy of them and a prompt's activations at once: at
LLaVA-OneVision-0.5B's size, 16 prompts of 2,000-odd tokens took the compile 2.0 GB above what it held, the peak of
the CPU int4 recipe. Cut after each narrowing linear (a down projection), as the calibration images are, the graph
runs as layerwise's stages: a stage holds one layer's weights, and between stages the prompts' residual stream.
The graph reduces each input itself (Abs, Flatten, ReduceMax), so no prompt's wide activations are handed out.
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np
import onnx
from onnx import helper

from mmtrt.quant.calibration_images import narrowing_products
from mmtrt.quant.layerwise import captured


def channel_maxima(model: onnx.ModelProto, inputs: list[str],
                   feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """max |x| per channel of each tensor in `inputs` over every token of `feeds`; `model` is left as it was."""
    nodes, reduced = maxima_nodes(inputs)
    chunks = layer_chunks(model, reduced)
    maxima: dict[str, np.ndarray] = {}
    for runs in captured(model, chunks, feeds, "channel maxima", list(model.graph.node) + nodes):
        for out in runs:
            for name, m in reduced.items():
                if m in out:
                    maxima[name] = np.maximum(maxima[name], out[m]) if name in maxima else out[m]
    return maxima


def layer_chunks(model: onnx.ModelProto, reduced: dict[str, str]) -> list[list[str]]:
    """The reduced names of `reduced` ({input: its reduction}) grouped by the narrowing linears before each
    input's first reader: one chunk per layer (and per GQA's narrower k and v projections where they are apart)."""
    position = {}
    for i, node in enumerate(model.graph.node):
        for name in node.input:
            position.setdefault(name, i)
    produced_at = {out: i for i, node in enumerate(model.graph.node) for out in node.output}
    cuts = sorted(produced_at[name] for name in narrowing_products(model))
    chunks: dict[int, list[str]] = {}
    for name, m in reduced.items():
        chunks.setdefault(bisect_left(cuts, position[name]), []).append(m)
    return [chunks[c] for c in sorted(chunks)]


def maxima_nodes(inputs: list[str]) -> tuple[list[onnx.NodeProto], dict[str, str]]:
    """Abs, Flatten to [rows, channels] and ReduceMax over the rows, per tensor; the nodes and each tensor's
    reduced name."""
    nodes, reduced = [], {}
    for i, name in enumerate(inputs):
        p = f"channel_maxima.{i}"
        rows = helper.make_tensor(f"{p}.axes", onnx.TensorProto.INT64, [1], [0])
        nodes += [helper.make_node("Abs", [name], [f"{p}.abs"]),
                  helper.make_node("Flatten", [f"{p}.abs"], [f"{p}.rows"], axis=-1),
                  helper.make_node("Constant", [], [f"{p}.axes"], value=rows),
                  helper.make_node("ReduceMax", [f"{p}.rows", f"{p}.axes"], [f"{p}.max"], keepdims=0)]
        reduced[name] = f"{p}.max"
    return nodes, reduced
