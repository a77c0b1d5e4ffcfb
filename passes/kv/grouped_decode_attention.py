"""grouped_decode_attention: decode steps attend with one MatMul per key head instead of one per query head.

ONNX Runtime's CPU GroupQueryAttention (1.31) runs each query head on its own, so at a decode step every key head's
cache is read once per query head sharing it (7 times for Qwen2-0.5B's 14 query and 2 key heads): 0.43 ms a layer
at 2,049 cached tokens, 30 % of an INT4 Qwen2-0.5B's step. For a few new tokens, each layer here writes the new
keys and values into the static layout's buffers in place (ScatterElements on the buffer the runtime binds as both
past and present, at the positions GroupQueryAttention writes them) and attends with the query heads of a key
head stacked into one MatMul over the buffer's first `total_sequence_length` rows, masked causally per row: 0.22 ms
a layer. Longer inputs (a prompt, a chunk of one) take the layer's own GroupQueryAttention in the other branch of
an `If`: stacked that way, a 2,049-token prompt's scores take 4x its time. The graph's inputs and outputs are
unchanged, so every runtime binds it as before; the outputs equal GroupQueryAttention's to float rounding.

ONNX Runtime only (TensorRT reads the static layout's GroupQueryAttention form), float32 caches, and the last pass
on the LLM: a later pass finds no GroupQueryAttention outside the `If`.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from mmtrt.errors import UserError
from mmtrt.ir.graph import ModelIR
from mmtrt.ir.rewrite import attr, import_domain
from mmtrt.pipeline.pass_base import Pass, PassConfig

# new tokens up to which the stacked form runs: it is ahead at 1 to 8 (0.24 against 0.62 ms at 1, 0.90 against
# 1.37 at 8, 2,049 cached tokens) and level at 16
MAX_NEW_TOKENS = 8
PLAIN = {"num_heads", "kv_num_heads", "scale", "do_rotary", "rotary_interleaved"}
NEG = -3.0e38  # a masked score: exp underflows to 0, and no row is all masked (a token sees itself)


class GroupedDecodeAttention(Pass):
    name = "grouped_decode_attention"
    Config = PassConfig
    components = ("llm",)
    requires = frozenset({"kv_layout"})
    seals = frozenset({"llm"})
    same_math = True  # so it may follow int8_prefill, whose prompt graph keeps GroupQueryAttention
    reads_source_weights = True  # rewires attention; no weight is read

    def run(self, ir: ModelIR) -> dict:
        if ir.config.get("kv_cache", {}).get("layout") != "static":
            raise UserError("grouped_decode_attention rewrites the static layout's GroupQueryAttention; use "
                            "kv_layout: {layout: static} before it")
        comp = ir.components["llm"]
        if comp.metadata.get("placement", {}).get("targeted", False):
            raise UserError("grouped_decode_attention rewrites attention for ONNX Runtime, and partition.llm offers "
                            "tensorrt, whose form is made from GroupQueryAttention; set partition: {llm: "
                            "[onnxruntime]} or drop the pass")
        if ir.config["kv_cache"].get("dtype", "float32") != "float32":
            raise UserError("grouped_decode_attention runs float32 caches; drop the pass or cache_dtype")
        graph = comp.onnx.graph
        head_size = ir.config["llm"]["head_dim"]
        layers = [(i, n) for i, n in enumerate(graph.node) if n.op_type == "GroupQueryAttention"]
        skipped = [n.name for _, n in layers if not _plain(n)]
        for i, gqa in reversed([(i, n) for i, n in layers if _plain(n)]):
            graph.node.remove(gqa)
            for offset, node in enumerate(_rewrite(gqa, f"gda{i}", head_size)):
                graph.node.insert(i + offset, node)
        import_domain(comp.onnx, "com.microsoft")
        return {"llm": {"layers": len(layers) - len(skipped), "max_new_tokens": MAX_NEW_TOKENS,
                        **({"skipped": skipped} if skipped else {})}}


def _plain(gqa: onnx.NodeProto) -> bool:
    """Whether the layer is the static layout's form this pass reproduces: no window, softcap or extra inputs."""
    names = {a.name for a in gqa.attribute}
    return names <= PLAIN and len(gqa.input) in (7, 9) and attr(gqa, "num_heads") % attr(gqa, "kv_num_heads") == 0


