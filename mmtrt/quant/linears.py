"""The linear layers of an exported graph, grouped the way AWQ scales them.

A linear is a MatMul whose second input is a 2-D float initializer `[K, N]` (the exporter stores `W` transposed).
Linears that read the same tensor form a group and share one per-input-channel scale. For each group this module
finds what AWQ needs from the graph alone: the module the group feeds (attention or MLP: the group's paths meet
in one downstream linear before any residual add or normalisation), what can absorb the inverse scale (the
normalisation or the linear that made the input), and a name for every linear (`llm.layers.3.q_proj`), derived
from the structure because the exporter's weight names are anonymous (`val_57`) and deduplicated.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

import onnx
from onnx import TensorProto

from mmtrt.ir.logits import is_logits_slice

NORMS = frozenset({"RMSNormalization", "LayerNormalization", "SimplifiedLayerNormalization",
                   "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "GroupNormalization"})
JOINS = frozenset({"Add", "Sub", "Sum"})
FLOATS = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16})
QKV = ("q_proj", "k_proj", "v_proj")
ATTENTION = frozenset({"Attention", "GroupQueryAttention"})


@dataclass
class Linear:
    node: onnx.NodeProto
    weight: str
    k: int
    n: int
    name: str = ""
    role: str | None = None
    layer: int | None = None

    @property
    def input(self) -> str:
        return self.node.input[0]

    @property
    def output(self) -> str:
        return self.node.output[0]


@dataclass
class Group:
    """Linears reading one tensor. `module_output`: the output of the one linear the group's paths meet in (the
    module the AWQ loss is measured at), None when the group feeds the residual stream (loss at its own outputs).
    `absorber`: ("norm", node) or ("linear", Linear) that can fold the inverse scale, None when nothing can."""

    linears: list[Linear]
    module_output: str | None = None
    downstream: Linear | None = None
    absorber: tuple[str, object] | None = None
    region: list[onnx.NodeProto] = field(default_factory=list)

    @property
    def input(self) -> str:
        return self.linears[0].input

    @property
    def name(self) -> str:
        first, rest = self.linears[0].name, [lin.name.rsplit(".", 1)[-1] for lin in self.linears[1:]]
        return "+".join([first, *rest])


class GraphIndex:
    """Producers, consumers and constants of a graph, computed once."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.nodes = list(graph.node)
        self.initializers = {t.name: t for t in graph.initializer}
        self.producer = {out: node for node in self.nodes for out in node.output if out}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in self.nodes:
            for name in dict.fromkeys(node.input):
                if name:
                    self.consumers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in graph.output}
        self.position = {id(node): i for i, node in enumerate(self.nodes)}
        self.constants = set(self.initializers)
        for node in self.nodes:
            if all(not name or name in self.constants for name in node.input):
                self.constants.update(node.output)

    def is_weight(self, name: str) -> bool:
        t = self.initializers.get(name)
        return t is not None and len(t.dims) == 2 and t.data_type in FLOATS


def find_linears(model: onnx.ModelProto, component: str) -> tuple[GraphIndex, list[Linear], list[Group]]:
    """Every linear of `model`, named, and their groups in graph order."""
    index = GraphIndex(model.graph)
    linears = [Linear(node, node.input[1], *index.initializers[node.input[1]].dims)
               for node in index.nodes if node.op_type == "MatMul" and index.is_weight(node.input[1])
               and node.input[0] not in index.constants]
    by_node = {id(lin.node): lin for lin in linears}
    groups: dict[str, Group] = {}
    for lin in linears:
        groups.setdefault(lin.input, Group([])).linears.append(lin)
    for group in groups.values():
        _find_module(index, by_node, group)
        group.absorber = _absorber(index, by_node, group)
    _name(index, component, linears, list(groups.values()))
    return index, linears, list(groups.values())


def _find_module(index: GraphIndex, by_node: dict, group: Group) -> None:
    """Walk forward from the group's outputs through everything but linears, normalisations and residual joins
    (an Add with an input that neither derives from the group nor is constant). When every path ends in the same
    linear, that linear's output is the module output and the nodes on the way are the module's region."""
    derived = _forward(index, by_node, [lin.output for lin in group.linears])
    reached, stopped, visited, visited_ids = set(), False, [], set()
    seen = {lin.output for lin in group.linears}
    queue = deque(seen)
    while queue:
        for node in index.consumers.get(queue.popleft(), []):
            if id(node) in by_node:
                reached.add(id(node))
                continue
            if node.op_type in NORMS or _joins_outside(index, node, derived):
                stopped = True
                continue
            if id(node) in visited_ids or not _carries_values(node):
                continue
            visited.append(node)
            visited_ids.add(id(node))
            for out in node.output:
                if out and out not in seen:
                    seen.add(out)
                    queue.append(out)
    if stopped or len(reached) != 1:
        return
    downstream = by_node[reached.pop()]
    group.downstream, group.module_output = downstream, downstream.output
    group.region = _region(index, [lin.node for lin in group.linears] + visited + [downstream.node], downstream.output)


def reachable(index: GraphIndex, starts: Iterable[str], through: Callable[[onnx.NodeProto], bool]) -> set[str]:
    """Tensors reachable from `starts` (included) through the nodes `through` accepts."""
    seen, queue = set(starts), deque(starts)
    while queue:
        for node in index.consumers.get(queue.popleft(), []):
            if through(node):
                for out in node.output:
                    if out and out not in seen:
                        seen.add(out)
                        queue.append(out)
    return seen


def _forward(index: GraphIndex, by_node: dict, starts: Iterable[str]) -> set[str]:
    """Tensors reachable from `starts` without passing through a linear, a normalisation or a Shape."""
    return reachable(index, starts, lambda node: id(node) not in by_node and node.op_type not in NORMS
                     and _carries_values(node))


