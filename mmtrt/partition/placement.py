"""Op-level placement: which nodes of a component run in TensorRT and which fall back to ONNX Runtime.

Placement describes a TensorRT host, not this one: a node goes to TensorRT when TensorRT's ONNX parser takes it
(mmtrt.backends.tensorrt.support). Nodes are then scheduled in a topological order that stays on one backend as
long as it can, so every switch is a segment boundary and the segments run one after another. A TensorRT
segment below the minimum size is not worth the transfers around it: its nodes go to ONNX Runtime and the graph
is scheduled again.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import onnx
from onnx import helper

from mmtrt.backends.tensorrt.support import TABLE_SOURCE, GraphFacts, Verdict, check_node
from mmtrt.ir.graph import node_inputs
from mmtrt.kernels.catalog import plugin_of
from mmtrt.recipe import PartitionPolicy

TENSORRT, ONNXRUNTIME = "tensorrt", "onnxruntime"
SUPPORTED_REASON = "supported by TensorRT's ONNX parser"
DEFAULT_MIN_SEGMENT_SIZE = PartitionPolicy.model_fields["min_segment_size"].default
# Initializers at least this large are left out of the copy that shape inference sees (only their shape matters).
INFERENCE_WEIGHT_LIMIT = 1 << 10


@dataclass
class Segment:
    index: int
    backend: str
    nodes: list[int]
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


@dataclass
class Placement:
    """Per node a backend and a verdict (None: TensorRT takes it); the segments in the order they run."""

    component: str
    model: onnx.ModelProto
    facts: GraphFacts
    verdicts: list[Verdict | None]
    segments: list[Segment]
    min_segment_size: int

    def backend(self, node_index: int) -> str:
        return TENSORRT if self.verdicts[node_index] is None else ONNXRUNTIME

    def segment_id(self, segment: Segment) -> str:
        return f"{self.component}.{segment.index}"

    def to_json(self) -> dict[str, Any]:
        nodes = self.model.graph.node
        where = {i: s for s in self.segments for i in s.nodes}
        return {
            "table": TABLE_SOURCE,
            "min_segment_size": self.min_segment_size,
            "segments": [self._segment_json(s) for s in self.segments],
            "nodes": [{"name": n.name or f"#{i}", "op": n.op_type, "backend": self.backend(i),
                       "segment": self.segment_id(where[i]),
                       "kind": None if self.verdicts[i] is None else self.verdicts[i].kind,
                       "reason": self._supported(n) if self.verdicts[i] is None else self.verdicts[i].reason}
                      for i, n in enumerate(nodes)],
        }

    @staticmethod
    def _supported(node: onnx.NodeProto) -> str:
        spec = plugin_of(node)
        return SUPPORTED_REASON if spec is None else f"mmtrt plugin {spec.plugin_id} v{spec.version} (AOT kernel from the bundle)"

    def plugins(self, segment: Segment) -> list[str]:
        """The mmtrt plugins a segment's nodes call, as `mmtrt::Name`, sorted."""
        names = {plugin_of(self.model.graph.node[i]) for i in segment.nodes}
        return sorted(spec.plugin_id for spec in names if spec is not None)

    def _segment_json(self, s: Segment) -> dict[str, Any]:
        ops = Counter(self.model.graph.node[i].op_type for i in s.nodes)
        return {"id": self.segment_id(s), "backend": s.backend, "nodes": len(s.nodes), "ops": dict(sorted(ops.items())),
                "plugins": self.plugins(s),
                "inputs": [self.tensor_json(n) for n in s.inputs], "outputs": [self.tensor_json(n) for n in s.outputs]}

    def tensor_json(self, name: str) -> dict[str, Any]:
        dtype = self.facts.types.get(name)
        return {"name": name, "dtype": None if dtype is None else helper.tensor_dtype_to_np_dtype(dtype).name,
                "shape": self.facts.shapes.get(name)}


