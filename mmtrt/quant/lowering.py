"""Lower a component's quantized linears into its ONNX graph: each linear's weight rounded (GPTQ or to nearest),
the most sensitive kept in float under the size budget (in the graph's float type or stored in fp16), the others'
MatMuls replaced by the backend's INT4 form (MatMulNBits, or DequantizeLinear + MatMul for TensorRT).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mmtrt.quant.gptq import gptq_quantize, output_error
from mmtrt.quant.int4 import (Grid, dequantize_groups, dequantize_linear_nodes, matmulnbits_node,
                              matmulnbits_offset_nodes)
from mmtrt.quant.linears import Linear
from mmtrt.quant.mixed import keep_float

GPTQ = ("gptq", "awq_gptq")  # methods that round with GPTQ's error compensation


@dataclass(frozen=True)
class Settings:
    method: str
    grid: Grid
    clip: bool
    lowering: str
    accuracy_level: int
    search_tokens: int
    select: Callable[[str], bool]
    float_budget: int = 0  # bytes the most sensitive linears may add by staying in float (mixed precision)
    float_dtype: str = "graph"  # how a kept linear is stored: the graph's float type, or "float16" (cast at load)
    act_order: bool = False  # GPTQ's columns by decreasing Hessian diagonal, with static groups
    # the task's sensitivity of each linear, from {name: (float weight, dequantized INT4) [N, K]}; None: own error
    sensitivity: Callable[[dict[str, tuple[np.ndarray, np.ndarray]]], dict[str, float]] | None = None
    # QuantizedLinear keeps its integers and scales (the TensorRT-LLM checkpoint reads them); False drops them as
    # each linear is written, so that a component's quantized weights are held once, in its graph
    keep_arrays: bool = True

    @property
    def needs_hessian(self) -> bool:
        return self.method in GPTQ or self.float_budget > 0


@dataclass
class QuantizedLinear:
    """One lowered linear: W ~ dequant(q, scales, zero points) applied to x * prequant (prequant None: x as is).
    q, scales and zero points are None unless `Settings.keep_arrays`."""

    linear: Linear
    q: np.ndarray | None
    scales: np.ndarray | None
    zero_points: np.ndarray | None
    prequant: np.ndarray | None
    stored_bytes: int  # of the lowering's initializers (packed weights, scales, zero points) in the graph


@dataclass
class Candidate:
    """A linear rounded to INT4 with its lowered nodes and initializers, before the float budget decides."""

    linear: Linear
    q: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    prequant: np.ndarray | None
    dtype: np.dtype  # the graph's float type, which the weight is stored in
    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto]
    error: dict[str, float] | None  # own output error of RTN and of the rounding, when a Hessian was given

    def quantized(self, stored: list[onnx.TensorProto], keep_arrays: bool) -> QuantizedLinear:
        arrays = (self.q, self.scales, self.zero_points) if keep_arrays else (None, None, None)
        return QuantizedLinear(self.linear, *arrays, self.prequant, sum(len(t.raw_data) for t in stored))


def round_linear(lin: Linear, weight: Callable[[slice | None], np.ndarray], dtype: np.dtype, x_input: str,
                 clip: np.ndarray | None, prequant: np.ndarray | None, hessian: np.ndarray | None,
                 settings: Settings) -> Candidate:
    """Quantize the linear's (scaled) weight `[K, N]`, which `weight(columns)` gives (its output channels `columns`
    alone, or all for None), and lower it to read `x_input`, its scales in the graph's float `dtype`. GPTQ, or a
    Hessian to measure the error on, takes the whole weight; rounding to nearest with the clip ratios takes a block
    of output channels at a time (a 151,936-channel lm_head is never whole in float32)."""
    error = None
    if settings.method in GPTQ or hessian is not None:
        w = np.asarray(weight(None).T, np.float32)
        q, scales, zp = (gptq_quantize(w, hessian, settings.grid, settings.act_order) if settings.method in GPTQ
                         else settings.grid.quantize(w, clip))
        if hessian is not None:
            grid = settings.grid

            def final(rows: slice) -> np.ndarray:
                return dequantize_groups(q[rows], scales[rows], None if zp is None else zp[rows], grid.group)

            error = {"rtn": sig(output_error(w, lambda rows: grid.fake(w[rows]), hessian)),
                     "final": sig(output_error(w, final, hessian))}
    else:
        q, scales, zp = settings.grid.quantize_rows_of(lambda rows: weight(rows).T, (lin.n, lin.k), clip)
    nodes, inits = _lower(lin, x_input, q, scales.astype(dtype), zp, settings)
    return Candidate(lin, q, scales, zp, prequant, dtype, nodes, inits, error)


def kept_float(candidates: list[Candidate], weight: Callable[[Linear], np.ndarray],
               settings: Settings) -> tuple[list[str], dict[str, float] | None]:
    """The linears the budget keeps in float and, with a task sensitivity, each linear's score. By own output
    error: the largest first. By task sensitivity: the largest score per byte kept first (the knapsack's greedy
    order: the budget buys the most sensitivity it can). `weight`: a linear's float weight `[K, N]`."""
    extra = {c.linear.name: _extra_bytes(c, settings) for c in candidates}
    if settings.sensitivity is None:
        return keep_float([(c.linear.name, c.error["final"], extra[c.linear.name]) for c in candidates],
                          settings.float_budget), None
    lowered = {c.linear.name: (weight(c.linear).T.astype(np.float32),
                               dequantize_groups(c.q, c.scales, c.zero_points, settings.grid.group)) for c in candidates}
    scores = settings.sensitivity(lowered)
    density = [(name, scores[name] / max(b, 1), b) for name, b in extra.items()]
    return keep_float(density, settings.float_budget), scores


