"""fuse_plugins: replace patterns in the TensorRT segments by mmtrt's CUDA plugins (mmtrt/kernels).

TensorRT runs token_prune's selection as a dozen small kernels plus a data-dependent gather (three dozen with
VisionZip's merge, about twenty for a dynamic budget, whatever the criterion), and an INT4 linear at
decode as a dequantize into a full fp16 weight before a GEMM; one fused kernel each reads the inputs once (see the
roofline estimate in docs/results/plugin-roofline.md). The pass places like the compiler does
(mmtrt.partition.placement) and fuses only chains whose every node lies in a TensorRT segment, so ONNX Runtime
segments keep their standard ops. A fused node carries its
decomposition as a local function (passes/fusion/plugin_nodes.py): ONNX Runtime, and TensorRT without the plugin,
still run it. Run it last: after token_prune, after awq_int4 with the TensorRT (DequantizeLinear) lowering and after
cast_precision, whose casts the patterns see through.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import numpy_helper

from mmtrt.ir.graph import ModelIR
from mmtrt.kernels import launch
from mmtrt.kernels.catalog import PLUGINS
from mmtrt.ir.graph import drop_dead, node_inputs
from mmtrt.partition.placement import TENSORRT, place_component
from mmtrt.pipeline.pass_base import Pass
from passes.fusion.graph_view import GraphView, NoMatch, NotCandidate, check
from passes.fusion.int4_gemm_match import Int4GemmMatch, int8_pairs, match_int4_gemm, np_type
from passes.fusion.plugin_nodes import add_function, plugin_node
from passes.fusion.token_select_dynamic_match import TokenSelectDynamicMatch, match_token_select_dynamic
from passes.fusion.token_select_match import TokenSelectMatch, match_token_select
from passes.fusion.token_select_merge_match import TokenSelectMergeMatch, match_token_select_merge
from passes.fusion.fuse_plugins_config import FusePluginsConfig

# recipe name -> (anchor op type, matcher, catalog key) per pattern it fuses; a match may name another key (a
# selection from a score the graph computes is a TokenSelectScored)
ANCHORS = {
    "token_select": [("Concat", match_token_select_merge, "token_select_merge"),
                     ("GatherND", match_token_select, "token_select"),
                     ("GatherND", match_token_select_dynamic, "token_select_dynamic")],
    "int4_gemm": [("MatMul", match_int4_gemm, "int4_gemm")],
}


class FusePlugins(Pass):
    name = "fuse_plugins"
    Config = FusePluginsConfig
    components = ("vision", "llm")

    def run(self, ir: ModelIR) -> dict:
        return {name: self._fuse(ir.components[name]) for name in self.components if name in ir.components}

    def _fuse(self, comp) -> dict:
        placement = place_component(comp)
        on_trt = {i for s in placement.segments if s.backend == TENSORRT for i in s.nodes}
        view = GraphView(comp.onnx.graph, on_trt, placement.facts.types, placement.facts.shapes)
        fused, skipped = Counter(), Counter()
        replacements: dict[int, list[onnx.NodeProto]] = {}
        weights: list[onnx.TensorProto] = []
        claimed: set[str] = set()  # nodes a fused merge replaces: not candidates for the plain selection
        for op_type, match, key in (a for name in self.config.plugins for a in ANCHORS[name]):
            for i, node in enumerate(comp.onnx.graph.node):
                if node.op_type != op_type or i not in on_trt or node.output[0] in claimed or i in replacements:
                    continue
                try:
                    found = match(view, node)
                    _check_shared_memory(found, view)
                except NotCandidate:
                    continue
                except NoMatch as why:
                    skipped[f"{key}: {why}"] += 1
                    continue
                claimed |= getattr(found, "claimed", set())
                replacements[i] = _plugin_for(found, weights, view)
                if isinstance(found, TokenSelectDynamicMatch):
                    replacements[view.index[found.count.output[0]]] = []  # the plugin gives the count
                key = getattr(found, "key", key)
                fused[PLUGINS[key].plugin_id] += 1
                add_function(comp.onnx, key)
        if replacements:
            _rewrite(comp.onnx, replacements, weights)
        return {"tensorrt_nodes": len(on_trt), "fused": dict(sorted(fused.items())),
                "not_fused": dict(sorted(skipped.items()))}


def _check_shared_memory(found, view: GraphView) -> None:
    """A selection kernel keeps an image's scores in dynamic shared memory; TensorRT's AOT launch does not opt in to
    more than launch.MAX_DYNAMIC_SMEM, so a selection fuses only where its largest image fits (an Int4GroupGemm uses
    static shared memory only)."""
    if isinstance(found, Int4GemmMatch):
        return
    features = _fixed(view, found.inputs[-1], 3)  # q, k, features or scores, features
    if features[1] is None:
        raise NoMatch(f"the token count of {found.inputs[-1]} is not fixed: the kernel's shared memory cannot be bounded")
    attrs, tokens = found.attributes, features[1]
    if getattr(found, "key", None) in ("token_select_scored", "token_select_dynamic"):
        need = launch.scored_bytes(tokens, attrs.get("most", attrs.get("keep")))
    else:
        k = _fixed(view, found.inputs[1], 4)
        if None in (k[2], k[3]):
            raise NoMatch(f"the keys {found.inputs[1]} have no fixed length: the kernel's shared memory cannot be bounded")
        need = launch.token_select_bytes(k[2], tokens, attrs["keep"], k[3], attrs.get("contextual", 0))
    check(need <= launch.MAX_DYNAMIC_SMEM, f"{tokens} tokens need {need} B of shared memory per image, over the "
          f"{launch.MAX_DYNAMIC_SMEM} B a kernel may take without opting in")


def _fixed(view: GraphView, name: str, rank: int) -> list[int | None]:
    shape = view.shapes.get(name) or [None] * rank
    return [d if isinstance(d, int) and d > 0 else None for d in shape] if len(shape) == rank else [None] * rank


def _plugin_for(found, weights: list[onnx.TensorProto], view: GraphView) -> list[onnx.NodeProto]:
    anchor = found.anchor
    if isinstance(found, TokenSelectMatch):
        spec = PLUGINS[found.key]
        return [plugin_node(spec, found.inputs, anchor.output[0], f"{anchor.name}/{spec.name}", **found.attributes)]
    if isinstance(found, TokenSelectDynamicMatch):
        count = found.count.output[0]
        return [plugin_node(PLUGINS["token_select_dynamic"], found.inputs, [anchor.output[0], f"{count}__int32"],
                            f"{anchor.name}/TokenSelectDynamic", **found.attributes),
                onnx.helper.make_node("Cast", [f"{count}__int32"], [count], name=f"{count}_cast",
                                      to=onnx.TensorProto.INT64)]
    if isinstance(found, TokenSelectMergeMatch):
        positions = [numpy_helper.from_array(found.target_at.astype(np.int32), f"{anchor.name}.target_at"),
                     numpy_helper.from_array(found.merged_at.astype(np.int32), f"{anchor.name}.merged_at")]
        weights += positions
        return _in_anchor_type(view, anchor, found.inputs[2], lambda out: plugin_node(
            PLUGINS["token_select_merge"], [*found.inputs, *(t.name for t in positions)], out,
            f"{anchor.name}/TokenSelectMerge", **found.attributes))
    pre = found.pre or _ones(found, weights)
    return [plugin_node(PLUGINS["int4_gemm"], [found.x, _packed(found, weights, view), found.scales, pre],
                        anchor.output[0], f"{anchor.name}/Int4GroupGemm", group_size=found.group)]


def _in_anchor_type(view: GraphView, anchor: onnx.NodeProto, features: str, make) -> list[onnx.NodeProto]:
    """The plugin computes in the features' type; where cast_precision lowered the merge (its Concat is fp16 while
    the features are fp32), a Cast gives the consumers the type they read."""
    want, have = view.types.get(anchor.output[0]), view.types.get(features)
    if want == have or want is None:
        return [make(anchor.output[0])]
    inner = f"{anchor.output[0]}__plugin"
    return [make(inner), onnx.helper.make_node("Cast", [inner], [anchor.output[0]], name=f"{inner}_cast", to=want)]


def _packed(found: Int4GemmMatch, weights: list[onnx.TensorProto], view: GraphView) -> str:
    """The INT4 weight as the plugin's int8 pairs, one initializer per weight."""
    name = f"{found.weight}.int8_pairs"
    if not any(t.name == name for t in weights):
        weights.append(numpy_helper.from_array(int8_pairs(numpy_helper.to_array(view.weights[found.weight])), name))
    return name


