"""The static KV cache in the form TensorRT's ONNX parser takes: TensorScatter writes, then Attention over the buffer.

kv_layout's static graph runs `com.microsoft.GroupQueryAttention`, which ONNX Runtime writes in place but TensorRT
does not parse. TensorRT 10.15+ and 11 parse the standard ONNX form of the same cache: `TensorScatter` (opset 24,
axis -2, mode linear) becomes an `IKVCacheUpdateLayer` (kLINEAR: the new rows written at `write_indices`, its
output at the address of its input), and `Attention` without past/present becomes an `IAttention` (GQA: query heads
a multiple of the key heads). So each GroupQueryAttention is rewritten into: the new keys and values as BNSH,
`TensorScatter` into `past.N.*` at each sequence's length giving `present.N.*`, and `Attention` over the whole
buffer with a boolean mask `key position <= query position` (which also hides the rows past a sequence's length).
The graph keeps every input and output of the GroupQueryAttention form (`total_sequence_length` aside, which only
GroupQueryAttention reads), so the runtime binds both forms alike. Placement cuts the LLM's TensorRT segments from
this form; ONNX Runtime keeps running the GroupQueryAttention form, which attends only up to each length.
IKVCacheUpdateLayer needs the cache's sequence axis static ("The KV cache tensor must have a static sequence length
dimension"), so the form writes the planned capacity (one value: min = max) into the buffers' shapes.
"""

from __future__ import annotations

import copy

import onnx
from onnx import TensorProto, helper

from mmtrt.ir.rewrite import attr

OPSET = 24  # TensorScatter's
PREFIX = "trt_form"
CAPACITY = "capacity"
WRITTEN_BY = "com.microsoft.GroupQueryAttention"
FORMS = {
    "onnxruntime": "com.microsoft.GroupQueryAttention over the shared buffers, written in place (llm.onnx)",
    "tensorrt": "TensorScatter (IKVCacheUpdateLayer, in place) + Attention (IAttention) over the same buffers",
}


