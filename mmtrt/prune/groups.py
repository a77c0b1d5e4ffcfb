"""Dependency groups for structured pruning: everything that must shrink together when one channel or head goes.

A group is one layer's MLP (hidden channels) or attention (heads; with grouped-query attention one unit is a
whole KV group: its K and V head and the query heads that share them). Its members are the initializers sliced
in blocks along one axis (the producing linears' output columns and their biases, the consuming linear's input
rows, per-channel constants between them); its shape edits are the Reshape/Expand shape entries that count the
units (an entry of -1 is inferred and needs none). Found from the structure `mmtrt.quant.linears` names, so
the exporter's anonymous weight names do not matter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from mmtrt.errors import UserError
from mmtrt.ir.rewrite import const_value
from mmtrt.quant.linears import GraphIndex, Group, Linear, find_linears, reachable

ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div"})
PASS_THROUGH = frozenset({"Gelu", "Sigmoid", "Relu", "Tanh", "Erf", "Mul", "Add", "Sub", "Div", "Identity", "Cast",
                          "FastGelu", "QuickGelu", "Softplus", "HardSigmoid", "HardSwish", "Silu", "Swish"})


@dataclass
class Member:
    """Input `slot` of `node`, an initializer, loses whole blocks of `width` entries along `axis`, one per unit.
    Held per use, not per name: the exporter shares equal initializers between layers."""

    node: onnx.NodeProto
    slot: int
    axis: int
    width: int

    @property
    def name(self) -> str:
        return self.node.input[self.slot]


@dataclass
class ShapeEdit:
    """Entry `position` of the shape (input 1, `rank` entries) of `node` counts `per_unit` per kept unit."""

    node: onnx.NodeProto
    position: int
    per_unit: int
    rank: int


@dataclass
class PruneGroup:
    component: str
    kind: str  # "mlp" | "heads"
    layer: int
    units: int
    members: list[Member]
    activation: str  # tensor whose last axis holds `activation_width` entries per unit (the consumer's input)
    activation_width: int
    shape_edits: list[ShapeEdit] = field(default_factory=list)
    queries_per_unit: int = 1
    cache: list[str] = field(default_factory=list)  # the layer's past/present graph inputs and outputs

    @property
    def consumer(self) -> Member:
        """The linear reading the group's activations: its weight's rows are always the last member."""
        return self.members[-1]

    @property
    def label(self) -> str:
        return f"{self.component}.layers.{self.layer}.{'mlp' if self.kind == 'mlp' else 'attention'}"


def find_groups(model: onnx.ModelProto, component: str) -> list[PruneGroup]:
    """The MLP and attention groups of every named layer of `model`, in layer order."""
    index, _, groups = find_linears(model, component)
    found = []
    for group in groups:
        roles = [lin.role for lin in group.linears]
        if roles and all(r in ("q_proj", "k_proj", "v_proj") for r in roles) and group.downstream is not None:
            found.append(_attention(index, component, group))
        elif group.downstream is not None and group.downstream.role in ("down_proj", "fc2"):
            found.append(_mlp(index, component, group))
    return sorted(found, key=lambda g: (g.layer, g.kind != "heads"))


def _mlp(index: GraphIndex, component: str, group: Group) -> PruneGroup:
    n = group.linears[0].n
    members = [Member(lin.node, 1, 1, 1) for lin in group.linears]
    weights = {lin.weight for lin in group.linears} | {group.downstream.weight}
    for node in group.region:
        if node is group.downstream.node or any(node is lin.node for lin in group.linears):
            continue
        if node.op_type not in PASS_THROUGH:
            raise UserError(f"channel_prune cannot prune {component} layer {group.downstream.layer}'s MLP: a "
                            f"{node.op_type} sits between its linears; set its mlp ratio to 0")
        members += [Member(node, slot, -1, 1) for slot in _channel_constants(index, node, weights, n, component)]
    members.append(Member(group.downstream.node, 1, 0, 1))
    return PruneGroup(component, "mlp", group.downstream.layer, n, members, group.downstream.input, 1)


def _channel_constants(index: GraphIndex, node: onnx.NodeProto, skip: set[str], n: int, component: str) -> list[int]:
    """Slots of the constant inputs of an elementwise node between the MLP's linears: per-channel ones (last axis
    n) are sliced with the channels, scalars stay; anything else would not broadcast after pruning."""
    slots = []
    for slot, name in enumerate(node.input):
        if name in skip or name not in index.initializers:
            continue
        dims = list(index.initializers[name].dims)
        if dims and dims[-1] == n and node.op_type in ELEMENTWISE:
            slots.append(slot)
        elif int(np.prod(dims, dtype=np.int64)) != 1:
            raise UserError(f"channel_prune cannot prune {component}'s MLP: constant {name} of shape {dims} is "
                            f"neither per channel nor a scalar")
    return slots


def _attention(index: GraphIndex, component: str, group: Group) -> PruneGroup:
    by_role = {lin.role: lin for lin in group.linears}
    q, k, v, o = by_role["q_proj"], by_role["k_proj"], by_role["v_proj"], group.downstream
    head_dim = _head_dim(index, group)
    if q.n % head_dim or k.n % head_dim or k.n != v.n:
        raise UserError(f"channel_prune cannot read {component} layer {o.layer}'s head layout "
                        f"(q {q.n}, k {k.n}, v {v.n} columns, head size {head_dim})")
    heads, kv_heads = q.n // head_dim, k.n // head_dim
    rep = heads // kv_heads
    members = []
    for lin, width in ((q, rep * head_dim), (k, head_dim), (v, head_dim)):
        members.append(Member(lin.node, 1, 1, width))
        members += [Member(node, slot, 0, width) for node, slot in bias_of(index, lin)]
    members.append(Member(o.node, 1, 0, rep * head_dim))
    edits = _head_shape_edits(index, group, q, rep, head_dim, component)
    return PruneGroup(component, "heads", o.layer, kv_heads, members, o.input, rep * head_dim, edits, rep,
                      _cache_io(index, group))


def _cache_io(index: GraphIndex, group: Group) -> list[str]:
    """Graph inputs the attention concatenates new keys or values to, and the concatenations that are outputs."""
    inputs = {v.name for v in index.graph.input}
    names = []
    for node in group.region:
        if node.op_type == "Concat" and any(n in inputs for n in node.input):
            names += [n for n in node.input if n in inputs] + [o for o in node.output if o in index.outputs]
    return names


def _head_dim(index: GraphIndex, group: Group) -> int:
    attention = next(n for n in group.region if n.op_type == "Attention")
    scale = next((a.f for a in attention.attribute if a.name == "scale"), None)
    for node in group.region:  # the split reshape [batch, seq, heads, head_dim] ends in the head size
        if node.op_type == "Reshape":
            shape = shape_entries(index, node)
            if shape is not None and len(shape) == 4 and shape[3] is not None and shape[3] > 0:
                return int(shape[3])
    if scale:
        return round(scale ** -2)
    raise UserError("channel_prune cannot find the attention head size")


def bias_of(index: GraphIndex, lin: Linear) -> list[tuple[onnx.NodeProto, int]]:
    """The (Add node, slot) adding a bias of the linear's width to its output, if any."""
    for node in index.consumers.get(lin.output, []):
        if node.op_type == "Add" and len(node.input) == 2:
            slot = 1 - list(node.input).index(lin.output)
            bias = index.initializers.get(node.input[slot])
            if bias is not None and list(bias.dims) == [lin.n]:
                return [(node, slot)]
    return []