def _ones(found: Int4GemmMatch, weights: list[onnx.TensorProto]) -> str:
    """The pre-quant scale of a linear without one: ones [K], one per size and type (the kernel always scales)."""
    dtype = np_type(found.dtype)
    name = f"fuse_plugins.ones.k{found.k}.{np.dtype(dtype).name}"
    if not any(t.name == name for t in weights):
        weights.append(numpy_helper.from_array(np.ones(found.k, dtype), name))
    return name


def _rewrite(model: onnx.ModelProto, replacements: dict[int, list[onnx.NodeProto]],
             weights: list[onnx.TensorProto]) -> None:
    """Put each plugin node where its anchor was, then drop what no longer feeds an output."""
    graph = model.graph
    nodes = [m for i, n in enumerate(graph.node) for m in replacements.get(i, [n])]
    del graph.node[:]
    graph.node.extend(_in_dependency_order(nodes))
    graph.initializer.extend(weights)
    drop_dead(graph)


def _in_dependency_order(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes in their order, except that a node waits for the producers of its inputs (a plugin that gives a
    tensor its anchor did not make, such as TokenSelectDynamic's count, sits after the count's old readers)."""
    made = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    done, order = set(), []
    for start in range(len(nodes)):
        stack = [start]
        while stack:
            i = stack[-1]
            if i in done:
                stack.pop()
                continue
            waiting = [made[x] for x in node_inputs(nodes[i]) if x in made and made[x] not in done and made[x] != i]
            if waiting:
                stack.extend(waiting)
                continue
            done.add(i)
            order.append(nodes[i])
            stack.pop()
    return order