def graph_facts(model: onnx.ModelProto) -> GraphFacts:
    """Types and shapes of every tensor (shape inference on a copy without the large weights) and the constants."""
    graph = model.graph
    small = [t for t in graph.initializer if _nbytes(t) < INFERENCE_WEIGHT_LIMIT]
    large = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in graph.initializer
             if _nbytes(t) >= INFERENCE_WEIGHT_LIMIT]
    light = helper.make_model(
        helper.make_graph(graph.node, graph.name, [*graph.input, *large], graph.output, small, value_info=graph.value_info),
        opset_imports=model.opset_import, ir_version=model.ir_version)
    try:
        light = onnx.shape_inference.infer_shapes(light, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        pass  # the exporter's value_info stays; unknown tensors are simply not checked
    types, shapes = {}, {}
    for v in [*light.graph.input, *light.graph.output, *light.graph.value_info]:
        t = v.type.tensor_type
        if t.elem_type:
            types[v.name] = t.elem_type
        if t.HasField("shape"):
            shapes[v.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
    for t in graph.initializer:
        types[t.name], shapes[t.name] = t.data_type, list(t.dims)
    constants = {t.name: t for t in graph.initializer}
    constants.update({n.output[0]: a.t for n in graph.node if n.op_type == "Constant"
                      for a in n.attribute if a.name == "value"})
    return GraphFacts(types, shapes, constants)


def _nbytes(t: onnx.TensorProto) -> int:
    count = 1
    for d in t.dims:
        count *= d
    return count * max(helper.tensor_dtype_to_np_dtype(t.data_type).itemsize, 1)


def place(model: onnx.ModelProto, component: str, targeted: bool, min_segment_size: int) -> Placement:
    """Place every node of `model`; `targeted` is False when the recipe does not offer TensorRT this component."""
    facts = graph_facts(model)
    nodes = model.graph.node
    if targeted:  # an mmtrt plugin node is TensorRT's by construction: fuse_plugins made it from TensorRT nodes
        verdicts = [None if plugin_of(n) else check_node(n, facts) for n in nodes]
    else:
        verdicts = [Verdict("policy", f"partition.{component} does not list tensorrt")] * len(nodes)
    while True:
        segments = schedule(model.graph, [v is None for v in verdicts])
        small = [s for s in segments if s.backend == TENSORRT and segment_size(model.graph, s) < min_segment_size]
        if not small:
            break
        for s in small:
            why = Verdict("segment", f"its TensorRT segment has {segment_size(model.graph, s)} nodes, fewer than "
                                     f"partition.min_segment_size {min_segment_size}")
            for i in s.nodes:
                verdicts[i] = why
    _set_boundaries(model.graph, segments)
    return Placement(component, model, facts, verdicts, segments, min_segment_size)


def segment_size(graph: onnx.GraphProto, segment: Segment) -> int:
    """Nodes that compute: Constant nodes are not counted."""
    return sum(graph.node[i].op_type != "Constant" for i in segment.nodes)


def schedule(graph: onnx.GraphProto, on_tensorrt: list[bool]) -> list[Segment]:
    """Kahn's algorithm that takes ready nodes of the current backend first (lowest index first, so the order is
    deterministic) and switches backend only when none is ready: each run of one backend is a segment."""
    made = {out: i for i, n in enumerate(graph.node) for out in n.output if out}
    deps = [{made[name] for name in node_inputs(n) if name in made} for n in graph.node]
    users: list[list[int]] = [[] for _ in graph.node]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    waiting = [len(d) for d in deps]
    ready = {True: [], False: []}
    for i, count in enumerate(waiting):
        if count == 0:
            heapq.heappush(ready[on_tensorrt[i]], i)
    current = bool(ready[True]) and (not ready[False] or ready[True][0] < ready[False][0])
    segments: list[Segment] = []
    run: list[int] = []
    while ready[True] or ready[False]:
        if not ready[current]:
            segments.append(Segment(len(segments), TENSORRT if current else ONNXRUNTIME, run))
            run, current = [], not current
            continue
        i = heapq.heappop(ready[current])
        run.append(i)
        for j in users[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready[on_tensorrt[j]], j)
    if run:
        segments.append(Segment(len(segments), TENSORRT if current else ONNXRUNTIME, run))
    return segments


def _set_boundaries(graph: onnx.GraphProto, segments: list[Segment]) -> None:
    """Segment inputs: tensors read but made elsewhere (initializers travel with the segment); outputs: tensors
    made here and read by a later segment or by the graph's caller."""
    weights = {t.name for t in graph.initializer}
    owner = {out: s.index for s in segments for i in s.nodes for out in graph.node[i].output if out}
    read_by: dict[str, set[int]] = {}
    for s in segments:
        for i in s.nodes:
            for name in node_inputs(graph.node[i]):
                read_by.setdefault(name, set()).add(s.index)
    graph_inputs = [v.name for v in graph.input]
    graph_outputs = [v.name for v in graph.output]
    for s in segments:
        names = [name for i in s.nodes for name in node_inputs(graph.node[i])]
        inputs = set(n for n in names if n not in weights and owner.get(n) != s.index)
        s.inputs = _graph_order(inputs, graph_inputs, names)
        made = [out for i in s.nodes for out in graph.node[i].output if out]
        outputs = set(n for n in made if n in graph_outputs or read_by.get(n, set()) - {s.index})
        s.outputs = _graph_order(outputs, graph_outputs, made)


def _graph_order(names: set[str], declared: list[str], seen: list[str]) -> list[str]:
    """The graph's declared inputs or outputs in their declared order, then the others as first met."""
    return [n for n in declared if n in names] + list(dict.fromkeys(n for n in seen if n in names and n not in declared))


def annotate(ir, policy: PartitionPolicy) -> None:
    """Record on every ONNX component what placement needs from the recipe, so that passes that work on
    TensorRT segments (cast_precision) see the same segments the compiler will write, and the recipe's backend
    preferences (awq_int4 writes a TensorRT-LLM checkpoint when the LLM's list names tensorrt-llm)."""
    for comp in ir.onnx_components():
        comp.metadata["placement"] = {"targeted": TENSORRT in getattr(policy, comp.name),
                                      "min_segment_size": policy.min_segment_size,
                                      "backends": list(getattr(policy, comp.name))}


def place_component(comp, model: onnx.ModelProto | None = None) -> Placement:
    """Place a component (or `model`, another form of its graph) with the settings `annotate` recorded (TensorRT
    offered, default size when absent)."""
    settings = comp.metadata.get("placement", {"targeted": True, "min_segment_size": DEFAULT_MIN_SEGMENT_SIZE})
    return place(comp.onnx if model is None else model, comp.name, settings["targeted"], settings["min_segment_size"])