def _const(name: str, values, dtype=TensorProto.INT64) -> onnx.NodeProto:
    values = list(np.atleast_1d(values))
    return helper.make_node("Constant", [], [name], name=name,
                            value=helper.make_tensor(name, dtype, [len(values)], values))


class _Names:
    def __init__(self, prefix: str):
        self.prefix = prefix

    def __getattr__(self, name: str) -> str:
        return f"{self.prefix}.{name}"


def _rewrite(gqa: onnx.NodeProto, prefix: str, d: int) -> list[onnx.NodeProto]:
    """The nodes replacing one GroupQueryAttention: positions, rotary and the in-place write, then the `If`."""
    heads, kv_heads = attr(gqa, "num_heads"), attr(gqa, "kv_num_heads")
    rotary = bool(attr(gqa, "do_rotary", 0))
    query, key, value, past_k, past_v, seqlens, total = gqa.input[:7]
    present_k, present_v = gqa.output[1], gqa.output[2]
    v = _Names(prefix)
    node = helper.make_node
    nodes = [_const(v.zero, 0), _const(v.one, 1), _const(v.two, 2),
             node("Shape", [query], [v.qshape], start=1, end=2),                      # [S]
             node("Cast", [seqlens], [v.last], to=TensorProto.INT64),
             node("Add", [v.last, v.one], [v.length]), node("Sub", [v.length, v.qshape], [v.past]),
             node("Squeeze", [v.qshape], [v.s]), node("Squeeze", [v.zero], [v.z]), node("Squeeze", [v.one], [v.o]),
             node("Range", [v.z, v.s, v.o], [v.steps]),
             node("Unsqueeze", [v.past, v.one], [v.past2]), node("Add", [v.past2, v.steps], [v.pos])]  # [B, S]
    if rotary:  # the packed projection: split, and rotated as GroupQueryAttention rotates it
        nodes += [_const(v.split, [heads * d, kv_heads * d, kv_heads * d]),
                  node("Split", [query, v.split], [v.q_raw, v.k_raw, v.v], axis=-1)]
        nodes += [node("RotaryEmbedding", [raw, v.pos, gqa.input[7], gqa.input[8]], [out], domain="com.microsoft",
                       num_heads=n, interleaved=attr(gqa, "rotary_interleaved", 0))
                  for raw, out, n in ((v.q_raw, v.q, heads), (v.k_raw, v.k, kv_heads))]
        query, key, value = v.q, v.k, v.v
    nodes += [_const(v.axes13, [1, 3]), node("Unsqueeze", [v.pos, v.axes13], [v.pos4])]  # [B, 1, S, 1]
    nodes += (_write(v, "k", key, past_k, present_k, (kv_heads, d))
              + _write(v, "v", value, past_v, present_v, (kv_heads, d)))
    decode = _decode_branch(v, query, present_k, present_v, total, (heads, kv_heads, d),
                            attr(gqa, "scale", 0.0) or 1 / np.sqrt(d), gqa.output[0] + ".decode")
    inputs = list(gqa.input)
    inputs[3:5] = [present_k, present_v]
    prompt = node("GroupQueryAttention", inputs, [f"{v.prefix}.prompt_out", f"{v.prefix}.prompt_k",
                                                  f"{v.prefix}.prompt_v"], name=f"{gqa.name}.prompt",
                  domain="com.microsoft")
    prompt.attribute.extend(gqa.attribute)
    out = helper.make_tensor_value_info
    nodes += [_const(v.most, MAX_NEW_TOKENS), node("LessOrEqual", [v.qshape, v.most], [v.few1]),
              node("Squeeze", [v.few1], [v.few]),
              node("If", [v.few], [gqa.output[0]], name=gqa.name or prefix,
                   then_branch=helper.make_graph(decode, f"{prefix}.decode", [], [out(gqa.output[0] + ".decode",
                                                                                      TensorProto.FLOAT, None)]),
                   else_branch=helper.make_graph([prompt], f"{prefix}.prompt", [],
                                                 [out(prompt.output[0], TensorProto.FLOAT, None)]))]
    return nodes


