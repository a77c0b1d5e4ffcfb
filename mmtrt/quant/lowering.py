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

from mmtrt.ir.rewrite import import_domain
from mmtrt.quant.gptq import gptq_quantize, output_error
from mmtrt.quant.int4 import (Grid, dequantize_groups, dequantize_linear_nodes, matmulnbits_node,
                              matmulnbits_offset_nodes)
from mmtrt.quant.linears import Group, Linear
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

    @property
    def needs_hessian(self) -> bool:
        return self.method in GPTQ or self.float_budget > 0


@dataclass
class QuantizedLinear:
    """One lowered linear: W ~ dequant(q, scales, zero points) applied to x * prequant (prequant None: x as is)."""

    linear: Linear
    q: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    prequant: np.ndarray | None
    stored_bytes: int  # of the lowering's initializers (packed weights, scales, zero points) in the graph


def lower_linears(model: onnx.ModelProto, groups: list[Group], clips: list[list[np.ndarray | None]],
                  prequant: list[np.ndarray | None], settings: Settings,
                  hessians: list[np.ndarray | None] | None = None) -> tuple[list[QuantizedLinear], dict]:
    """Quantize each linear's (scaled) weight (GPTQ when the method says so, else to nearest with its clip ratios),
    keep the most sensitive ones in float within the budget, and replace the others' MatMuls by the lowering.
    Returns them and, when Hessians were given, the report's `own_output_rel_mse`, `kept_float` and (with a task
    sensitivity) `task_sensitivity`."""
    inits = {t.name: t for t in model.graph.initializer}
    hessians = hessians or [None] * len(groups)
    candidates, errors = [], {}
    for group, group_clips, pre, h in zip(groups, clips, prequant, hessians):
        for lin, clip in zip(group.linears, group_clips):
            w = numpy_helper.to_array(inits[lin.weight]).T.astype(np.float32)
            q, scales, zp = (gptq_quantize(w, h, settings.grid, settings.act_order) if settings.method in GPTQ
                             else settings.grid.quantize(w, clip))
            if h is not None:
                final = dequantize_groups(q, scales, zp, settings.grid.group)
                errors[lin.name] = {"rtn": sig(output_error(w, settings.grid.fake(w), h)),
                                    "final": sig(output_error(w, final, h))}
            dtype = helper.tensor_dtype_to_np_dtype(inits[lin.weight].data_type)
            candidates.append((lin, q, scales, zp, pre, _lower(lin, q, scales.astype(dtype), zp, settings)))
    kept, scores = _kept(inits, candidates, errors, settings) if settings.float_budget else ([], None)
    replaced, new, quantized = {}, {}, []
    for lin, q, scales, zp, pre, (nodes, lowered) in candidates:
        if lin.name in kept:
            if settings.float_dtype == "float16":
                replaced[lin.output], stored = _fp16_weight(lin, inits[lin.weight])
                new[stored.name] = stored
            continue
        replaced[lin.output] = nodes
        lowered = [t for t in lowered if t.name not in new]  # shared group indicators are stored once
        new.update((t.name, t) for t in lowered)
        quantized.append(QuantizedLinear(lin, q, scales, zp, pre, sum(len(t.raw_data) for t in lowered)))
    replace_nodes(model, {i: replaced[n.output[0]] for i, n in enumerate(model.graph.node)
                           if n.op_type == "MatMul" and n.output[0] in replaced}, list(new.values()))
    if settings.lowering == "matmulnbits":
        import_domain(model, "com.microsoft")
    report = {"own_output_rel_mse": errors} if errors else {}
    if settings.float_budget:
        report["kept_float"] = sorted(kept)
    if scores is not None:
        report["task_sensitivity"] = {name: sig(v) for name, v in scores.items()}
    return quantized, report


def _kept(inits: dict[str, onnx.TensorProto], candidates: list, errors: dict,
          settings: Settings) -> tuple[list[str], dict[str, float] | None]:
    """The linears the budget keeps in float and, with a task sensitivity, each linear's score. By own output
    error: the largest first. By task sensitivity: the largest score per byte kept first (the knapsack's greedy
    order: the budget buys the most sensitivity it can)."""
    extra = {lin.name: _extra_bytes(inits[lin.weight], lin, form[1], settings) for lin, *_, form in candidates}
    if settings.sensitivity is None:
        return keep_float([(name, errors[name]["final"], b) for name, b in extra.items()], settings.float_budget), None
    lowered = {lin.name: (numpy_helper.to_array(inits[lin.weight]).T.astype(np.float32),
                          dequantize_groups(q, scales, zp, settings.grid.group)) for lin, q, scales, zp, *_ in candidates}
    scores = settings.sensitivity(lowered)
    density = [(name, scores[name] / max(b, 1), b) for name, b in extra.items()]
    return keep_float(density, settings.float_budget), scores


def sig(x: float) -> float:
    """Four significant digits, as the reports give their errors."""
    return float(f"{x:.4g}")


def _extra_bytes(weight: onnx.TensorProto, lin: Linear, lowered: list[onnx.TensorProto], settings: Settings) -> int:
    """Bytes a linear adds by staying in float: its float weight less its lowering's initializers."""
    stored = 2 if settings.float_dtype == "float16" else helper.tensor_dtype_to_np_dtype(weight.data_type).itemsize
    return lin.k * lin.n * stored - sum(len(t.raw_data) for t in lowered)


def _fp16_weight(lin: Linear, weight: onnx.TensorProto) -> tuple[list[onnx.NodeProto], onnx.TensorProto]:
    """A kept linear whose weight is stored in fp16 and cast to the graph's type in front of its MatMul (a constant
    that ONNX Runtime and TensorRT fold when they load the graph)."""
    stored = numpy_helper.from_array(numpy_helper.to_array(weight).astype(np.float16), f"{lin.name}.fp16_weight")
    cast = helper.make_node("Cast", [stored.name], [f"{lin.name}.weight_cast"], to=weight.data_type,
                            name=f"{lin.name}.weight_cast")
    matmul = helper.make_node("MatMul", [lin.input, cast.output[0]], [lin.output], name=lin.node.name)
    return [cast, matmul], stored


def _lower(lin: Linear, q, scales, zp, settings: Settings) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    if settings.grid.float_zero_point:
        return matmulnbits_offset_nodes(lin.name, lin.input, q, scales, zp, lin.k, lin.n, settings.grid.group,
                                        settings.accuracy_level, output=lin.output)
    if settings.lowering == "matmulnbits":
        node, inits = matmulnbits_node(lin.name, lin.input, q, scales, zp, lin.k, lin.n, settings.grid.group,
                                       settings.accuracy_level, output=lin.output)
        return [node], inits
    return dequantize_linear_nodes(lin.name, lin.input, lin.output, q, scales, settings.grid.group)


def replace_nodes(model: onnx.ModelProto, replacements: dict[int, list[onnx.NodeProto]],
                   initializers: list[onnx.TensorProto]) -> None:
    """Rebuild the node list with the nodes at the given positions replaced (a replacement node whose outputs are
    already made is dropped), add initializers, drop the ones nothing reads."""
    graph = model.graph
    nodes, made = [], set()
    for i, node in enumerate(graph.node):
        for n in replacements.get(i, [node]):
            if not made.intersection(n.output):  # a node shared by linears that read one tensor comes once
                nodes.append(_copy(n))
                made.update(n.output)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(initializers)
    drop_unused_initializers(graph)


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
