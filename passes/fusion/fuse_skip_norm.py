"""fuse_skip_norm: a residual Add followed by an RMS norm runs as one `com.microsoft.SkipSimplifiedLayerNormalization`.

Every decoder layer adds its attention and MLP outputs to the residual stream and normalises the sum for the next
block. The exporter writes an Add and an ONNX `RMSNormalization`, which ONNX Runtime's optimizer does not fuse
(it fuses its own SimplifiedLayerNormalization pattern only), so each layer runs two extra nodes and writes the sum
to memory and reads it back. onnxruntime-genai's builder writes the fused contrib op, whose fourth output is the
sum the residual stream goes on with. Only Adds of two computed tensors are fused (a constant operand may
broadcast, which the fused op does not), and only norms over the last axis with a constant scale.
"""

from __future__ import annotations

import onnx
from onnx import helper

from mmtrt.ir.graph import ModelIR
from mmtrt.ir.rewrite import attr, cleanup, import_domain, producers
from mmtrt.pipeline.pass_base import Pass
from passes.fusion.fuse_skip_norm_config import FuseSkipNormConfig

NORMS = {("RMSNormalization", ""), ("RMSNormalization", "ai.onnx"), ("SimplifiedLayerNormalization", ""),
         ("SimplifiedLayerNormalization", "ai.onnx")}


class FuseSkipNorm(Pass):
    name = "fuse_skip_norm"
    Config = FuseSkipNormConfig
    components = ("vision", "llm")
    reads_source_weights = True  # rewires the Adds and norms; the weights stay where they are

    def run(self, ir: ModelIR) -> dict:
        changes = {}
        for name in self.config.components:
            comp = ir.components[name]
            fused = fuse_add_rms_norm(comp.onnx.graph)
            if fused:
                import_domain(comp.onnx, "com.microsoft")
            comp.set_graph(cleanup(comp.onnx))
            changes[name] = {"norms_fused": fused}
        return changes


def fuse_add_rms_norm(graph: onnx.GraphProto) -> int:
    """Replace each Add -> RMS norm pair by SkipSimplifiedLayerNormalization; returns how many."""
    prods = producers(graph)
    constants = {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant"
                                                       for o in n.output}
    fused: set[str] = set()  # the Adds taken, by output: a sum normalised twice is fused once
    for norm in list(graph.node):
        add = prods.get(norm.input[0]) if (norm.op_type, norm.domain) in NORMS else None
        if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx") or add.output[0] in fused:
            continue
        if any(i in constants for i in add.input) or norm.input[1] not in constants or attr(norm, "axis", -1) != -1:
            continue
        if len(norm.output) > 1 and any(norm.output[1:]):
            continue  # the norm's statistics are read
        node = helper.make_node("SkipSimplifiedLayerNormalization", [add.input[0], add.input[1], norm.input[1]],
                                [norm.output[0], "", "", add.output[0]], name=f"{norm.name or norm.output[0]}.skip",
                                domain="com.microsoft", epsilon=attr(norm, "epsilon", 1e-5))
        at = list(graph.node).index(norm)
        graph.node.remove(norm)
        graph.node.insert(at, node)
        graph.node.remove(add)
        fused.add(add.output[0])
    return len(fused)
