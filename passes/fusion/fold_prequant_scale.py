"""fold_prequant_scale: a Mul by a constant per-channel vector folds into the node that produced its input, where exact.

AWQ divides a linear's input by its per-channel scale; where no producer can absorb the division it stays as a
`Mul` before the quantized linear (for o_proj: AWQ folds the others itself), and a graph edited by hand or by other
tools can carry such Muls anywhere. Each is one more node per layer at decode time. When the Mul's input comes from
a node whose output channels can be scaled without changing anything else, the vector is multiplied into that
node's constants and the Mul goes: an RMS or layer norm (its scale and bias), a `MatMulNBits` (the scales of each
output row: dequantized weights are (q - zero point) x scale, so the row scales exactly), a float MatMul with a
constant weight (its columns). Others are left and counted by producer, e.g. o_proj's Mul after attention: the
attention output's channel (head h, d) is a sum over positions of V's channel (KV head of h, d), so it could fold
into v_proj only when every query head of a KV group had the same scale, which AWQ's per-channel search does not
give; it is left.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import numpy_helper

from mmtrt.ir.graph import ModelIR
from mmtrt.ir.rewrite import attr, cleanup, producers, replace_uses
from mmtrt.pipeline.pass_base import Pass
from passes.fusion.fold_prequant_scale_config import FoldPrequantScaleConfig

NORMS = ("RMSNormalization", "SimplifiedLayerNormalization", "LayerNormalization", "SkipSimplifiedLayerNormalization")


class FoldPrequantScale(Pass):
    name = "fold_prequant_scale"
    Config = FoldPrequantScaleConfig
    components = ("vision", "llm")

    def run(self, ir: ModelIR) -> dict:
        changes = {}
        for name in self.config.components:
            comp = ir.components[name]
            folded, left = fold_channel_muls(comp.onnx.graph)
            comp.set_graph(cleanup(comp.onnx))
            changes[name] = {"muls_folded": dict(folded), "muls_left": dict(left)}
        return changes


def fold_channel_muls(graph: onnx.GraphProto) -> tuple[Counter, Counter]:
    """Fold each foldable Mul; returns the folded and the left ones, counted by the producer's op type."""
    inits = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    uses = Counter(name for node in graph.node for name in node.input)
    prods = producers(graph)
    folded, left = Counter(), Counter()
    for mul in [n for n in graph.node if n.op_type == "Mul"]:
        found = _channel_vector(mul, inits)
        if found is None:
            continue
        x, scale = found
        producer = prods.get(x)
        if producer is None or uses[x] != 1 or x in outputs:
            continue  # its input is read elsewhere too (or is a graph input): nothing to fold into alone
        if _fold_into(producer, x, scale, inits, uses):
            replace_uses(graph, mul.output[0], x)
            graph.node.remove(mul)
            folded[producer.op_type] += 1
        else:
            left[producer.op_type] += 1
    return folded, left


def _channel_vector(mul: onnx.NodeProto, inits: dict) -> tuple[str, np.ndarray] | None:
    """(the other input, the vector) when one input is a constant over the last axis only."""
    for const, other in ((mul.input[1], mul.input[0]), (mul.input[0], mul.input[1])):
        if const in inits and other not in inits:
            value = numpy_helper.to_array(inits[const])
            if value.ndim >= 1 and value.size == value.shape[-1] and value.size > 1:
                return other, value.reshape(-1)
    return None


def _fold_into(node: onnx.NodeProto, out: str, scale: np.ndarray, inits: dict, uses: Counter) -> bool:
    if node.op_type in NORMS and node.output[0] == out:
        weights = [2, 3] if node.op_type == "SkipSimplifiedLayerNormalization" else [1, 2]  # gamma (and beta)
        targets = [(node.input[i], None) for i in weights if i < len(node.input) and node.input[i]]
    elif node.op_type == "MatMulNBits" and len(node.input) <= 4 and attr(node, "N") == scale.size:
        targets = [(node.input[2], scale.size)]
    elif node.op_type == "MatMul" and node.input[1] in inits and len(inits[node.input[1]].dims) == 2:
        targets = [(node.input[1], "columns")]
    else:
        return False
    if any(name not in inits or uses[name] != 1 for name, _ in targets):
        return False  # a constant computed in the graph, or shared with another node
    return _scale_constants(targets, scale, inits)


def _scale_constants(targets: list[tuple[str, object]], scale: np.ndarray, inits: dict) -> bool:
    """Multiply each target by the vector: along its last axis (None), its rows of N (an int: MatMulNBits' scales,
    N rows of blocks) or its columns ("columns": a [K, N] weight). False, changing nothing, when a shape differs."""
    arrays = []
    for name, how in targets:
        value = numpy_helper.to_array(inits[name])
        if how is None and value.shape[-1:] == scale.shape:
            arrays.append((name, value * scale.astype(value.dtype)))
        elif isinstance(how, int) and value.size % how == 0 and value.shape[0] in (how, value.size):
            rows = value.reshape(how, -1) * scale.astype(value.dtype)[:, None]
            arrays.append((name, rows.reshape(value.shape)))
        elif how == "columns" and value.shape[1] == scale.size:
            arrays.append((name, value * scale.astype(value.dtype)[None, :]))
        else:
            return False
    for name, value in arrays:
        inits[name].CopyFrom(numpy_helper.from_array(value, name))
    return bool(arrays)
