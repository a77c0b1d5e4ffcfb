"""The unified IR: the model as a graph of components, each an ONNX graph or a preprocessing spec.

Components talk through a contract (named tensors with named symbolic dimensions), so a pass that changes
one component can be checked against what its neighbours expect.
"""

from __future__ import annotations

import heapq
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
    the value_info of tensors gone. Each goes by its index: protobuf copies every message it moves, so putting a
    list of the kept initializers back copied every weight of the graph (0.37 GB for an INT4 Qwen2-0.5B)."""
    needed = {o.name for o in graph.output}
    dead = []
    for i in reversed(range(len(graph.node))):
        node = graph.node[i]
        if any(o in needed for o in node.output):
            needed.update(node_inputs(node))
        else:
            dead.append(i)
    _delete(graph.node, dead)
    _delete(graph.initializer, [i for i, t in enumerate(graph.initializer) if t.name not in needed][::-1])
    needed |= {o for n in graph.node for o in n.output}
    _delete(graph.value_info, [i for i, v in enumerate(graph.value_info) if v.name not in needed][::-1])


def _delete(field, descending: list[int]) -> None:
    for i in descending:
        del field[i]


def toposort(graph: onnx.GraphProto) -> None:
    """Order the nodes so that each comes after the nodes it reads from, keeping the graph's order wherever it
    already holds (a node goes as early as its inputs and its place among the others allow)."""
    made = {o: i for i, node in enumerate(graph.node) for o in node.output if o}
    reads = [{made[n] for n in node_inputs(node) if n in made} - {i} for i, node in enumerate(graph.node)]
    if all(j < i for i, r in enumerate(reads) for j in r):
        return
    readers: dict[int, list[int]] = {}
    for i, r in enumerate(reads):
        for j in r:
            readers.setdefault(j, []).append(i)
    waiting = [len(r) for r in reads]
    ready = [i for i, w in enumerate(waiting) if not w]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for k in readers.get(i, ()):
            waiting[k] -= 1
            if not waiting[k]:
                heapq.heappush(ready, k)
    if len(order) != len(graph.node):
        raise ValueError("the graph has a cycle")
    nodes = [graph.node[i] for i in order]
    del graph.node[:]
    graph.node.extend(nodes)