def _write(v: _Names, kind: str, new: str, past: str, present: str, shape: tuple[int, int]) -> list[onnx.NodeProto]:
    """`new` [B, S, H_kv * D] written into `past` [B, H_kv, capacity, D] at rows `pos`, as `present`: in place
    where the runtime binds both to one buffer (ScatterElements copies nothing onto itself)."""
    node, name = helper.make_node, f"{v.prefix}.{kind}"
    return [_const(f"{name}.shape", [0, 0, *shape]), node("Reshape", [new, f"{name}.shape"], [f"{name}.bshd"]),
            node("Transpose", [f"{name}.bshd"], [f"{name}.bhsd"], perm=[0, 2, 1, 3]),
            node("Shape", [f"{name}.bhsd"], [f"{name}.update_shape"]),
            node("Expand", [v.pos4, f"{name}.update_shape"], [f"{name}.rows"]),
            node("ScatterElements", [past, f"{name}.rows", f"{name}.bhsd"], [present], axis=2)]


def _decode_branch(v: _Names, query: str, keys: str, values: str, total: str, shape: tuple[int, int, int],
                   scale: float, out: str) -> list[onnx.NodeProto]:
    """Attention of a few new tokens over the written buffers' first `total` rows: the query heads of each key
    head stacked, [B, H_kv, G * S, D], against its keys in one MatMul, masked where a key lies past the query."""
    heads, kv_heads, d = shape
    g = heads // kv_heads
    node = helper.make_node
    return [node("Cast", [total], [v.t_scalar], to=TensorProto.INT64),
            node("Reshape", [v.t_scalar, v.one], [v.t]),
            node("Slice", [keys, v.zero, v.t, v.two], [v.keys]), node("Slice", [values, v.zero, v.t, v.two], [v.vals]),
            _const(v.q5_shape, [0, 0, kv_heads, g, d]), node("Reshape", [query, v.q5_shape], [v.q5]),
            node("Transpose", [v.q5], [v.q5t], perm=[0, 2, 3, 1, 4]),
            _const(v.q4_shape, [0, kv_heads, -1, d]), node("Reshape", [v.q5t, v.q4_shape], [v.q4]),
            node("FusedMatMul", [v.q4, v.keys], [v.scores], domain="com.microsoft", transB=1, alpha=float(scale)),
            node("Range", [v.z, v.t_scalar, v.o], [v.key_rows]),
            node("Unsqueeze", [v.pos, v.two], [v.pos3]), node("Greater", [v.key_rows, v.pos3], [v.later]),
            _const(v.neg, NEG, TensorProto.FLOAT), _const(v.nil, 0.0, TensorProto.FLOAT),
            node("Where", [v.later, v.neg, v.nil], [v.mask3]), _const(v.axes12, [1, 2]),
            node("Unsqueeze", [v.mask3, v.axes12], [v.mask]),
            _const(v.s5_head, [0, kv_heads, g, -1]), node("Concat", [v.s5_head, v.t], [v.s5_shape], axis=0),
            node("Reshape", [v.scores, v.s5_shape], [v.scores5]), node("Add", [v.scores5, v.mask], [v.masked]),
            node("Softmax", [v.masked], [v.probs5], axis=-1),
            _const(v.s4_head, [0, kv_heads, -1]), node("Concat", [v.s4_head, v.t], [v.s4_shape], axis=0),
            node("Reshape", [v.probs5, v.s4_shape], [v.probs]), node("MatMul", [v.probs, v.vals], [v.o4]),
            _const(v.o5_shape, [0, kv_heads, g, -1, d]), node("Reshape", [v.o4, v.o5_shape], [v.o5]),
            node("Transpose", [v.o5], [v.o5t], perm=[0, 3, 1, 2, 4]),
            _const(v.out_shape, [0, 0, heads * d]), node("Reshape", [v.o5t, v.out_shape], [out])]
