"""The paged rewrite of kv_layout: a pool of fixed-size blocks per layer, a block table per sequence.

Each layer's cache is one pool `[num_slots, H_kv, D]` (slot = block * block_tokens + offset, the token-major block
layout of ONNX Runtime's PagedAttention). The new keys and values are written at their slots (`ScatterND`, bound
in place: the runtime binds the same buffer as past and present), then the sequence's blocks are gathered in table
order into `[B, H_kv, blocks * block_tokens, D]` and the graph's own attention reads them, masked to the keys at or
before each query's position. ONNX Runtime's `PagedAttention` has a CUDA kernel and no CPU kernel, so this
decomposition is the form that runs everywhere; the gather copies the sequence's blocks once per layer and step.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

SLOTS, TABLE, CACHE_POSITIONS = "slot_mapping", "block_table", "cache_positions"
NUM_SLOTS, MAX_BLOCKS, TOKENS = "num_slots", "max_blocks", "new_tokens"


def _const(graph: onnx.GraphProto, name: str, values: list[int]) -> str:
    graph.node.append(helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name, TensorProto.INT64, [len(values)], values)))
    return name


def rewrite_paged(graph: onnx.GraphProto, llm: dict, concats, attentions, block_tokens: int) -> None:
    """concats[i] = (Concat for present.i.key, Concat for present.i.value); attentions[i] the layer's Attention."""
    heads, dim = llm["num_kv_heads"], llm["head_dim"]
    flat = _const(graph, "kv_layout.token_shape", [-1, heads, dim])
    blocks = _const(graph, "kv_layout.block_shape", [-1, block_tokens, heads, dim])
    context = _const(graph, "kv_layout.context_shape", [0, -1, heads, dim])
    for att, pair in zip(attentions, concats):
        # the Attention op groups query heads over the key heads itself: the exporter's repeat_kv goes
        att.input[1], att.input[2] = (_write_and_gather(graph, concat, flat, blocks, context) for concat in pair)
    _batch_from_embeds(graph)
    mask = _causal_mask(graph, _query_positions(graph))
    for att in attentions:
        att.input[3] = mask
    graph.input.extend([helper.make_tensor_value_info(SLOTS, TensorProto.INT64, [TOKENS, 1]),
                        helper.make_tensor_value_info(TABLE, TensorProto.INT64, ["batch", MAX_BLOCKS])])


def _query_positions(graph: onnx.GraphProto) -> str:
    """Each new token's index in its sequence [batch, seq]: position_ids where they are that; M-RoPE's
    position_ids [3, batch, seq] are rotary positions (an image's tokens share rows), so such a graph takes the
    indices as an input of their own, CACHE_POSITIONS."""
    positions = next(v for v in graph.input if v.name == "position_ids")
    if len(positions.type.tensor_type.shape.dim) == 2:
        return "position_ids"
    graph.input.append(helper.make_tensor_value_info(CACHE_POSITIONS, TensorProto.INT64, ["batch", "seq"]))
    return CACHE_POSITIONS


def _write_and_gather(graph, concat: onnx.NodeProto, flat: str, blocks: str, context: str) -> str:
    past, new = concat.input
    present, stem = concat.output[0], concat.output[0].replace("present.", "kv_layout.")
    graph.node.remove(concat)
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == present:
                node.input[i] = f"{stem}.context"
    graph.node.extend([
        helper.make_node("Transpose", [new], [f"{stem}.bsnh"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", [f"{stem}.bsnh", flat], [f"{stem}.tokens"]),
        helper.make_node("ScatterND", [past, SLOTS, f"{stem}.tokens"], [present], name=f"{stem}.write"),
        helper.make_node("Reshape", [present, blocks], [f"{stem}.blocks"]),
        helper.make_node("Gather", [f"{stem}.blocks", TABLE], [f"{stem}.gathered"], axis=0, name=f"{stem}.gather"),
        helper.make_node("Reshape", [f"{stem}.gathered", context], [f"{stem}.bsnh_ctx"]),
        helper.make_node("Transpose", [f"{stem}.bsnh_ctx"], [f"{stem}.context"], perm=[0, 2, 1, 3]),
    ])
    return f"{stem}.context"


def _batch_from_embeds(graph: onnx.GraphProto) -> None:
    """The exporter reads the batch size off past.N's first axis, which is now the pool's slot axis."""
    for node in graph.node:
        if node.op_type == "Shape" and node.input[0].startswith("past.") and _attr(node, "start") == 0:
            node.input[0] = graph.input[0].name


def _attr(node, name):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)


def _causal_mask(graph: onnx.GraphProto, positions: str) -> str:
    """mask[b, 0, s, t] = t <= positions[b, s]: a key takes part when it is at or before the query (keys beyond
    a sequence's length sit after its last position, so they are masked too)."""
    graph.node.extend([
        helper.make_node("Shape", ["kv_layout.0.key.context"], ["kv_layout.context_len"], start=2, end=3),
        helper.make_node("Squeeze", ["kv_layout.context_len"], ["kv_layout.context_len_scalar"]),
        helper.make_node("Constant", [], ["kv_layout.zero"], value=helper.make_tensor("z", TensorProto.INT64, [], [0])),
        helper.make_node("Constant", [], ["kv_layout.one"], value=helper.make_tensor("o", TensorProto.INT64, [], [1])),
        helper.make_node("Range", ["kv_layout.zero", "kv_layout.context_len_scalar", "kv_layout.one"],
                         ["kv_layout.key_positions"]),
        helper.make_node("Unsqueeze", [positions, _const(graph, "kv_layout.mask_axes", [1, 3])],
                         ["kv_layout.query_positions"]),
        helper.make_node("LessOrEqual", ["kv_layout.key_positions", "kv_layout.query_positions"], ["kv_layout.mask"]),
    ])
    return "kv_layout.mask"