def has_gqa(model: onnx.ModelProto) -> bool:
    return any(n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft" for n in model.graph.node)


def tensorrt_form(model: onnx.ModelProto, dims: dict[str, dict[str, int]] | None = None) -> onnx.ModelProto:
    """A copy of `model` with every GroupQueryAttention in the TensorScatter + Attention form; with the shape plan
    `dims`, the cache buffers' capacity axis fixed at its planned value."""
    out = copy.deepcopy(model)
    graph = out.graph
    gqas = [n for n in graph.node if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft"]
    shared = _shared(graph, gqas[0])
    for layer, gqa in enumerate(gqas):
        position = list(graph.node).index(gqa)
        graph.node.remove(gqa)
        for offset, node in enumerate(_layer(gqa, layer, shared)):
            graph.node.insert(position + offset, node)
    for offset, node in enumerate(shared["nodes"]):  # they read graph inputs only
        graph.node.insert(offset, node)
    # shape inference cannot size Range's output: name it, so the shape plan covers the mask
    graph.value_info.extend([
        helper.make_tensor_value_info(f"{PREFIX}.key_positions", TensorProto.INT64, ["capacity"]),
        helper.make_tensor_value_info(shared["mask"], TensorProto.BOOL, ["batch", 1, "seq", "capacity"]),
        *(helper.make_tensor_value_info(f"{PREFIX}.new_offsets", TensorProto.INT64, ["seq"])
          for n in shared["nodes"] if n.output[0] == f"{PREFIX}.new_offsets")])
    _drop_unread_inputs(graph)
    if dims and dims.get(CAPACITY, {}).get("min") == dims.get(CAPACITY, {}).get("max"):
        _fix_dim(graph, CAPACITY, dims[CAPACITY]["max"])
    out.ir_version = max(out.ir_version, 11)  # the IR that opset 24 came with
    del out.opset_import[:]
    out.opset_import.extend([helper.make_opsetid("", OPSET)] +
                            [o for o in model.opset_import if o.domain not in ("", "ai.onnx", "com.microsoft")])
    if any(n.domain == "com.microsoft" for n in graph.node):
        out.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return out


def _const(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [len(values)],
                                                                              values))


def _shared(graph: onnx.GraphProto, first: onnx.NodeProto) -> dict:
    """write_indices (each sequence's length before this call) and the mask [B, 1, seq, capacity], built once.
    A query's index in the cache is its position; under M-RoPE (position_ids [3, batch, seq]) it is not, and the
    indices are write_indices + 0..seq-1."""
    seqlens, past = first.input[5], first.input[3]
    p = PREFIX
    mrope = len(next(v for v in graph.input if v.name == "position_ids").type.tensor_type.shape.dim) == 3
    nodes = [
        _const(f"{p}.one", [1]),
        helper.make_node("Shape", ["inputs_embeds" if mrope else "position_ids"], [f"{p}.seq"], start=1, end=2),
        helper.make_node("Cast", [seqlens], [f"{p}.seqlens64"], to=TensorProto.INT64),
        helper.make_node("Add", [f"{p}.seqlens64", f"{p}.one"], [f"{p}.total"]),
        helper.make_node("Sub", [f"{p}.total", f"{p}.seq"], [f"{p}.write_indices"]),
        helper.make_node("Shape", [past], [f"{p}.capacity"], start=2, end=3),
        helper.make_node("Squeeze", [f"{p}.capacity"], [f"{p}.capacity_scalar"]),
        helper.make_node("Constant", [], [f"{p}.zero"], value=helper.make_tensor("z", TensorProto.INT64, [], [0])),
        helper.make_node("Constant", [], [f"{p}.step"], value=helper.make_tensor("s", TensorProto.INT64, [], [1])),
        helper.make_node("Range", [f"{p}.zero", f"{p}.capacity_scalar", f"{p}.step"], [f"{p}.key_positions"]),
        *(_cache_indices(p) if mrope else []),
        _const(f"{p}.mask_axes", [1, 3]),
        helper.make_node("Unsqueeze", [f"{p}.cache_indices" if mrope else "position_ids", f"{p}.mask_axes"],
                         [f"{p}.query_positions"]),
        helper.make_node("LessOrEqual", [f"{p}.key_positions", f"{p}.query_positions"], [f"{p}.mask"]),
    ]
    return {"nodes": nodes, "write": f"{p}.write_indices", "mask": f"{p}.mask"}


def _cache_indices(p: str) -> list[onnx.NodeProto]:
    """[batch, seq]: write_indices[b] + s, each new token's index in its sequence."""
    return [helper.make_node("Squeeze", [f"{p}.seq"], [f"{p}.seq_scalar"]),
            helper.make_node("Range", [f"{p}.zero", f"{p}.seq_scalar", f"{p}.step"], [f"{p}.new_offsets"]),
            helper.make_node("Unsqueeze", [f"{p}.write_indices", f"{p}.one"], [f"{p}.write_column"]),
            helper.make_node("Add", [f"{p}.write_column", f"{p}.new_offsets"], [f"{p}.cache_indices"])]


def _bnsh(source: str, heads: int, name: str) -> list[onnx.NodeProto]:
    return [_const(f"{name}.shape", [0, 0, heads, -1]),
            helper.make_node("Reshape", [source, f"{name}.shape"], [f"{name}.bsnh"]),
            helper.make_node("Transpose", [f"{name}.bsnh"], [name], perm=[0, 2, 1, 3])]


def _layer(gqa: onnx.NodeProto, layer: int, shared: dict) -> list[onnx.NodeProto]:
    query, key, value, past_key, past_value = gqa.input[:5]
    out, present_key, present_value = gqa.output
    heads, kv_heads = attr(gqa, "num_heads"), attr(gqa, "kv_num_heads")
    stem = f"{PREFIX}.{layer}"
    options = {"scale": attr(gqa, "scale")} if attr(gqa, "scale") else {}
    if attr(gqa, "softcap", 0.0):
        options["softcap"] = attr(gqa, "softcap")
    return [
        *_bnsh(query, heads, f"{stem}.q"), *_bnsh(key, kv_heads, f"{stem}.k"), *_bnsh(value, kv_heads, f"{stem}.v"),
        helper.make_node("TensorScatter", [past_key, f"{stem}.k", shared["write"]], [present_key],
                         name=f"{stem}.key_update", axis=-2, mode="linear"),
        helper.make_node("TensorScatter", [past_value, f"{stem}.v", shared["write"]], [present_value],
                         name=f"{stem}.value_update", axis=-2, mode="linear"),
        helper.make_node("Attention", [f"{stem}.q", present_key, present_value, shared["mask"]], [f"{stem}.att"],
                         name=f"{stem}.attention", **options),
        helper.make_node("Transpose", [f"{stem}.att"], [f"{stem}.att_bsnh"], perm=[0, 2, 1, 3]),
        _const(f"{stem}.out_shape", [0, 0, -1]),
        helper.make_node("Reshape", [f"{stem}.att_bsnh", f"{stem}.out_shape"], [out]),
    ]


def _fix_dim(graph: onnx.GraphProto, name: str, size: int) -> None:
    for value in [*graph.input, *graph.output, *graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == name:
                dim.Clear()
                dim.dim_value = size


def _drop_unread_inputs(graph: onnx.GraphProto) -> None:
    read = {name for node in graph.node for name in node.input}
    for value in [v for v in graph.input if v.name not in read]:
        graph.input.remove(value)
