"""token_prune's cls_attention selection with `merge: contextual` (VisionZip), anchored at its final Concat:

    Concat(GatherND(features, dominant patches), target rows + mean of the rows that joined each target)

The dominant branch is walked like TokenSelect's (TopK over all patches, the first `dominant` sorted); the merge
branch is taken as the closed set of nodes between the Concat and q, k, features: every tensor in it is read only
inside it, every node is on TensorRT, its op types are those token_prune's own builder writes for this budget
(casts aside), and its target positions are `contextual_targets(dropped, contextual)`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import onnx
from onnx import helper

from passes.fusion.graph_view import GraphView, NoMatch, NotCandidate, attribute, check
from passes.fusion.token_select_match import _inner, scores_source
from passes.vision import token_criteria as tc
from passes.vision import token_prune as tp

IGNORED = {"Cast", "Constant", "Identity"}


@dataclass
class TokenSelectMergeMatch:
    anchor: onnx.NodeProto  # the Concat the plugin node replaces
    inputs: list[str]  # q, k, features
    target_at: np.ndarray
    merged_at: np.ndarray
    attributes: dict
    claimed: set[str]  # first outputs of the nodes the plugin replaces


def match_token_select_merge(view: GraphView, concat: onnx.NodeProto) -> TokenSelectMergeMatch:
    if attribute(concat, "axis", 0) != 1 or len(concat.input) != 2:
        raise NotCandidate
    try:
        first = view.producer(concat.input[0], "GatherND", skip_casts=True)  # cast_precision may cast the rows
    except NoMatch:
        raise NotCandidate from None
    features = first.input[0]
    unsqueeze = _inner(view, first.input[1], "Unsqueeze")
    ascending = _inner(view, unsqueeze.input[0], "TopK")
    dominant_slice = _inner(view, ascending.input[0], "Slice")
    top = view.producer(dominant_slice.input[0], "TopK")
    check(attribute(top, "largest", 1) == 1 and dominant_slice.input[0] == top.output[1], "not the order of a top-k")
    dominant = int(view.const(dominant_slice.input[2]).reshape(-1)[0])
    tokens = int(view.const(top.input[1]).reshape(-1)[0])
    q, k, attributes = scores_source(view, top.input[0], features)
    members = _closed_set(view, concat, {q, k, features})
    gathers = [view.made[n] for n in members if view.made[n].op_type == "Gather"]
    positions = sorted((view.const(g.input[1]) for g in gathers), key=len)
    check(len(positions) == 2, "not the two position gathers of the merge")
    target_at, merged_at = positions if positions[0][0] == 0 else positions[::-1]
    contextual = len(target_at)
    expect = tp.contextual_targets(tokens - dominant, contextual)
    check(all(np.array_equal(a, b) for a, b in zip((target_at, merged_at), expect)),
          "the target positions are not VisionZip's (token_prune's contextual_targets)")
    check(_ops(view, members) == _expected_ops(tokens, dominant + contextual, contextual, attributes["cls"]),
          "the merge branch is not token_prune's")
    return TokenSelectMergeMatch(concat, [q, k, features], target_at, merged_at,
                                 {"keep": dominant + contextual, "contextual": contextual, **attributes}, members)


def _closed_set(view: GraphView, anchor: onnx.NodeProto, sources: set[str]) -> set[str]:
    """Outputs of the nodes the anchor depends on back to `sources`, each read only by members or the anchor."""
    members, todo = set(), list(anchor.input)
    while todo:
        name = todo.pop()
        if name in sources or name in members or name in view.weights or name not in view.made:
            continue
        node = view.made[name]
        check(view.on_trt(node) or node.op_type == "Constant", f"{node.name} ({node.op_type}) runs on ONNX Runtime")
        members.update(o for o in node.output if o)
        todo += list(node.input)
    for node in view.graph.node:
        if node.output and node.output[0] not in members and node.output[0] != anchor.output[0]:
            for name in node.input:
                if name in members:
                    raise NoMatch(f"{name} is read by {node.name}, outside the selection")
    check(not members & {o.name for o in view.graph.output}, "a tensor of the selection is a graph output")
    return {view.made[m].output[0] for m in members}


def _ops(view: GraphView, members: set[str]) -> Counter:
    return Counter(view.made[m].op_type for m in members if view.made[m].op_type not in IGNORED) + Counter(["Concat"])


def _expected_ops(tokens: int, kept: int, contextual: int, cls: int) -> Counter:
    """The op types token_prune's builder writes for this budget (method cls_attention, merge contextual)."""
    kv = tokens + cls
    inputs = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 1, kv, 1]) for n in ("q", "k")]
    graph = helper.make_graph([], "scratch", inputs + [helper.make_tensor_value_info("f", onnx.TensorProto.FLOAT, [1, tokens, 1])], [])
    b = tc.Builder(graph)
    attention = helper.make_node("Attention", ["q", "k", "k"], ["a"], scale=1.0)
    facts = SimpleNamespace(shape=lambda name: [1, 1, kv, 1], types={})
    budget = tp.Budget(tokens, kept, contextual, 0, cls, True)
    tp._select(b, "f", tc.cls_attention(b, attention, facts, budget.tokens, budget.cls), tp._unit_keys(b, attention, budget), budget)
    return Counter(n.op_type for n in graph.node if n.op_type not in IGNORED)