def _carries_values(node: onnx.NodeProto) -> bool:
    """A Shape's output holds no value of its input (kv_layout sizes every layer's cache from layer 0's key)."""
    return node.op_type != "Shape"


def _joins_outside(index: GraphIndex, node: onnx.NodeProto, derived: set[str]) -> bool:
    return node.op_type in JOINS and any(n and n not in derived and n not in index.constants for n in node.input)


def _region(index: GraphIndex, candidates: list[onnx.NodeProto], output: str) -> list[onnx.NodeProto]:
    """The candidates `output` depends on, in graph order (constant-only producers included)."""
    allowed = {id(n) for n in candidates}
    keep, needed = {}, deque([output])
    seen = {output}
    while needed:
        node = index.producer.get(needed.popleft())
        if node is None or id(node) in keep or (id(node) not in allowed and node.output[0] not in index.constants):
            continue
        keep[id(node)] = node
        for name in node.input:
            if name and name not in seen and name not in index.initializers:
                seen.add(name)
                needed.append(name)
    return sorted(keep.values(), key=lambda n: index.position[id(n)])


def _absorber(index: GraphIndex, by_node: dict, group: Group) -> tuple[str, object] | None:
    """What can take 1/s: the normalisation that made the input (scale folds into its weight and bias) or, through
    an elementwise Mul, the linear whose output is one factor (1/s folds into that linear's output channels).
    Either only when the group's linears are the input's only readers."""
    readers = index.consumers.get(group.input, [])
    if {id(n) for n in readers} != {id(lin.node) for lin in group.linears} or group.input in index.outputs:
        return None
    node = index.producer.get(group.input)
    if is_logits_slice(node) and len(index.consumers.get(node.input[0], [])) == 1 and node.input[0] not in index.outputs:
        node = index.producer.get(node.input[0])  # the lm_head reads the final norm's rows from logits_from on
    if node is None:
        return None
    if node.op_type in ("RMSNormalization", "LayerNormalization") and all(
            name in index.initializers for name in node.input[1:] if name):
        return ("norm", node)
    if node.op_type == "Mul":
        for name in node.input:
            maker = index.producer.get(name)
            if maker is not None and id(maker) in by_node and len(index.consumers.get(name, [])) == 1 \
                    and name not in index.outputs:
                return ("linear", by_node[id(maker)])
    return None


def _attention_slots(index: GraphIndex, by_node: dict, linear: Linear) -> set[int]:
    """Which inputs (0 query, 1 key, 2 value) of an attention node (ONNX's, or the static KV layout's
    GroupQueryAttention) the linear's output reaches."""
    seen = reachable(index, [linear.output], lambda node: node.op_type not in ATTENTION and _carries_values(node)
                     and id(node) not in by_node and node.op_type not in NORMS)
    return {i for name in seen for node in index.consumers.get(name, []) if node.op_type in ATTENTION
            for i, n in enumerate(node.input) if n == name}


def _name(index: GraphIndex, component: str, linears: list[Linear], groups: list[Group]) -> None:
    """Roles from structure: three linears reaching an Attention's query, key and value are q/k/v of a new layer
    and the linear they meet in is o_proj; a group of two that meets in one linear through the elementwise
    product is gate/up with down_proj; a single linear that meets another through an activation is fc1/fc2;
    the LLM's linear that writes `logits` is lm_head. Anything else keeps `<component>.linear.<i>`."""
    by_node = {id(lin.node): lin for lin in linears}
    layer, has_mlp = -1, True
    for group in sorted(groups, key=lambda g: index.position[id(g.linears[0].node)]):
        lins = group.linears
        if len(lins) == 3 and group.downstream is not None:
            slots = [_attention_slots(index, by_node, lin) for lin in lins]
            if sorted(map(tuple, slots)) == [(0,), (1,), (2,)]:
                layer, has_mlp = layer + 1, False
                for lin, slot in zip(lins, slots):
                    lin.role, lin.layer = QKV[slot.pop()], layer
                group.downstream.role, group.downstream.layer = "o_proj", layer
                continue
        if group.downstream is None or has_mlp or layer < 0 or group.downstream.role is not None:
            continue
        down_input = index.producer.get(group.downstream.input)
        if len(lins) == 2 and down_input is not None and down_input.op_type == "Mul":
            up = [lin for lin in lins if lin.output in down_input.input]
            if len(up) == 1:
                up[0].role = "up_proj"
                next(lin for lin in lins if lin is not up[0]).role = "gate_proj"
                group.downstream.role = "down_proj"
        elif len(lins) == 1:
            lins[0].role, group.downstream.role = "fc1", "fc2"
        if lins[0].role is not None:
            has_mlp = True
            for lin in [*lins, group.downstream]:
                lin.layer = layer
    for i, lin in enumerate(linears):
        if component == "llm" and lin.output == "logits":
            lin.role = "lm_head"
        if lin.role == "lm_head":
            lin.name = f"{component}.lm_head"
        elif lin.role is not None:
            lin.name = f"{component}.layers.{lin.layer}.{lin.role}"
        else:
            lin.name = f"{component}.linear.{i}"


def region_inputs(index: GraphIndex, group: Group) -> list[str]:
    """Tensors the module region reads that it does not make: the group input first, then side inputs (rotary
    tables, masks, shapes, past caches). Initializers other than the group's weights stay inside the region."""
    made = {out for node in group.region for out in node.output}
    weights = {lin.weight for lin in group.linears}
    names = [group.input]
    for node in group.region:
        for name in node.input:
            if name and name not in made and name not in names and (name not in index.initializers or name in weights):
                names.append(name)
    return [n for n in names if n not in weights]
