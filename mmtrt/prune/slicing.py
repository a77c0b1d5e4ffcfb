"""Apply a pruning decision to a graph: slice the members, rewrite the shape entries, shrink the cache I/O.

Every sliced initializer and every changed shape gets a new tensor of its own (the exporter shares equal tensors
between layers, and a shared shape constant may serve a layer that keeps more units); the originals are dropped
by the cleanup when nothing reads them any more.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mmtrt.errors import UserError
from mmtrt.ir.rewrite import cleanup, const_value
from mmtrt.prune.groups import PruneGroup, ShapeEdit, bias_of, shape_entries
from mmtrt.quant.linears import GraphIndex, Linear


def prune_graph(model: onnx.ModelProto, groups: list[PruneGroup], kept: dict[str, np.ndarray],
                means: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """`model` with each group reduced to the units in `kept[group.label]` (sorted indices); groups whose every
    unit is kept are left untouched. With `means` (per label, the calibration mean of every activation entry),
    the consuming linear's output gets the removed entries' mean contribution as a bias (FLAP's compensation)."""
    if all(len(kept[g.label]) == g.units for g in groups):
        return model
    index = GraphIndex(model.graph)
    new_inits: list[onnx.TensorProto] = []
    new_nodes: list[onnx.NodeProto] = []
    for group in groups:
        keep = kept[group.label]
        if len(keep) == group.units:
            continue
        tag = f"channel_prune.{group.label}"
        if means is not None:
            _compensate(index, group, keep, means[group.label], tag, new_inits, new_nodes)
        _slice_members(index, group, keep, tag, new_inits)
        for i, edit in enumerate(group.shape_edits):
            _edit_shape(index, edit, group, len(keep), f"{tag}.shape{i}", new_inits, new_nodes)
        if group.kind == "heads":
            _shrink_cache_io(model, group, len(keep))
    model.graph.initializer.extend(new_inits)
    model.graph.node.extend(new_nodes)
    del model.graph.value_info[:]
    return cleanup(model)


def _slice_members(index: GraphIndex, group: PruneGroup, keep: np.ndarray, tag: str, new_inits: list) -> None:
    for i, member in enumerate(group.members):
        array = numpy_helper.to_array(index.initializers[member.name])
        sliced = np.take(array, _entries(keep, member.width), axis=member.axis)
        new_inits.append(numpy_helper.from_array(np.ascontiguousarray(sliced), f"{tag}.{i}"))
        member.node.input[member.slot] = f"{tag}.{i}"


def _compensate(index: GraphIndex, group: PruneGroup, keep: np.ndarray, mean: np.ndarray, tag: str,
                new_inits: list, new_nodes: list) -> None:
    """Add sum over removed entries j of mean_j * W[j, :] to the consumer's bias (a new Add when it has none)."""
    consumer = group.consumer.node
    weight = numpy_helper.to_array(index.initializers[group.consumer.name])
    dropped = _entries(np.setdiff1d(np.arange(group.units), keep), group.activation_width)
    delta = mean[dropped] @ weight[dropped].astype(np.float64)
    linear = Linear(consumer, consumer.input[1], *weight.shape)
    found = bias_of(index, linear)
    if found:
        node, slot = found[0]
        bias = numpy_helper.to_array(index.initializers[node.input[slot]])
        new_inits.append(numpy_helper.from_array((bias + delta).astype(bias.dtype), f"{tag}.bias"))
        node.input[slot] = f"{tag}.bias"
        return
    out = consumer.output[0]
    consumer.output[0] = f"{tag}.uncompensated"
    new_inits.append(numpy_helper.from_array(delta.astype(weight.dtype), f"{tag}.bias"))
    new_nodes.append(helper.make_node("Add", [consumer.output[0], f"{tag}.bias"], [out], name=f"{tag}.compensation"))


def _entries(units: np.ndarray, width: int) -> np.ndarray:
    return (np.asarray(units)[:, None] * width + np.arange(width)[None, :]).reshape(-1)


def _edit_shape(index: GraphIndex, edit: ShapeEdit, group: PruneGroup, kept: int, name: str,
                new_inits: list, new_nodes: list) -> None:
    entries = shape_entries(index, edit.node)
    old = entries[edit.position]
    if old == -1:
        return
    if old != group.units * edit.per_unit:
        raise UserError(f"channel_prune: {edit.node.op_type} {edit.node.name} in {group.label} has {old} at "
                        f"position {edit.position}, expected {group.units * edit.per_unit}; set its heads ratio to 0")
    value = kept * edit.per_unit
    shape_name = edit.node.input[1]
    if shape_name in index.initializers:
        shape = const_value(index.graph, shape_name).copy()
        shape[edit.position] = value
        new_inits.append(numpy_helper.from_array(shape, name))
    else:
        concat = index.producer[shape_name]
        pieces = list(concat.input)
        new_inits.append(numpy_helper.from_array(np.array([value], np.int64), f"{name}.entry"))
        pieces[edit.position] = f"{name}.entry"
        new_nodes.append(helper.make_node("Concat", pieces, [name], name=name, axis=0))
    edit.node.input[1] = name


def _shrink_cache_io(model: onnx.ModelProto, group: PruneGroup, kept: int) -> None:
    """The layer's past/present key and value tensors [batch, kv_heads, time, head_dim] lose the pruned heads."""
    for value in [*model.graph.input, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if value.name in group.cache and len(dims) == 4 and dims[1].dim_value == group.units:
            dims[1].dim_value = kept
