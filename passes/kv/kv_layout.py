"""kv_layout: rewrite the LLM's KV cache from a copy that grows every step into one buffer per layer written in place.

The exporter's graph concatenates `past.N.key` with the new keys and returns the grown copy, so every decode step
copies the whole cache (and on a GPU host, the runtime ships it over PCIe). `static` turns each layer's attention
into `com.microsoft.GroupQueryAttention` over a buffer `[batch, H_kv, capacity, D]` that the runtime binds as both
`past` and `present` (IOBinding): the new rows are written in place at each sequence's own length (`seqlens_k`),
attention is causal up to that length, and nothing is copied. The rotary embedding stays the graph's own ONNX
`RotaryEmbedding`, applied to the 3-D projections, so positions come from `position_ids` exactly as before.

The lm_head runs on the positions from `logits_from` on (mmtrt/ir/logits.py: the exporter's graph takes it; one
lowered before it did gets it here). The manifest's `model.kv_cache` says how to drive the graph.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import TensorProto, helper

from mmtrt.errors import UserError
from mmtrt.ir.graph import ModelIR
from mmtrt.ir.logits import LOGITS_FROM, lm_head, slice_logits, takes_logits_from
from mmtrt.ir.rewrite import attr, cleanup, import_domain, producers
from mmtrt.pipeline.pass_base import Pass
from passes.kv.cache_type import adopt_reduced_cache, cache_in_fp16
from passes.kv.kv_layout_config import KvLayoutConfig
from passes.kv.paged import CACHE_POSITIONS, MAX_BLOCKS, NUM_SLOTS, SLOTS, TABLE, TOKENS, rewrite_paged

CAPACITY = "capacity"
CACHE_TYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
NO_BF16 = ("kv_layout: a bfloat16 KV cache does not run: ONNX Runtime's CPU GroupQueryAttention has no bfloat16 "
           "kernel (1.31) and the runtimes hold float32 or float16 buffers; use cast_precision dtype fp16 "
           "(or cache_dtype fp16 on an fp32 LLM)")
SEQLENS, TOTAL = "seqlens_k", "total_sequence_length"


class KvLayout(Pass):
    name = "kv_layout"
    Config = KvLayoutConfig
    components = ("llm",)
    provides = frozenset({"kv_layout"})
    reads_source_weights = True  # rewrites attention and the cache's inputs and outputs, never a weight

    def plan_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        wanted, lowered = self.config.cache_dtype, facts.get("float_type")
        if wanted == "auto":
            dtype = lowered or "float32"
        elif lowered and CACHE_TYPES[wanted] != lowered:
            raise UserError(f"cache_dtype {wanted} on an LLM that cast_precision lowered to {lowered}; drop "
                            "cache_dtype (the cache takes the LLM's type) or put kv_layout before cast_precision")
        else:
            dtype = CACHE_TYPES[wanted]
        if dtype == "bfloat16":
            raise UserError(NO_BF16)
        return {**facts, "kv_cache": kv_facts(self.config, dtype, facts["llm"].get("rope"))}

    def run(self, ir: ModelIR) -> dict:
        comp = ir.components["llm"]
        model = comp.onnx
        reduced = adopt_reduced_cache(model.graph)  # plan_facts refused a cache_dtype other than this one
        rewrite = rewrite_attention if self.config.layout == "static" else self._paged
        layers = rewrite(model.graph, ir.config["llm"])
        import_domain(model, "com.microsoft")
        head = (lm_head(model.graph).name if takes_logits_from(model.graph)
                else slice_logits(model.graph, "kv_layout"))
        if reduced is None and self.config.cache_dtype == "fp16":
            cache_in_fp16(model.graph, self.config.layout)
        model = cleanup(model)
        _drop_unused_inputs(model.graph)
        _name_cache_dims(model.graph, self.config.layout, ir.config["llm"])
        comp.set_graph(model)
        dtype = next(s.dtype for s in comp.inputs if s.name.startswith("past."))
        ir.config["kv_cache"] = kv_facts(self.config, dtype, ir.config["llm"].get("rope"))
        return {"llm": {**self.config.model_dump(), "attention_rewritten": layers, "logits_sliced_after": head,
                        "cache_dtype": dtype}}


    def _paged(self, graph: onnx.GraphProto, llm: dict[str, Any]) -> int:
        prods = producers(graph)
        attentions = _attentions(graph, llm)
        concats = [(_present_concat(graph, prods, i, "key"), _present_concat(graph, prods, i, "value"))
                   for i in range(len(attentions))]
        rewrite_paged(graph, llm, concats, attentions, self.config.block_tokens)
        return len(attentions)


def kv_facts(config: KvLayoutConfig, dtype: str, rope: str | None = None) -> dict[str, Any]:
    """What a runtime needs to drive the rewritten graph; sizes are the plan's `capacity` (and pool) dimensions.
    Under M-RoPE (`rope` "mrope") positions are three rows and no longer say where a token sits in the cache."""
    facts = _layout_facts(config, dtype)
    if rope == "mrope":
        facts["position_ids"] = ("int64 [3, batch, seq]: M-RoPE's temporal, height and width rows (the prompt's from "
                                 "its image grid; in decode each sequence's length plus its rope delta)")
        if config.layout == "paged":
            facts["cache_positions"] = f"{CACHE_POSITIONS}: int64 [batch, seq], each new token's index in its sequence"
    return facts


def _layout_facts(config: KvLayoutConfig, dtype: str) -> dict[str, Any]:
    if config.layout == "paged":
        return {
            "layout": "paged", "dtype": dtype, "block_tokens": config.block_tokens, "pool_blocks": config.pool_blocks,
            "capacity_dim": CAPACITY, "pool_shape": [NUM_SLOTS, "num_kv_heads", "head_dim"],
            "past": "past.{layer}.{kind}", "present": "present.{layer}.{kind}", "kinds": ["key", "value"],
            "past_present_share_buffer": True,
            "slot_mapping": f"{SLOTS}: int64 [{TOKENS}, 1], pool slot of each new token (block * block_tokens + i)",
            "block_table": f"{TABLE}: int64 [batch, {MAX_BLOCKS}], each sequence's blocks in order (pad: any block)",
            "logits_from": f"{LOGITS_FROM}: int64 [1], first position whose logits are returned (seq - 1: last only)",
        }
    return {
        "layout": "static",
        "dtype": dtype,
        "capacity_dim": CAPACITY,
        "buffer_shape": ["batch", "num_kv_heads", CAPACITY, "head_dim"],
        "past": "past.{layer}.{kind}",
        "present": "present.{layer}.{kind}",
        "kinds": ["key", "value"],
        "past_present_share_buffer": True,
        "seqlens_k": f"{SEQLENS}: int32 [batch], tokens held per sequence after this call, minus 1",
        "total_sequence_length": f"{TOTAL}: int32 scalar, the largest past + new length in the batch",
        "logits_from": f"{LOGITS_FROM}: int64 [1], first position whose logits are returned (seq - 1: last only)",
    }


def _producer_through(prods, name: str, op: str) -> onnx.NodeProto:
    node = prods.get(name)
    if node is None or node.op_type != op:
        raise UserError(f"kv_layout: expected {name} to come from {op}, found "
                        f"{node.op_type if node else 'a graph input'}; this LLM graph is not the exporter's layout")
    return node


def _projection(prods, bnsh: str) -> str:
    """The [B, S, H*D] tensor a BNSH view was made from (Transpose of a Reshape of the projection)."""
    transpose = _producer_through(prods, bnsh, "Transpose")
    return _producer_through(prods, transpose.input[0], "Reshape").input[0]


def _rotary_3d(rotary: onnx.NodeProto, source: str, out: str, heads: int) -> onnx.NodeProto:
    """The rotation on the [B, S, heads * D] projection: a 3-D input needs `num_heads` to split the heads, and the
    exporter's 4-D node's value is not kept current by passes that prune heads (TensorRT's rotary layer derives the
    head size from it: "cosCache's last dimension ... must be half of headSize")."""
    node = helper.make_node("RotaryEmbedding", [source, *rotary.input[1:]], [out], name=out)
    node.attribute.extend(a for a in rotary.attribute if a.name != "num_heads")
    node.attribute.append(helper.make_attribute("num_heads", heads))
    return node


def _rotated_3d(prods, bnsh: str, out: str, heads: int) -> list[onnx.NodeProto]:
    """The rotated queries or keys as GroupQueryAttention takes them, [B, S, heads * D]: the exporter's
    RotaryEmbedding moved onto the projection where it made them; otherwise (M-RoPE, whose sections the exporter
    leaves as plain arithmetic) the rotated BNSH tensor transposed and reshaped."""
    rotary = prods.get(bnsh)
    if rotary is not None and rotary.op_type == "RotaryEmbedding":
        return [_rotary_3d(rotary, _projection(prods, rotary.input[0]), out, heads)]
    return [helper.make_node("Transpose", [bnsh], [f"{out}.bsnh"], perm=[0, 2, 1, 3]),
            helper.make_node("Constant", [], [f"{out}.shape"], value=helper.make_tensor(
                "shape", TensorProto.INT64, [3], [0, 0, -1])),
            helper.make_node("Reshape", [f"{out}.bsnh", f"{out}.shape"], [out])]


def rewrite_attention(graph: onnx.GraphProto, llm: dict[str, Any]) -> int:
    """Replace each layer's Concat + repeat_kv + Attention by one GroupQueryAttention on the shared buffers."""
    prods = producers(graph)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    attentions = _attentions(graph, llm)
    for layer, att in enumerate(attentions):
        concat_k = _present_concat(graph, prods, layer, "key")
        concat_v = _present_concat(graph, prods, layer, "value")
        q3, k3 = f"kv_layout.{layer}.query", f"kv_layout.{layer}.key"
        out_t = _single(consumers, att.output[0], "Transpose")
        out = _single(consumers, out_t.output[0], "Reshape")
        gqa = helper.make_node(
            "GroupQueryAttention",
            [q3, k3, _projection(prods, concat_v.input[1]), f"past.{layer}.key", f"past.{layer}.value", SEQLENS, TOTAL],
            [out.output[0], f"present.{layer}.key", f"present.{layer}.value"],
            name=f"kv_layout.{layer}.gqa", domain="com.microsoft",
            num_heads=llm["num_heads"], kv_num_heads=llm["num_kv_heads"], scale=attr(att, "scale"))
        if attr(att, "softcap", 0.0):
            gqa.attribute.append(helper.make_attribute("softcap", attr(att, "softcap")))
        for old in (att, out_t, out, concat_k, concat_v):
            graph.node.remove(old)
        graph.node.extend([*_rotated_3d(prods, att.input[0], q3, llm["num_heads"]),
                           *_rotated_3d(prods, concat_k.input[1], k3, llm["num_kv_heads"]), gqa])
    graph.input.extend([helper.make_tensor_value_info(SEQLENS, TensorProto.INT32, ["batch"]),
                        helper.make_tensor_value_info(TOTAL, TensorProto.INT32, [])])
    return len(attentions)


