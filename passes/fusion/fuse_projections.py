"""fuse_projections: linears that read the same tensor (q/k/v, gate/up) run as one wider linear and a Split.

A decoder layer projects its normed input three times for attention and twice for the MLP. At decode time each
projection is a small matrix-vector product, so every extra node costs a kernel dispatch, an activation
quantization (MatMulNBits at accuracy level 4 quantizes its input to int8 per call) and a read of the same input:
onnxruntime-genai's builder writes one packed QKV MatMulNBits for that reason. Here the packed weights, scales
and zero points of `com.microsoft.MatMulNBits` nodes with the same input and the same K, bits, block size and
accuracy level are concatenated along N (each row of N is quantized on its own, so nothing is rounded again), and
float MatMuls with constant [K, N] weights are concatenated along N the same way (weights still in the source model
are joined by reference and widened when the bundle is written); a Split on the last axis gives each consumer its
original tensor.

Where the parts are added to something part by part, the Add moves before the Split (`add_before_split`): to
another fused linear's parts (awq_int4's float zero points: each MatMulNBits' output plus its offsets' MatMul), or
to a constant bias per part (Qwen2's q/k/v). One Add in place of one per part, the same numbers, and a Split that
`pack_qkv_rotary` can then find in front of the rotaries.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mmtrt.ir import source_weights
from mmtrt.ir.graph import ModelIR
from mmtrt.ir.rewrite import attr, cleanup
from mmtrt.pipeline.pass_base import Pass
from passes.fusion.fuse_projections_config import FuseProjectionsConfig

NBITS_ATTRS = ("K", "bits", "block_size", "accuracy_level")


class FuseProjections(Pass):
    name = "fuse_projections"
    Config = FuseProjectionsConfig
    components = ("vision", "llm")
    reads_source_weights = True  # a float weight's parts are joined by reference (source_weights.joined)

    def run(self, ir: ModelIR) -> dict:
        changes = {}
        for name in self.config.components:
            comp = ir.components[name]
            fused = fuse_shared_input_linears(comp.onnx.graph, set(self.config.ops))
            joined = add_before_split(comp.onnx.graph)
            comp.set_graph(cleanup(comp.onnx))
            changes[name] = {"groups_fused": len(fused), "linears_fused": sum(len(g) for g in fused),
                             "sums_before_split": joined, "groups": [[n.name for n in g] for g in fused[:4]]}
        return changes


def fuse_shared_input_linears(graph: onnx.GraphProto, ops: set[str]) -> list[list[onnx.NodeProto]]:
    """Replace each group of compatible linears on one input by a fused linear and a Split; returns the groups."""
    inits = {t.name: t for t in graph.initializer}
    groups: dict[tuple, list[onnx.NodeProto]] = {}
    for node in graph.node:
        key = _signature(node, inits, ops)
        if key is not None:
            groups.setdefault(key, []).append(node)
    fused = [g for g in groups.values() if len(g) > 1]
    for group in fused:
        _fuse(graph, group, inits)
    return fused


def add_before_split(graph: onnx.GraphProto) -> int:
    """Adds part by part after a Split on the last axis move before it: Split(a) + Split(b) (same sizes) is
    Split(a + b), and Split(a) + a constant vector per part (a bias) is Split(a + the vectors joined). Only where
    each part is read by its Add alone. Returns how many Splits took their Adds."""
    joined = 0
    while _join_one(graph):
        joined += 1
    return joined


def _join_one(graph: onnx.GraphProto) -> bool:
    made = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    for out in graph.output:
        readers.setdefault(out.name, []).append(out)
    inits = {t.name: t for t in graph.initializer}
    for split in graph.node:
        sizes = _sizes(split, inits)
        adds = [r[0] if len(r := readers.get(o, [])) == 1 else None for o in split.output]
        if sizes is None or not all(isinstance(a, onnx.NodeProto) and a.op_type == "Add" for a in adds):
            continue
        others = [a.input[1] if a.input[0] == part else a.input[0] for a, part in zip(adds, split.output)]
        other = _joined_other(others, sizes, made, readers, inits, graph)
        if other is not None:
            _join(graph, split, other, adds, made.get(others[0]))
            return True
    return False


def _sizes(split: onnx.NodeProto, inits: dict) -> list[int] | None:
    if split.op_type != "Split" or len(split.input) != 2 or split.input[1] not in inits or attr(split, "axis", 0) != -1:
        return None
    return numpy_helper.to_array(inits[split.input[1]]).tolist()


def _joined_other(others: list[str], sizes: list[int], made: dict, readers: dict, inits: dict,
                  graph: onnx.GraphProto) -> str | None:
    """What the whole input is added to: the input of another Split whose parts, in order, are `others` (each
    read once), or the constant vectors `others` joined into one initializer."""
    twin = made.get(others[0])
    if (twin is not None and _sizes(twin, inits) == sizes and list(twin.output) == others
            and all(len(readers[o]) == 1 for o in others)):
        return twin.input[0]
    vectors = [source_weights.array(inits[o]) if o in inits else None for o in others]
    if all(v is not None and v.shape == (n,) for v, n in zip(vectors, sizes)):
        joined = numpy_helper.from_array(np.concatenate(vectors), "+".join(others))
        graph.initializer.append(joined)
        return joined.name
    return None


def _join(graph: onnx.GraphProto, split: onnx.NodeProto, other: str, adds: list[onnx.NodeProto],
          twin: onnx.NodeProto | None) -> None:
    """`twin`: the other Split, when `other` is its input (None for a bias)."""
    total = f"{split.input[0]}.plus"
    add = helper.make_node("Add", [split.input[0], other], [total], name=total)
    joined = helper.make_node("Split", [total, split.input[1]], [a.output[0] for a in adds], name=f"{total}.split")
    joined.attribute.extend(split.attribute)
    olds = [split] if twin is None else [split, twin]
    at = max(list(graph.node).index(n) for n in olds)
    graph.node.insert(at + 1, joined)
    graph.node.insert(at + 1, add)
    for old in olds + adds:
        graph.node.remove(old)


def _signature(node: onnx.NodeProto, inits: dict, ops: set[str]) -> tuple | None:
    """What linears must share to be fused, or None when the node is not a fusable linear."""
    if node.op_type == "MatMulNBits" and node.domain == "com.microsoft" and "matmulnbits" in ops:
        inputs = list(node.input) + [""] * (4 - len(node.input))
        if len(node.input) > 4 or not all(i in inits for i in inputs[1:3]) or (inputs[3] and inputs[3] not in inits):
            return None  # g_idx or bias, or weights computed in the graph
        zp = inits[inputs[3]].data_type if inputs[3] else None
        return ("nbits", node.input[0], *(attr(node, a, 0) for a in NBITS_ATTRS), inits[inputs[2]].data_type, zp)
    if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and "matmul" in ops:
        weight = inits.get(node.input[1])
        if weight is None or len(weight.dims) != 2:
            return None
        return ("matmul", node.input[0], weight.dims[0], weight.data_type)
    return None


def _fuse(graph: onnx.GraphProto, group: list[onnx.NodeProto], inits: dict) -> None:
    first = group[0]
    name = "+".join(n.name or n.output[0] for n in group)
    out = f"{name}.fused"
    if first.op_type == "MatMulNBits":
        widths = [attr(n, "N") for n in group]
        rows = [_nbits_rows(n, inits) for n in group]
        tensors = [_concat(f"{name}.{part}", [r[i] for r in rows], inits[first.input[i + 1]])
                   for i, part in enumerate(("B", "scales", "zero_points")[:len(rows[0])])]
        node = helper.make_node("MatMulNBits", [first.input[0], *(t.name for t in tensors)], [out], name=f"{name}",
                                domain="com.microsoft")
        node.attribute.extend(a for a in first.attribute if a.name != "N")
        node.attribute.append(helper.make_attribute("N", sum(widths)))
    else:
        weights = [inits[n.input[1]] for n in group]
        widths = [w.dims[1] for w in weights]
        tensors = [source_weights.joined(weights, f"{name}.weight")]
        node = helper.make_node("MatMul", [first.input[0], tensors[0].name], [out], name=name)
    sizes = numpy_helper.from_array(np.array(widths, np.int64), f"{name}.split")
    split = helper.make_node("Split", [out, sizes.name], [n.output[0] for n in group], name=f"{name}.split", axis=-1)
    graph.initializer.extend([*tensors, sizes])
    at = list(graph.node).index(first)
    for old in group:
        graph.node.remove(old)
    graph.node.insert(at, split)
    graph.node.insert(at, node)


def _nbits_rows(node: onnx.NodeProto, inits: dict) -> list[np.ndarray]:
    """B, scales (and zero points) as arrays with N leading: each row of N is quantized on its own."""
    n = attr(node, "N")
    return [source_weights.array(inits[i]).reshape(n, -1) for i in node.input[1:] if i]


def _concat(name: str, parts: list[np.ndarray], like: onnx.TensorProto) -> onnx.TensorProto:
    """The parts stacked along N, in the rank the op read the first one in (B is 3-D, scales 1-D or 2-D)."""
    stacked = np.concatenate(parts, axis=0)
    rows = stacked.shape[0]
    shape = (rows, *like.dims[1:]) if len(like.dims) > 1 else (stacked.size,)
    return numpy_helper.from_array(stacked.reshape(shape), name)
