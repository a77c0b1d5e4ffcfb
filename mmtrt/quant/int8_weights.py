"""INT8 for a component's linears: one symmetric scale per output channel (max|W[:, n]| / 127), in one of two forms.

Weight-only (`dynamic=False`): the int8 weight read by a per-axis DequantizeLinear in front of the MatMul.
Activations stay float, so nothing is calibrated or searched: the cheapest honest way to store a tower in a quarter
of its fp32 bytes, in the weight-only form both TensorRT and ONNX Runtime take. It saves memory, not time: ONNX
Runtime's CPU kernel for it (MatMulNBits, 8 bits) runs at about the fp32 MatMul's speed.

Dynamic (`dynamic=True`): `com.microsoft.DynamicQuantizeMatMul`, whose input is quantized per tensor to uint8 at
run time (its own min and max, no calibration) and multiplied by the int8 weight in integers (the VNNI int8 GEMM on
CPUs that have it: 0.29x the fp32 MatMul's time at 512 tokens, docs/results/ort-cpu-kernels.md). Faster at prefill
sizes and lossier (an activation outlier widens the whole tensor's step); ONNX Runtime only, float32 only.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mmtrt.errors import UserError
from mmtrt.ir import source_weights, spill
from mmtrt.ir.rewrite import import_domain
from mmtrt.quant.linears import find_linears


def quantize_columns(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W [K, N] as MatMul stores it -> (q int8 [K, N] in [-127, 127], scales float32 [N]); an all-zero column gets
    scale 1."""
    amax = np.abs(w.astype(np.float32)).max(axis=0)
    scales = np.where(amax > 0, amax / 127, 1).astype(np.float32)
    return np.clip(np.rint(w / scales), -127, 127).astype(np.int8), scales


def int8_weight_linears(model: onnx.ModelProto, component: str, select: Callable[[str], bool],
                        activations: str = "float") -> dict:
    """Rewrite the selected linears of `model` in place (`activations`: "float", weight-only; "dynamic", per
    tensor; "per_token"); returns the report (linears, bytes before and after)."""
    index, linears, _ = find_linears(model, component)
    graph, nodes, new, names, rows = model.graph, {}, [], [], {}
    before = after = 0
    if _opset(model) < 13:
        raise UserError(f"int8_weights: the {component} graph's opset {_opset(model)} has no per-axis "
                        f"DequantizeLinear (opset 13+); export at a newer opset")
    for lin in linears:
        if not select(lin.name):
            continue
        tensor = index.initializers[lin.weight]
        if activations != "float" and tensor.data_type != TensorProto.FLOAT:
            raise UserError(f"int8_weights: activations: {activations} takes float32 linears; {lin.name} is "
                            f"{TensorProto.DataType.Name(tensor.data_type).lower()} (drop cast_precision for "
                            f"{component}, or use activations: float)")
        w = source_weights.array(tensor)
        q, scales = quantize_columns(w)
        weight = numpy_helper.from_array(q, f"{lin.name}.int8_weight")
        spill.made(model, weight)
        scale = numpy_helper.from_array(scales.astype(w.dtype), f"{lin.name}.int8_scale")
        if activations == "per_token":
            first = lin.input not in rows
            quantized, codes, x_scale = rows.setdefault(lin.input, per_token_input(lin.input))
            nodes[id(lin.node)] = (quantized if first else []) + per_token_matmul(lin, weight.name, scale.name, codes,
                                                                             x_scale)
        elif activations == "dynamic":
            nodes[id(lin.node)] = _dynamic(lin, weight.name, scale.name)
        else:
            nodes[id(lin.node)] = _weight_only(lin, weight, scale)
        new += [weight, scale]
        names.append(lin.name)
        before += w.nbytes
        after += q.nbytes + scales.astype(w.dtype).nbytes
    rebuilt = [n for node in graph.node for n in nodes.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(rebuilt)
    read = {i for node in graph.node for i in node.input} | {o.name for o in graph.output}
    if rows:
        new += [numpy_helper.from_array(v, k) for k, v in PER_TOKEN_CONSTANTS.items()]
    kept = [t for t in graph.initializer if t.name in read] + new
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if activations != "float" and names:
        import_domain(model, "com.microsoft")
    return {"linears_quantized": len(names), "linears": names, "weight_bytes_before": before,
            "weight_bytes_after": after, "activations": activations}


def _weight_only(lin, weight: onnx.TensorProto, scale: onnx.TensorProto) -> list[onnx.NodeProto]:
    """DequantizeLinear of the int8 weight, read by the MatMul in place of the float weight."""
    dq = helper.make_node("DequantizeLinear", [weight.name, scale.name], [f"{lin.name}.int8_dq"],
                          name=f"{lin.name}.dq", axis=1)
    lin.node.input[1] = dq.output[0]
    return [dq, lin.node]


def _dynamic(lin, weight: str, scale: str) -> list[onnx.NodeProto]:
    """The MatMul replaced by DynamicQuantizeMatMul on the same input and output."""
    return [helper.make_node("DynamicQuantizeMatMul", [lin.input, weight, scale], [lin.output],
                             name=f"{lin.name}.dynamic_int8", domain="com.microsoft")]


def per_token_input(x: str) -> tuple[list[onnx.NodeProto], str, str]:
    """x [..., K] quantized per row: s = max|row| / 127 and round(row / s) + 128 as uint8 (a symmetric grid held
    as uint8 with the zero point 128, the operand form of the VNNI int8 GEMM; ONNX Runtime's integer GEMMs take
    no per-row zero point). Nodes, the codes and the scales [..., 1]; one set per input tensor, shared by the
    linears that read it."""
    p = f"{x}.per_token"
    nodes = [
        helper.make_node("Abs", [x], [f"{p}.abs"]),
        helper.make_node("ReduceMax", [f"{p}.abs", "int8.last_axis"], [f"{p}.amax"], keepdims=1),
        helper.make_node("Max", [f"{p}.amax", "int8.tiny"], [f"{p}.amax_pos"]),
        helper.make_node("Div", [f"{p}.amax_pos", "int8.127"], [f"{p}.scale"]),
        helper.make_node("Div", [x, f"{p}.scale"], [f"{p}.steps"]),
        helper.make_node("QuantizeLinear", [f"{p}.steps", "int8.one", "int8.zero_128"], [f"{p}.codes"]),
    ]
    return nodes, f"{p}.codes", f"{p}.scale"


def per_token_matmul(lin, weight: str, scale: str, codes: str, x_scale: str) -> list[onnx.NodeProto]:
    """The integer product of the row codes and the int8 weight, scaled back by each column's and each row's scale:
    ONNX Runtime's MatMulIntegerToFloat, which applies the column scales in the GEMM's output stage and the rows'
    in one pass after it (MatMulInteger, a Cast and two Muls pass over the output three times)."""
    return [helper.make_node("MatMulIntegerToFloat", [codes, weight, x_scale, scale, "int8.zero_128"], [lin.output],
                             name=f"{lin.name}.per_token", domain="com.microsoft")]


PER_TOKEN_CONSTANTS = {"int8.last_axis": np.array([-1], np.int64), "int8.tiny": np.array(1e-30, np.float32),
                       "int8.127": np.array(127, np.float32), "int8.one": np.array(1, np.float32),
                       "int8.zero_128": np.array(128, np.uint8)}


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
