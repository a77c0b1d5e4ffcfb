"""Small graph-rewrite helpers shared by passes: constants, producers, use replacement, dead-node removal, opset imports."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import numpy_helper

from mmtrt.ir import source_weights
from mmtrt.ir.graph import drop_dead, toposort


def producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in graph.node for out in node.output}


def const_value(graph: onnx.GraphProto, name: str) -> np.ndarray | None:
    """The value of an initializer or Constant-node output, or None when the tensor is computed."""
    for t in graph.initializer:
        if t.name == name:
            return source_weights.array(t)
    node = producers(graph).get(name)
    if node is not None and node.op_type == "Constant":
        return numpy_helper.to_array(node.attribute[0].t)
    return None


def attr(node: onnx.NodeProto, name: str, default=None):
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def replace_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Point every consumer of `old` at `new`; a graph output named `old` is kept through an Identity.

    The old producer's output is renamed then, so that the graph keeps one definition per name.
    """
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
    if any(o.name == old for o in graph.output):
        for node in graph.node:
            for i, name in enumerate(node.output):
                if name == old:
                    node.output[i] = f"{old}_bypassed"
        graph.node.append(onnx.helper.make_node("Identity", [new], [old], name=f"{old}_identity"))


def import_domain(model: onnx.ModelProto, domain: str) -> None:
    """Declare `domain` (version 1) in the model's opset imports, once, so its nodes load."""
    if not any(o.domain == domain for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(domain, 1))


def cleanup(model: onnx.ModelProto, fold_constants: bool = False) -> onnx.ModelProto:
    """Remove nodes and initializers no output depends on and order the nodes topologically, in place; returns
    `model`. Folding constants goes through onnx-graphsurgeon, whose export copies every weight of the graph (an
    INT4 Qwen2-0.5B's 0.4 GB, and glibc kept the freed copy: 0.56 GB more resident after each pass that cleaned
    up), so only graph_cleanup's `fold_constants` takes that way."""
    if fold_constants:
        return _folded(model)
    toposort(model.graph)  # drop_dead reads the nodes from the last
    drop_dead(model.graph)
    return model


def _folded(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with its constants folded and its dead nodes removed, by onnx-graphsurgeon."""
    gs.logger.G_LOGGER.severity = gs.logger.G_LOGGER.ERROR  # its folding advice is noise in a compile log
    graph = gs.import_onnx(model)
    graph.fold_constants(error_ok=False)
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    out = gs.export_onnx(graph, do_type_check=True)
    out.ir_version = model.ir_version
    out.producer_name, out.producer_version = model.producer_name, model.producer_version
    del out.opset_import[:]
    out.opset_import.extend(model.opset_import)
    out.metadata_props.extend(model.metadata_props)
    return out
