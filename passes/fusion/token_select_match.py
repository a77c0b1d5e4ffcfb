"""token_prune's fixed selection (merge: none) as it reaches the TensorRT segment, casts included:

    Cast(q) -> Slice(query 0) -> MatMul <- Transpose <- Cast(k);  Mul(scale) -> Softmax -> ReduceMean(heads, query)
    -> Slice(patches) -> TopK(keep) -> TopK(ascending) -> Unsqueeze -> GatherND(features, batch_dims 1)

[CLS] attention scores (from q and k) make it a TokenSelect, which scores too; any other score (norm, random,
attention_entropy, saliency, a masked [CLS] attention) stays standard ops and feeds a TokenSelectScored. Every
tensor inside is read by the chain only, and every node is in a TensorRT segment. The fused node ranks fp32 scores
even where cast_precision lowered them to fp16 before TopK (the kernel and the decomposition agree).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto

from mmtrt.kernels.catalog import KERNEL_SUFFIX
from passes.fusion.graph_view import GraphView, NoMatch, NotCandidate, attribute, check


@dataclass
class TokenSelectMatch:
    anchor: onnx.NodeProto  # the GatherND the plugin node replaces
    inputs: list[str]  # q, k, features; or scores, features
    attributes: dict
    key: str = "token_select"  # the catalog's plugin


def match_token_select(view: GraphView, gather: onnx.NodeProto) -> TokenSelectMatch:
    made = view.made.get(gather.input[1])
    if attribute(gather, "batch_dims", 0) != 1 or made is None or made.op_type != "Unsqueeze":
        raise NotCandidate
    features = gather.input[0]
    unsqueeze = _inner(view, gather.input[1], "Unsqueeze")
    check(view.const(unsqueeze.input[1]).tolist() == [2], "the indices are not unsqueezed on axis 2")
    if getattr(view.made.get(unsqueeze.input[0]), "op_type", None) == "Min":
        raise NotCandidate  # a dynamic budget's block (token_select_dynamic_match)
    ascending = _inner(view, unsqueeze.input[0], "TopK")
    check(attribute(ascending, "largest", 1) == 0 and unsqueeze.input[0] == ascending.output[0],
          "the kept indices are not sorted ascending")
    check(ascending.output[1] not in view.uses, f"{ascending.output[1]} (the sort order) is read elsewhere")
    top = _inner(view, ascending.input[0], "TopK")
    check(ascending.input[0] == top.output[1] and attribute(top, "largest", 1) == 1, "not the indices of a top-k")
    keep = int(view.const(top.input[1]).reshape(-1)[0])
    check(int(view.const(ascending.input[1]).reshape(-1)[0]) == keep, "the two TopK keep different counts")
    check(top.output[0] not in view.uses, f"{top.output[0]} (the top scores) is read elsewhere")
    check_features(view, features)
    try:
        q, k, attributes = scores_source(view, top.input[0], features)
    except NoMatch:
        return TokenSelectMatch(gather, [score_input(view, top.input[0]), features], {"keep": keep},
                                "token_select_scored")
    return TokenSelectMatch(gather, [q, k, features], {"keep": keep, **attributes})


def score_input(view: GraphView, scores: str) -> str:
    """The fp32 scores a TopK ranks: its input, or the fp32 tensor before the casts cast_precision put there."""
    name = scores
    while view.types.get(name) != TensorProto.FLOAT:
        node = view.made.get(name)
        check(node is not None and node.op_type == "Cast", f"the scores {scores} are neither fp32 nor cast from fp32")
        name = node.input[0]
    return name


def check_features(view: GraphView, features: str) -> None:
    check(view.types.get(features) in KERNEL_SUFFIX, f"the features {features} are not fp32/fp16/bf16")


def scores_source(view: GraphView, scores: str, features: str) -> tuple[str, str, dict]:
    """Walk token_prune's [CLS]-attention scores back to q and k: (q, k, {cls, scale})."""
    patches = _inner(view, scores, "Slice", skip_casts=True)
    starts, ends, axes = (view.const(patches.input[i]).tolist() for i in (1, 2, 3))
    check(axes == [1], "the patch slice is not on the token axis")
    mean = _inner(view, patches.input[0], "ReduceMean")
    check(view.const(mean.input[1]).tolist() == [1, 2] and attribute(mean, "keepdims", 1) == 0,
          "not a mean over heads and the query")
    softmax = _inner(view, mean.input[0], "Softmax")
    check(attribute(softmax, "axis", -1) in (-1, 3), "the softmax is not over the keys")
    mul = _inner(view, softmax.input[0], "Mul", skip_casts=True)
    scale = view.const(mul.input[1])
    check(scale.size == 1, "the logits are not scaled by one constant")
    matmul = _inner(view, mul.input[0], "MatMul")
    query = _inner(view, matmul.input[0], "Slice", skip_casts=True)
    check([view.const(query.input[i]).tolist() for i in (1, 2, 3)] == [[0], [1], [2]], "not the [CLS] query row")
    transpose = _inner(view, matmul.input[1], "Transpose", skip_casts=True)
    check(list(attribute(transpose, "perm", [])) == [0, 1, 3, 2], "the keys are not transposed for q K^T")
    q, k = _source(view, query.input[0]), _source(view, transpose.input[0])
    kv_len = _dims(view, k)[2]
    cls = starts[0]
    check(ends[0] >= INT_LIMIT or kv_len is None or ends[0] >= kv_len, "the patch slice stops before the last key")
    types = {view.types.get(name) for name in (q, k, features)}
    check(len(types) == 1 and next(iter(types)) in KERNEL_SUFFIX,
          f"q, k and features differ in type or are not fp32/fp16/bf16 ({sorted(t or 0 for t in types)})")
    return q, k, {"cls": int(cls), "scale": float(scale.reshape(-1)[0])}


INT_LIMIT = np.iinfo(np.int32).max


def _inner(view: GraphView, name: str, op_type: str, skip_casts: bool = False) -> onnx.NodeProto:
    """The producer of an inner tensor: read only by the chain, and on TensorRT."""
    view.single_use(name)
    node = view.producer(name, op_type, skip_casts)
    check(view.on_trt(node), f"{node.name} ({op_type}) runs on ONNX Runtime")
    return node


def _source(view: GraphView, name: str) -> str:
    """The tensor token_prune read: the input of its Cast to fp32 (a tensor already in fp32 has none)."""
    node = view.made.get(name)
    if node is not None and node.op_type == "Cast" and attribute(node, "to") == TensorProto.FLOAT:
        return node.input[0]
    return name


def _dims(view: GraphView, name: str) -> list:
    shape = view.shapes.get(name)
    if shape is None or len(shape) != 4:
        raise NoMatch(f"{name} is not a 4-D [n, heads, tokens, head_dim] tensor")
    return [d if isinstance(d, int) and d > 0 else None for d in shape]
