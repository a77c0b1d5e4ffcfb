"""token_prune's dynamic budget (passes/vision/token_prune._select_dynamic) as it reaches the TensorRT segment:

    TopK(scores, tokens) -> values: CumSum < ReduceSum x mass -> Cast -> ReduceSum + 1 -> Min(most) -> Max(least)
                                    = count, read by the graph's image_token_count
                         -> order: Slice(most) -> Where(slot < count, order, slot + tokens) -> TopK(ascending)
                                   -> Min(tokens - 1) -> Unsqueeze -> GatherND(features, batch_dims 1)

whatever criterion made the scores (they stay standard ops and feed the plugin), casts included (cast_precision
lowers the TopK and the comparison, not the sums). The plugin node replaces the GatherND and gives the count too
(int32; a Cast hands the graph its int64). Every tensor inside is read by the chain only, except the count, and
every node is in a TensorRT segment. The fused node counts in fp32 from the fp32 scores whatever cast_precision
chose (the kernel and the decomposition agree), at the mass the graph holds (after cast_precision, its fp16
rounding: 0.7 becomes 0.7001953125).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto

from passes.fusion.graph_view import GraphView, NoMatch, NotCandidate, attribute, check
from passes.fusion.token_select_match import _inner, check_features, score_input


@dataclass
class TokenSelectDynamicMatch:
    anchor: onnx.NodeProto  # the GatherND the plugin node replaces
    count: onnx.NodeProto  # the Max that made the count, which the plugin gives instead
    inputs: list[str]  # scores, features
    attributes: dict  # most, least, mass
    key: str = "token_select_dynamic"


def match_token_select_dynamic(view: GraphView, gather: onnx.NodeProto) -> TokenSelectDynamicMatch:
    unsqueeze = view.made.get(gather.input[1])
    if attribute(gather, "batch_dims", 0) != 1 or unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or \
            getattr(view.made.get(unsqueeze.input[0]), "op_type", None) != "Min":
        raise NotCandidate
    features = gather.input[0]
    unsqueeze = _inner(view, gather.input[1], "Unsqueeze")
    check(_ints(view, unsqueeze.input[1]) == [2], "the indices are not unsqueezed on axis 2")
    clamp = _inner(view, unsqueeze.input[0], "Min")
    ascending = _inner(view, clamp.input[0], "TopK")
    check(attribute(ascending, "largest", 1) == 0 and clamp.input[0] == ascending.output[0],
          "the kept indices are not sorted ascending")
    check(ascending.output[1] not in view.uses, f"{ascending.output[1]} (the sort order) is read elsewhere")
    most = _int(view, ascending.input[1])
    where = _inner(view, ascending.input[0], "Where")
    top = _inner(view, where.input[1], "Slice")
    order = view.producer(top.input[0], "TopK")
    check(view.on_trt(order) and top.input[0] == order.output[1] and attribute(order, "largest", 1) == 1,
          "not the order of a top-k over the scores")
    check(view.uses.get(order.output[1]) == 1, f"{order.output[1]} (the order) is read elsewhere")
    tokens = _int(view, order.input[1])
    check([_ints(view, top.input[i]) for i in (1, 2, 3)] == [[0], [most], [1]], "not the first `most` of the order")
    check(_ints(view, clamp.input[1]) == [tokens - 1], "the padding is not the last patch")
    check(_ints(view, where.input[2]) == list(range(tokens, tokens + most)), "the padding slots are not past the end")
    count = _count(view, where.input[0], most)
    least, mass = _reaching(view, count, order.output[0], most)
    check_features(view, features)
    return TokenSelectDynamicMatch(gather, count, [score_input(view, order.input[0]), features],
                                   {"most": most, "least": least, "mass": mass})


def _count(view: GraphView, mask: str, most: int) -> onnx.NodeProto:
    """slot < count per image: returns the Max that made the count."""
    less = _inner(view, mask, "Less")
    check(_ints(view, less.input[0]) == list(range(most)), "the kept slots are not 0 .. most - 1")
    column = _inner(view, less.input[1], "Unsqueeze")
    check(_ints(view, column.input[1]) == [1], "the count is not unsqueezed on axis 1")
    count = view.producer(column.input[0], "Max")
    check(view.on_trt(count), f"{count.name} (Max) runs on ONNX Runtime")
    return count


def _reaching(view: GraphView, count: onnx.NodeProto, values: str, most: int) -> tuple[int, float]:
    """Max(Min(ReduceSum(CumSum(values) < ReduceSum(values) x mass) + 1, most), least): returns (least, mass)."""
    capped = _inner(view, count.input[0], "Min")
    check(_int(view, capped.input[1]) == most, "the count is not capped at the block's size")
    plus = _inner(view, capped.input[0], "Add")
    check(_int(view, plus.input[1]) == 1, "the count is not the shortfall plus one")
    shortfall = _inner(view, plus.input[0], "ReduceSum")
    check(_ints(view, shortfall.input[1]) == [1] and attribute(shortfall, "keepdims", 1) == 0, "not a count per image")
    cast = _inner(view, shortfall.input[0], "Cast")
    check(attribute(cast, "to") == TensorProto.INT64, "the shortfall is not counted in int64")
    less = _inner(view, cast.input[0], "Less")
    reached = _inner(view, less.input[0], "CumSum", skip_casts=True)
    target = _inner(view, less.input[1], "Mul", skip_casts=True)
    total = _inner(view, target.input[0], "ReduceSum", skip_casts=True)
    for node in (reached, target, total):
        view.single_use(node.output[0])
    check(_uncast(view, reached.input[0]) == values and _uncast(view, total.input[0]) == values and
          _readers(view, values) == {reached.output[0], total.output[0]}, "the sums are not of the top-k values alone")
    check(_int(view, reached.input[1]) == 1 and not attribute(reached, "exclusive", 0) and
          not attribute(reached, "reverse", 0), "not a running sum over the tokens")
    check(_ints(view, total.input[1]) == [1] and attribute(total, "keepdims", 1) == 1, "not a total per image")
    mass = view.const(target.input[1])
    check(mass.size == 1 and mass.dtype.kind == "f", "the mass is not one float constant")
    return _int(view, count.input[1]), float(mass.reshape(-1)[0])


def _uncast(view: GraphView, name: str) -> str:
    """The tensor a chain of Casts (cast_precision's) starts from."""
    while (node := view.made.get(name)) is not None and node.op_type == "Cast":
        name = node.input[0]
    return name


def _readers(view: GraphView, name: str) -> set[str]:
    """First outputs of the nodes that read `name`, directly or through Casts (a graph output reads as itself)."""
    names, readers = {name}, set()
    for node in view.graph.node:  # in topological order: a Cast comes before its readers
        if names.intersection(node.input):
            if node.op_type == "Cast":
                names.update(node.output)
            else:
                readers.add(node.output[0])
    return readers | (names & {o.name for o in view.graph.output})


def _ints(view: GraphView, name: str) -> list[int]:
    return view.const(name).reshape(-1).astype(np.int64).tolist()


def _int(view: GraphView, name: str) -> int:
    values = _ints(view, name)
    if len(values) != 1:
        raise NoMatch(f"{name} is not one integer")
    return values[0]
