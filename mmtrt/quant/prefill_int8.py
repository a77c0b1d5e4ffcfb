"""The LLM's prompt graph with int8 GEMMs: each INT4 linear of the decode graph as a per-token int8 product of the
same weights, smoothed.

ONNX Runtime's MatMulNBits runs INT4 weights at about the fp32 GEMM's speed at prompt sizes, while its int8 GEMM
(MatMulInteger on VNNI) takes 0.29x (docs/results/ort-cpu-kernels.md); at one token the INT4 read is what wins. So
a bundle may hold two graphs of one LLM over one KV cache: the decode graph as compiled, and this one for calls of
many tokens. Its weights are the INT4 graph's own, dequantized (MatMulNBits' codes, scales and zero points, plus the
offsets of float zero points), so prompt and decode apply the same weights but for the int8 rounding; each is int8
per output column. Activations are quantized per token at run time. SmoothQuant's per-channel scale
s = max|x|^a / max|w|^(1-a), from calibration inputs, first moves the activations' outlier channels into the weights
(x / s as an explicit Mul, s * W): without it per-token int8 cost zoo:dino-smollm 8 digits points. The one a may be
searched: the a of SEARCH_ALPHAS whose prompt graph's last hidden states on calibration prompts come nearest the
INT4 graph's. (A search per linear, each a nearest its own INT4 product, chose larger a and cost dino-smollm 2 more
digits points than a = 0.5: the linears' errors add up differently than each one alone says.) Where smoothing is
not enough (the down projections' inputs, whose few outlier channels cost dino-smollm 5 to 6 digits points in
int8), a linear's channels of the largest calibration maxima may stay out of the int8 product, in a float32 one
beside it (LLM.int8's decomposition).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mmtrt.ir.graph import drop_dead, node_inputs
from mmtrt.ir.logits import LOGITS_FROM
from mmtrt.ir.rewrite import attr
from mmtrt.ir.proto import copy_fields
from mmtrt.quant.int8_weights import PER_TOKEN_CONSTANTS, per_token_input, per_token_matmul, quantize_columns
from mmtrt.quant.int4 import num_groups
from mmtrt.quant.session import run_with_outputs

SEARCH_ALPHAS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


@dataclass
class Int4Unit:
    """One INT4 linear of the graph: the MatMulNBits node, and the offset MatMul and Add of float zero points."""

    name: str
    input: str
    output: str
    node: onnx.NodeProto
    offsets: str | None  # the [groups, N] offsets initializer
    nodes: list[onnx.NodeProto]  # what the int8 product replaces


def int4_units(model: onnx.ModelProto) -> list[Int4Unit]:
    """Every MatMulNBits of `model`, with its float zero points' offset branch where it has one."""
    graph = model.graph
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    producer = {out: node for node in graph.node for out in node.output}
    units = []
    for node in graph.node:
        if node.op_type != "MatMulNBits":
            continue
        readers = consumers.get(node.output[0], [])
        add = readers[0] if len(readers) == 1 and readers[0].op_type == "Add" else None
        other = add and producer.get(next(i for i in add.input if i != node.output[0]))
        if other is not None and other.op_type == "MatMul" and other.input[0] == _sums(node):
            units.append(Int4Unit(node.name, node.input[0], add.output[0], node, other.input[1], [node, other, add]))
        else:
            units.append(Int4Unit(node.name, node.input[0], node.output[0], node, None, [node]))
    return units


def _sums(node: onnx.NodeProto) -> str:
    return f"{node.input[0]}.group_sums.b{attr(node, 'block_size')}"