def _attentions(graph: onnx.GraphProto, llm: dict[str, Any]) -> list[onnx.NodeProto]:
    attentions = [n for n in graph.node if n.op_type == "Attention"]
    if len(attentions) != llm["num_layers"]:
        raise UserError(f"kv_layout: found {len(attentions)} Attention nodes for {llm['num_layers']} layers; "
                        "run kv_layout on the exporter's LLM graph (before passes that restructure attention)")
    return attentions


def _present_concat(graph, prods, layer: int, kind: str) -> onnx.NodeProto:
    concat = _producer_through(prods, f"present.{layer}.{kind}", "Concat")
    if concat.input[0] != f"past.{layer}.{kind}":
        raise UserError(f"kv_layout: present.{layer}.{kind} does not extend past.{layer}.{kind}")
    return concat


def _single(consumers, name: str, op: str) -> onnx.NodeProto:
    users = consumers.get(name, [])
    if len(users) != 1 or users[0].op_type != op:
        raise UserError(f"kv_layout: {name} should feed one {op}; found {[u.op_type for u in users]}")
    return users[0]


def _drop_unused_inputs(graph: onnx.GraphProto) -> None:
    used = {name for node in graph.node for name in node.input}
    for value in list(graph.input):
        if value.name not in used:
            graph.input.remove(value)


def _set_dim(value: onnx.ValueInfoProto, axis: int, name: str) -> None:
    dim = value.type.tensor_type.shape.dim[axis]
    dim.Clear()
    dim.dim_param = name


def _name_cache_dims(graph: onnx.GraphProto, layout: str, llm: dict[str, Any]) -> None:
    for value in [*graph.input, *graph.output]:
        if not value.name.startswith(("past.", "present.")):
            continue
        if layout == "static":
            _set_dim(value, 2, CAPACITY)
            continue
        elem = value.type.tensor_type.elem_type
        value.type.CopyFrom(helper.make_tensor_type_proto(elem, [NUM_SLOTS, llm["num_kv_heads"], llm["head_dim"]]))
