"""FLOP counts of ONNX graphs at concrete input sizes, so pass reports can say what a rewrite saved."""

from __future__ import annotations

import math

import onnx
from onnx import shape_inference


def concrete(model: onnx.ModelProto, dims: dict[str, int]) -> onnx.ModelProto:
    """A copy with every symbolic input dimension set from `dims` and shapes inferred through the graph."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]
    for v in m.graph.input:
        for d in v.type.tensor_type.shape.dim:
            if d.dim_param:
                d.dim_value = dims[d.dim_param]
    return shape_inference.infer_shapes(m, data_prop=True)


def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    out = {}
    for v in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        out[v.name] = [d.dim_value if d.HasField("dim_value") else 0 for d in v.type.tensor_type.shape.dim]
    for t in model.graph.initializer:
        out[t.name] = list(t.dims)
    return out


def _node_flops(node: onnx.NodeProto, shape) -> int:
    if node.op_type in ("MatMul", "Gemm"):
        a, y = shape(node.input[0]), shape(node.output[0])
        k = a[0] if node.op_type == "Gemm" and _attr(node, "transA") else a[-1]
        return 2 * math.prod(y) * k
    if node.op_type == "Conv":
        w, y = shape(node.input[1]), shape(node.output[0])
        return 2 * math.prod(y) * math.prod(w[1:])
    if node.op_type == "Attention":
        q, k, y = shape(node.input[0]), shape(node.input[1]), shape(node.output[0])
        return 2 * math.prod(q) * k[-2] + 2 * math.prod(y) * k[-2]
    return 0


def _attr(node, name):
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), 0)


def count_flops(model: onnx.ModelProto, dims: dict[str, int]) -> int:
    """Multiply-add FLOPs (2 per MAC) of MatMul, Gemm, Conv and Attention nodes; other ops are cheap by comparison."""
    inferred = concrete(model, dims)
    shapes = _shapes(inferred)
    return sum(_node_flops(n, lambda name: shapes.get(name, [0])) for n in inferred.graph.node)