def effective_weight(unit: Int4Unit, inits: dict[str, onnx.TensorProto]) -> np.ndarray:
    """The float weight [K, N] the unit applies to its input: (q - zero point) * scale, plus the offsets."""
    node = unit.node
    n, k, block = attr(node, "N"), attr(node, "K"), attr(node, "block_size")
    groups = num_groups(k, block)
    b = numpy_helper.to_array(inits[node.input[1]])
    q = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(n, groups * block).astype(np.float32)
    scales = numpy_helper.to_array(inits[node.input[2]]).astype(np.float32).reshape(n, groups)
    zeros = np.full((n, groups), 8, np.float32)
    if len(node.input) > 3 and node.input[3]:
        zp = numpy_helper.to_array(inits[node.input[3]])
        zeros = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(n, -1)[:, :groups].astype(np.float32)
    w = (q.reshape(n, groups, block) - zeros[..., None]) * scales[..., None]
    if unit.offsets is not None:
        w += numpy_helper.to_array(inits[unit.offsets]).astype(np.float32).T[..., None]
    return np.ascontiguousarray(w.reshape(n, groups * block)[:, :k].T)


def smoothing_scales(x_max: np.ndarray, w: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's s [K] = max|x_k|^alpha / max|w_k,:|^(1 - alpha), 1 where a channel never fired."""
    w_max = np.abs(w).max(axis=1)
    s = np.maximum(x_max, 1e-5) ** alpha / np.maximum(w_max, 1e-5) ** (1 - alpha)
    return np.where((x_max > 0) & (w_max > 0), s, 1).astype(np.float32)


def prefill_graph(model: onnx.ModelProto, select: Callable[[str], bool], x_max: dict[str, np.ndarray] | None,
                  alpha: float | None, float_channels: Callable[[str], int] = lambda name: 0,
                  made: Callable[[onnx.TensorProto], None] = lambda tensor: None) -> tuple[onnx.ModelProto, dict]:
    """A copy of `model` whose selected INT4 units are per-token int8 products (smoothed by `alpha` on the channel
    maxima `x_max` of each unit's input, unless it is None), each with its `float_channels(name)` input channels of
    the largest maxima kept out of the int8 product in a float32 one; and its report. Each int8 weight is handed
    to `made` as it is made (`spill.made`: out of memory until the bundle is written)."""
    out = onnx.ModelProto()  # the weights of the units it replaces are never copied
    copy_fields(model, out, skip="graph")
    copy_fields(model.graph, out.graph, skip="initializer")
    graph = out.graph
    inits = {t.name: t for t in model.graph.initializer}
    chosen = [u for u in int4_units(model) if select(u.name)]
    replaced, new, quantized_inputs, floats, moved = {}, [], {}, {}, 0
    for unit in chosen:
        w = effective_weight(unit, inits)
        keep = outlier_channels(x_max, unit.input, float_channels(unit.name))
        rows = w[keep]
        inverse = np.ones(w.shape[0], np.float32)
        if alpha is not None:
            s = smoothing_scales(x_max[unit.input], w, alpha)
            inverse, w = 1 / s, w * s[:, None]
        inverse[keep], w[keep] = 0, 0
        x = unit.input if alpha is None and not keep.size else _scaled_input(unit, inverse, new, replaced)
        if keep.size:
            floats[unit.name] = keep
        first = x not in quantized_inputs
        nodes, codes, x_scale = quantized_inputs.setdefault(x, per_token_input(x))
        q, scales = quantize_columns(w)
        weight, lent = _made_weight(q, f"{unit.name}.prefill_int8", made)
        new += [weight, numpy_helper.from_array(scales, f"{unit.name}.prefill_scale")]
        moved += lent
        del q, w
        target = replace(unit, output=f"{unit.name}.int8_part") if keep.size else unit
        matmul = per_token_matmul(target, f"{unit.name}.prefill_int8", f"{unit.name}.prefill_scale", codes, x_scale)
        if keep.size:
            matmul += _float_part(unit, keep, rows, target.output, new)
        replaced.setdefault(id(unit.node), []).extend((nodes if first else []) + matmul)
        for gone in unit.nodes[1:]:
            replaced[id(gone)] = []
    rebuilt = [n for node in model.graph.node for n in replaced.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(rebuilt)
    drop_dead(graph)  # the group sums that only offsets read
    read = {name for node in graph.node for name in node_inputs(node)}
    graph.initializer.extend(t for t in model.graph.initializer if t.name in read)
    report = {"linears": [u.name for u in chosen], "smoothing": alpha,
              "float_channels": {name: len(keep) for name, keep in floats.items()},
              "added_bytes": int(sum(t.ByteSize() for t in new)) + moved}
    new += [numpy_helper.from_array(v, k) for k, v in PER_TOKEN_CONSTANTS.items() if k not in inits]
    new.reverse()
    while new:  # each copied into the graph and dropped, never all of them twice
        graph.initializer.add().CopyFrom(new.pop())
    return out, report


def _made_weight(array: np.ndarray, name: str, made: Callable[[onnx.TensorProto], None]
                 ) -> tuple[onnx.TensorProto, int]:
    """`array` as an initializer handed to `made`, and the bytes it moved out of memory. A moved tensor comes back
    as a fresh message: protobuf's upb runtime keeps a cleared field's bytes in the message's arena until the
    message is gone, and the graph's tensors wait in a list until the whole graph is made."""
    tensor = numpy_helper.from_array(array, name)
    size = tensor.ByteSize()
    made(tensor)
    if tensor.ByteSize() == size:
        return tensor, 0
    fresh = onnx.TensorProto()
    fresh.CopyFrom(tensor)
    return fresh, size - fresh.ByteSize()


def outlier_channels(x_max: dict[str, np.ndarray] | None, x: str, count: int) -> np.ndarray:
    """The `count` channels of `x` with the largest calibration maxima, in order (LLM.int8's outlier features: a
    few channels of a linear's input, in every layer, far above the rest; in a row's int8 step they would round
    the other channels to a few codes)."""
    if not count:
        return np.zeros(0, np.int64)
    return np.sort(np.argsort(-x_max[x], kind="stable")[:count]).astype(np.int64)


def _float_part(unit: Int4Unit, keep: np.ndarray, rows: np.ndarray, int8_part: str, new: list) -> list:
    """The kept channels' float32 product, added to the int8 product's output."""
    p = f"{unit.name}.float_channels"
    new += [numpy_helper.from_array(keep, f"{p}.index"), numpy_helper.from_array(rows.astype(np.float32), f"{p}.weight")]
    return [helper.make_node("Gather", [unit.input, f"{p}.index"], [f"{p}.x"], name=f"{p}.gather", axis=-1),
            helper.make_node("MatMul", [f"{p}.x", f"{p}.weight"], [f"{p}.y"], name=p),
            helper.make_node("Add", [int8_part, f"{p}.y"], [unit.output], name=f"{p}.add")]


def _scaled_input(unit: Int4Unit, inverse: np.ndarray, new: list, replaced: dict) -> str:
    """x * inverse, per unit (units reading one tensor have their own smoothing scales and kept channels)."""
    name = f"{unit.name}.smoothed"
    new.append(numpy_helper.from_array(inverse.astype(np.float32), f"{name}.inverse_scale"))
    replaced.setdefault(id(unit.node), []).append(
        helper.make_node("Mul", [unit.input, f"{name}.inverse_scale"], [name], name=name))
    return name


def searched_alpha(model: onnx.ModelProto, select: Callable[[str], bool], x_max: dict[str, np.ndarray],
                   feeds: list[dict[str, np.ndarray]], float_channels: Callable[[str], int] = lambda name: 0
                   ) -> tuple[float, dict[float, float]]:
    """The a of SEARCH_ALPHAS whose prompt graph's last hidden states (every position's, the lm_head's input before
    `logits_from` slices it) on `feeds` are nearest the INT4 graph's in squared error; and each a's error."""
    hidden = next(node.input[0] for node in model.graph.node if LOGITS_FROM in node.input)
    want = [out[hidden] for out in run_with_outputs(model, [hidden], feeds)]
    errors = {}
    for alpha in SEARCH_ALPHAS:
        graph, _ = prefill_graph(model, select, x_max, alpha, float_channels)
        got = run_with_outputs(graph, [hidden], feeds)
        errors[alpha] = float(sum(np.square(out[hidden] - w).sum(dtype=np.float64) for out, w in zip(got, want)))
    return min(errors, key=errors.get), errors
