"""The LLM's lm_head on the positions from `logits_from` on, not on every position of the call.

A prefill of thousands of tokens needs the last position's logits only, and the lm_head is the widest linear of
a small LLM (Qwen2-0.5B's: 151,936 x 896, over a quarter of its multiply-adds per token). The graph takes
`logits_from` (int64 [1]): 0 returns every position's logits (perplexity, parity, a speculative verify window),
seq - 1 the last one's. Every cache layout's LLM takes it: the exporter's graph gets it at lowering, and a graph
lowered before it existed gets it from kv_layout.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from mmtrt.ir.rewrite import producers
from mmtrt.ir.spec import LOGITS_FROM


def takes_logits_from(graph: onnx.GraphProto) -> bool:
    return any(value.name == LOGITS_FROM for value in graph.input)


def lm_head(graph: onnx.GraphProto) -> onnx.NodeProto:
    """The node that makes `logits`, through the Casts cast_precision puts after it."""
    prods = producers(graph)
    head = prods["logits"]
    while head.op_type == "Cast":
        head = prods[head.input[0]]
    return head


def slice_logits(graph: onnx.GraphProto, prefix: str) -> str:
    """Slice the lm_head's input on the sequence axis from `logits_from` on (nodes named `prefix.*`, placed before
    the lm_head so the graph stays in topological order); the lm_head's node name."""
    head = lm_head(graph)
    hidden = head.input[0]
    sliced = f"{hidden}.from"
    end, axis = f"{prefix}.logits_end", f"{prefix}.seq_axis"
    nodes = [
        helper.make_node("Constant", [], [end], value=helper.make_tensor("end", TensorProto.INT64, [1], [2**62])),
        helper.make_node("Constant", [], [axis], value=helper.make_tensor("axis", TensorProto.INT64, [1], [1])),
        helper.make_node("Slice", [hidden, LOGITS_FROM, end, axis], [sliced], name=f"{prefix}.logits_from"),
    ]
    at = next(i for i, node in enumerate(graph.node) if node.output[:1] == head.output[:1])
    for offset, node in enumerate(nodes):
        graph.node.insert(at + offset, node)
    head.input[0] = sliced
    graph.input.append(helper.make_tensor_value_info(LOGITS_FROM, TensorProto.INT64, [1]))
    logits = next(o for o in graph.output if o.name == "logits")
    dim = logits.type.tensor_type.shape.dim[1]
    dim.Clear()
    dim.dim_param = "logits_seq"
    return head.name or head.op_type


def is_logits_slice(node: onnx.NodeProto | None) -> bool:
    """Whether `node` is `slice_logits`'s Slice of the lm_head's input from `logits_from` on."""
    return node is not None and node.op_type == "Slice" and node.input[1:2] == [LOGITS_FROM]


def without_logits_from(graph: onnx.GraphProto) -> None:
    """Undo `slice_logits` (a graph that makes one token per call, such as a draft, has nothing to cut): the
    lm_head reads every position again, and `logits_from` is no longer an input."""
    node = next((n for n in graph.node if is_logits_slice(n)), None)
    if node is None:
        return
    for user in graph.node:
        for i, name in enumerate(user.input):
            if name == node.output[0]:
                user.input[i] = node.input[0]
    graph.node.remove(node)
    value = next(v for v in graph.input if v.name == LOGITS_FROM)
    graph.input.remove(value)
    seq = next(v for v in graph.input if v.name == "inputs_embeds").type.tensor_type.shape.dim[1]
    next(o for o in graph.output if o.name == "logits").type.tensor_type.shape.dim[1].CopyFrom(seq)