def sig(x: float) -> float:
    """Four significant digits, as the reports give their errors."""
    return float(f"{x:.4g}")


def _extra_bytes(c: Candidate, settings: Settings) -> int:
    """Bytes a linear adds by staying in float: its float weight less its lowering's initializers."""
    stored = 2 if settings.float_dtype == "float16" else c.dtype.itemsize
    return c.linear.k * c.linear.n * stored - sum(len(t.raw_data) for t in c.initializers)


def fp16_weight(lin: Linear, x_input: str, weight: np.ndarray) -> tuple[list[onnx.NodeProto], onnx.TensorProto]:
    """A kept linear whose weight (`[K, N]` in the graph's float type) is stored in fp16 and cast to the graph's
    type in front of its MatMul (a constant that ONNX Runtime and TensorRT fold when they load the graph)."""
    stored = numpy_helper.from_array(weight.astype(np.float16), f"{lin.name}.fp16_weight")
    cast = helper.make_node("Cast", [stored.name], [f"{lin.name}.weight_cast"],
                            to=helper.np_dtype_to_tensor_dtype(weight.dtype), name=f"{lin.name}.weight_cast")
    matmul = helper.make_node("MatMul", [x_input, cast.output[0]], [lin.output], name=lin.node.name)
    return [cast, matmul], stored


def _lower(lin: Linear, x_input: str, q, scales, zp, settings: Settings) -> tuple[list[onnx.NodeProto],
                                                                                 list[onnx.TensorProto]]:
    if settings.grid.float_zero_point:
        return matmulnbits_offset_nodes(lin.name, x_input, q, scales, zp, lin.k, lin.n, settings.grid.group,
                                        settings.accuracy_level, output=lin.output)
    if settings.lowering == "matmulnbits":
        node, inits = matmulnbits_node(lin.name, x_input, q, scales, zp, lin.k, lin.n, settings.grid.group,
                                       settings.accuracy_level, output=lin.output)
        return [node], inits
    return dequantize_linear_nodes(lin.name, x_input, lin.output, q, scales, settings.grid.group)


def rebuild_nodes(graph: onnx.GraphProto, inserts: dict[int, list[onnx.NodeProto]],
                  replaced: dict[str, list[onnx.NodeProto]]) -> None:
    """Rebuild the node list: `inserts` go before the nodes at their positions, and a MatMul whose output is in
    `replaced` becomes those nodes (a node whose outputs are already made is dropped: a node shared by linears
    that read one tensor comes once)."""
    nodes, made = [], set()
    for i, node in enumerate(graph.node):
        own = replaced[node.output[0]] if node.op_type == "MatMul" and node.output[0] in replaced else [node]
        for n in inserts.get(i, []) + own:
            if not made.intersection(n.output):
                nodes.append(_copy(n))
                made.update(n.output)
    del graph.node[:]
    graph.node.extend(nodes)


def drop_unused_initializers(graph: onnx.GraphProto) -> None:
    """Delete, in place, the initializers nothing reads (rebuilding the list would copy every weight twice)."""
    used = {n for node in graph.node for n in node.input} | {o.name for o in graph.output}
    for i in reversed(range(len(graph.initializer))):
        if graph.initializer[i].name not in used:
            del graph.initializer[i]


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    out = onnx.NodeProto()
    out.CopyFrom(node)
    return out
