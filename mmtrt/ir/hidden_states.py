"""LLaVA's feature select in the lowered vision graph.

The export stacks every hidden state of the tower ([layers + 1, images, tokens, width]) and gathers the feature
layers from the stack, so a run holds all of them at once: 27 float32 copies of the residual stream for SigLIP
so400m. Read straight from its layer, a selected hidden state needs none of the others kept
(dead_layer_elimination's rewrite; calibration's layer-at-a-time run of the tower).
"""

from __future__ import annotations

import onnx

from mmtrt.ir.rewrite import attr, const_value, producers


def stacked_selects(graph: onnx.GraphProto) -> dict[str, str]:
    """Each Gather(Concat(Unsqueeze(h_0), ..., Unsqueeze(h_n)), i) on axis 0 with a constant scalar i: its
    output -> h_i."""
    made = producers(graph)
    found = {}
    for node in graph.node:
        source = _stacked_source(graph, made, node)
        if source is not None:
            found[node.output[0]] = source
    return found


def _stacked_source(graph, made, gather) -> str | None:
    if gather.op_type != "Gather" or attr(gather, "axis", 0) != 0:
        return None
    concat = made.get(gather.input[0])
    index = const_value(graph, gather.input[1])
    if concat is None or concat.op_type != "Concat" or attr(concat, "axis") != 0 or index is None or index.ndim:
        return None
    parts = [made.get(name) for name in concat.input]
    if not all(p is not None and p.op_type == "Unsqueeze" and _axes(graph, p) == [0] for p in parts):
        return None
    return parts[int(index)].input[0]


def _axes(graph, unsqueeze) -> list[int] | None:
    axes = const_value(graph, unsqueeze.input[1]) if len(unsqueeze.input) > 1 else attr(unsqueeze, "axes")
    return None if axes is None else [int(a) for a in axes]
