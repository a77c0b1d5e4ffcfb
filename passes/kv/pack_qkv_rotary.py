"""pack_qkv_rotary: GroupQueryAttention reads the fused q/k/v projection whole and applies the rotary embedding itself.

After `kv_layout: static` and `fuse_projections`, each layer runs its one q/k/v MatMulNBits, a Split into q, k, v
and two ONNX `RotaryEmbedding` nodes before GroupQueryAttention: three nodes and three copies of the projection per
layer and token (profiled on zoo:dino-smollm: Split and the two rotaries about 4 % of a decode step). ONNX
Runtime's GroupQueryAttention takes the packed projection as its query (key and value left empty) and, with
`do_rotary`, rotates q and k itself from `cos_cache` / `sin_cache` [positions, D/2] at the positions it derives
from `seqlens_k` (past length + i: the positions the static layout's runtime feeds as `position_ids`), which is
onnxruntime-genai's form. The caches are the graph's own cos/sin subgraph evaluated on positions
0..max_position_embeddings-1, so the rotary variant (scaling, base) is whatever the exporter wrote. Only layers
whose rotaries read the Split of one projection, in q, k, v order, are rewritten, and only when every rotary's
cos/sin evaluate to the same cache.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from mmtrt.errors import UserError
from mmtrt.ir import source_weights
from mmtrt.ir.graph import ModelIR
from mmtrt.ir.rewrite import attr, cleanup, producers
from mmtrt.pipeline.pass_base import Pass, PassConfig

POSITIONS = "position_ids"
COS, SIN = "pack_qkv_rotary.cos_cache", "pack_qkv_rotary.sin_cache"


class PackQkvRotary(Pass):
    name = "pack_qkv_rotary"
    Config = PassConfig
    components = ("llm",)
    requires = frozenset({"kv_layout"})
    reads_source_weights = True  # rewires attention; only the rotary tables' small constants are read

    def run(self, ir: ModelIR) -> dict:
        comp = ir.components["llm"]
        graph = comp.onnx.graph
        if ir.config.get("kv_cache", {}).get("layout") != "static":
            raise UserError("pack_qkv_rotary rewrites the static layout's GroupQueryAttention; use kv_layout: "
                            "{layout: static} before it")
        layers = [m for m in (_match(graph, n) for n in graph.node if n.op_type == "GroupQueryAttention") if m]
        if not layers:
            return {"llm": {"layers_packed": 0, "reason": "no GroupQueryAttention reads a Split of one projection "
                                                          "through RotaryEmbedding (run fuse_projections first)"}}
        positions = ir.config["llm"]["max_position_embeddings"]
        caches = _one_cache(comp.onnx, [r for layer in layers for r in layer[1:3]], positions)
        if caches is None:
            return {"llm": {"layers_packed": 0, "reason": "the layers' rotary cos/sin differ; one cache cannot serve"}}
        cos, sin = caches
        graph.initializer.extend([numpy_helper.from_array(cos, COS), numpy_helper.from_array(sin, SIN)])
        for gqa, q_rot, k_rot, split in layers:
            gqa.input[:] = [split.input[0], "", "", *gqa.input[3:7], COS, SIN]
            gqa.attribute.extend([helper.make_attribute("do_rotary", 1),
                                  helper.make_attribute("rotary_interleaved", attr(q_rot, "interleaved", 0))])
            for node in (q_rot, k_rot, split):
                graph.node.remove(node)
        comp.set_graph(cleanup(comp.onnx))
        return {"llm": {"layers_packed": len(layers), "cos_cache": list(cos.shape)}}


def _one_cache(model: onnx.ModelProto, rotaries: list[onnx.NodeProto], positions: int
               ) -> tuple[np.ndarray, np.ndarray] | None:
    """The cos and sin every rotary reads, or None where they differ. Each distinct pair is compared with the first
    as it is evaluated, not kept: the export gives each layer's q and k rotary a pair of its own (48 for Qwen2-0.5B,
    8 MB a pair at 32,768 positions), and keeping them all took the compile 0.6 GB."""
    first, seen = None, set()
    for rotary in rotaries:
        key = tuple(rotary.input[1:3])
        if key in seen:
            continue
        seen.add(key)
        cos, sin = _caches(model, rotary, positions)
        if first is None:
            first = cos, sin
        elif not (np.array_equal(cos, first[0]) and np.array_equal(sin, first[1])):
            return None
    return first


def _match(graph: onnx.GraphProto, gqa: onnx.NodeProto):
    """(gqa, q rotary, k rotary, split) when the layer has the fusable form, else None."""
    prods = producers(graph)
    q_rot, k_rot = prods.get(gqa.input[0]), prods.get(gqa.input[1])
    if not (q_rot and k_rot and q_rot.op_type == k_rot.op_type == "RotaryEmbedding"):
        return None
    split = prods.get(q_rot.input[0])
    if (split is None or split.op_type != "Split" or list(split.output) != [q_rot.input[0], k_rot.input[0],
                                                                            gqa.input[2]]
            or len(q_rot.input) != 3 or len(k_rot.input) != 3
            or attr(q_rot, "rotary_embedding_dim", 0) or attr(k_rot, "rotary_embedding_dim", 0)):
        return None
    uses = [name for node in graph.node for name in node.input]
    if any(uses.count(out) != 1 for out in split.output) or attr(split, "axis", 0) not in (-1, 2):
        return None
    return gqa, q_rot, k_rot, split


def _caches(model: onnx.ModelProto, rotary: onnx.NodeProto, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """The graph's cos and sin [1, S, D/2] computed from position_ids alone, evaluated at 0..positions-1."""
    graph = model.graph
    prods, inits = producers(graph), {t.name: t for t in graph.initializer}
    nodes, seen, todo = [], set(), list(rotary.input[1:3])
    while todo:
        name = todo.pop()
        if name in seen or name in inits or not name:
            continue
        seen.add(name)
        node = prods.get(name)
        if node is None:
            if name != POSITIONS:
                raise UserError(f"pack_qkv_rotary: the rotary cos/sin read graph input {name}, not only "
                                f"{POSITIONS}; drop the pass for this model")
            continue
        nodes.append(node)
        todo.extend(node.input)
    used, chosen = {i for n in nodes for i in n.input}, {o for n in nodes for o in n.output}
    sub = helper.make_graph(
        [n for n in graph.node if n.output[0] in chosen], "rotary_cache",  # the graph's own (topological) order
        [helper.make_tensor_value_info(POSITIONS, onnx.TensorProto.INT64, [1, "seq"])],
        [helper.make_empty_tensor_value_info(n) for n in rotary.input[1:3]],
        [source_weights.held(inits[n]) for n in used if n in inits])
    sub_model = helper.make_model(sub, opset_imports=model.opset_import, ir_version=model.ir_version)
    sess = ort.InferenceSession(sub_model.SerializeToString(), providers=["CPUExecutionProvider"])
    cos, sin = sess.run(None, {POSITIONS: np.arange(positions, dtype=np.int64)[None]})
    return cos.reshape(positions, -1), sin.reshape(positions, -1)
