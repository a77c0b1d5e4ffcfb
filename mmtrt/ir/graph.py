"""The unified IR: the model as a graph of components, each an ONNX graph or a preprocessing spec.

Components talk through a contract (named tensors with named symbolic dimensions), so a pass that changes
one component can be checked against what its neighbours expect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from mmtrt.ir import source_weights
from mmtrt.ir.spec import TensorSpec  # noqa: F401 (the IR's users import it from here)


@dataclass
class Component:
    """One stage of the model. `onnx` holds its graph; `spec` holds a non-ONNX stage (preprocessing)."""

    name: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    onnx: onnx.ModelProto | None = None
    spec: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def node_count(self) -> int:
        return len(self.onnx.graph.node) if self.onnx is not None else 0

    def param_count(self) -> int:
        if self.onnx is None:
            return 0
        return int(sum(np.prod(t.dims, dtype=np.int64) for t in self.onnx.graph.initializer))

    def set_graph(self, model: onnx.ModelProto) -> None:
        """Take a rewritten graph, with the inputs and outputs it declares."""
        self.onnx = model
        self.inputs, self.outputs = graph_io(model, "inputs"), graph_io(model, "outputs")

    def initializer(self, name: str) -> np.ndarray:
        for t in self.onnx.graph.initializer:
            if t.name == name:
                return source_weights.array(t)
        raise KeyError(name)


@dataclass
class ModelIR:
    """All components, model facts shared between them, tokenizer assets, and the properties passes rely on."""

    components: dict[str, Component]
    config: dict[str, Any]
    assets: dict[str, bytes]
    properties: set[str] = field(default_factory=set)

    def onnx_components(self) -> list[Component]:
        return [c for c in self.components.values() if c.onnx is not None]


ONNX_DTYPES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.BOOL: "bool",
}


def graph_io(model: onnx.ModelProto, which: str) -> list[TensorSpec]:
    """The declared inputs or outputs of an ONNX graph as TensorSpecs (dim_param names kept)."""
    values = model.graph.input if which == "inputs" else model.graph.output
    specs = []
    for v in values:
        t = v.type.tensor_type
        dims = tuple(d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim)
        specs.append(TensorSpec(v.name, ONNX_DTYPES.get(t.elem_type, str(t.elem_type)), dims))
    return specs


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """The tensors a node reads, including those its subgraph bodies read from the enclosing graph."""
    names = [n for n in node.input if n]
    for a in node.attribute:
        for graph in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            names += _outer_references(graph)
    return names


def _outer_references(graph: onnx.GraphProto) -> list[str]:
    local = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    local |= {o for n in graph.node for o in n.output}
    return [name for n in graph.node for name in node_inputs(n) if name not in local]


def drop_dead(graph: onnx.GraphProto) -> None:
    """Remove the nodes whose outputs nothing reads (in reverse topological order), then unread initializers and
    the value_info of tensors gone."""
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(node_inputs(node))
    del graph.node[:]
    graph.node.extend(reversed(kept))
    inits = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    made = {o for n in graph.node for o in n.output}
    infos = [v for v in graph.value_info if v.name in needed or v.name in made]
    del graph.value_info[:]
    graph.value_info.extend(infos)
