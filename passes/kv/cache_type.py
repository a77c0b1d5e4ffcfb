"""The type kv_layout stores the cache in: the type the layers compute keys and values in, or fp16 on request.

After cast_precision the LLM computes in fp16 or bf16 but keeps fp32 component I/O, so the exporter's cache is
read through a Cast down (`past.N.key__fp16`) and written back through a Cast up (`present.N.key` restored from
`present.N.key__reduced`): a cache of twice the size and two casts per layer and step. `adopt_reduced_cache` drops
both, so the graph is the exporter's layout again, in the reduced type, before the attention is rewritten.
`cache_in_fp16` is the other way round, for an fp32 LLM whose recipe asks for an fp16 cache: it casts what is
written into the cache and what attention reads from it.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from mmtrt.errors import UserError
from mmtrt.ir.rewrite import attr, producers

REDUCED = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


def adopt_reduced_cache(graph: onnx.GraphProto) -> int | None:
    """Remove the Casts between the cache I/O and a reduced-precision LLM; the reduced type, or None (fp32 LLM)."""
    prods = producers(graph)
    cache_in = {v.name for v in graph.input if v.name.startswith("past.")}
    renames, dropped, types = {}, [], set()
    for node in graph.node:
        if node.op_type == "Cast" and node.input[0] in cache_in and attr(node, "to") in REDUCED:
            renames[node.output[0]] = node.input[0]
            dropped.append(node)
            types.add(attr(node, "to"))
    for value in graph.output:
        restore = prods.get(value.name)
        if value.name.startswith("present.") and restore is not None and restore.op_type == "Cast":
            renames[restore.input[0]] = value.name
            dropped.append(restore)
    if not types:
        return None
    if len(types) > 1 or len(dropped) != 2 * len(cache_in):
        raise UserError("kv_layout: the LLM's cache inputs and outputs are cast to different types; run kv_layout "
                        "right after cast_precision, before passes that change the cache")
    for node in dropped:
        graph.node.remove(node)
    for node in graph.node:
        for names in (node.input, node.output):
            for k, name in enumerate(names):
                names[k] = renames.get(name, name)
    kept = [v for v in graph.value_info if v.name not in renames]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    reduced = types.pop()
    for value in [*graph.input, *graph.output]:
        if value.name.startswith(("past.", "present.")):
            value.type.tensor_type.elem_type = reduced
    return reduced


def _cast(graph: onnx.GraphProto, node: onnx.NodeProto, index: int, to: int) -> None:
    name = f"{node.input[index]}.as{to}.{node.name}"
    graph.node.append(helper.make_node("Cast", [node.input[index]], [name], to=to, name=name))
    node.input[index] = name


def cache_in_fp16(graph: onnx.GraphProto, layout: str) -> None:
    """Store past/present of an fp32 LLM in fp16: cast what is written into the cache, and what attention returns
    or reads."""
    half, full = TensorProto.FLOAT16, TensorProto.FLOAT
    for node in list(graph.node):
        if layout == "static" and node.op_type == "GroupQueryAttention":
            for index in (0, 1, 2):
                _cast(graph, node, index, half)
            out = node.output[0]
            node.output[0] = f"{out}.fp16"
            graph.node.append(helper.make_node("Cast", [node.output[0]], [out], to=full, name=f"{out}.fp32"))
        elif layout == "paged" and node.op_type == "ScatterND":
            _cast(graph, node, 2, half)
        elif layout == "paged" and node.op_type == "Attention":
            for index in (1, 2):
                _cast(graph, node, index, full)
    for value in [*graph.input, *graph.output]:
        if value.name.startswith(("past.", "present.")):
            value.type.tensor_type.elem_type = half