def _head_shape_edits(index: GraphIndex, group: Group, q: Linear, rep: int, head_dim: int,
                      component: str) -> list[ShapeEdit]:
    """Reshape/Expand entries counting heads: the split [b, s, H, d] of q (H = rep per unit) and of k, v (1 per
    unit), the grouped-query repeat Expand [b, kv, rep, t, d] (1) and its Reshape [b, H, t, d] (rep), and the merge
    [b, s, H*d] after Attention (rep * d)."""
    from_q = _derived(index, q.output, group)
    attention = next(n for n in group.region if n.op_type == "Attention")
    after = _derived(index, attention.output[0], group)
    edits = []
    for node in group.region:
        if node.op_type not in ("Reshape", "Expand"):
            continue
        producer = index.producer.get(node.input[0])
        if node.input[0] in after:
            edits.append(ShapeEdit(node, 2, rep * head_dim, 3))
        elif node.op_type == "Expand":
            edits.append(ShapeEdit(node, 1, 1, 5))
        elif producer is not None and producer.op_type == "Expand":
            edits.append(ShapeEdit(node, 1, rep, 4))
        else:
            edits.append(ShapeEdit(node, 2, rep if node.input[0] in from_q else 1, 4))
    for edit in edits:
        entries = shape_entries(index, edit.node)
        if entries is None or len(entries) != edit.rank:
            raise UserError(f"channel_prune cannot read the shape of {edit.node.op_type} {edit.node.name} in "
                            f"{component}'s attention; set its heads ratio to 0")
    return edits


def _derived(index: GraphIndex, start: str, group: Group) -> set[str]:
    """Tensors made from `start` inside the group's region, up to (not through) its Attention."""
    inside = {id(n) for n in group.region}
    return reachable(index, [start], lambda node: id(node) in inside and node.op_type != "Attention")


def shape_entries(index: GraphIndex, node: onnx.NodeProto) -> list[int | None] | None:
    """Entries of a shape input: a constant, or a Concat of one-entry pieces (None where a piece is computed)."""
    name = node.input[1]
    value = const_value(index.graph, name) if name in index.initializers else None
    if value is not None:
        return [int(x) for x in value.reshape(-1)]
    concat = index.producer.get(name)
    if concat is None or concat.op_type != "Concat":
        return None
    entries = []
    for piece in concat.input:
        if piece in index.initializers:
            arr = const_value(index.graph, piece).reshape(-1)
            if arr.size != 1:
                return None
            entries.append(int(arr[0]))
        else:
            entries.append(None)  # computed pieces are one entry each: dims read through Shape/Gather
    return entries
