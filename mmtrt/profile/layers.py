"""Which transformer layer each node of a component's graph belongs to, in the names the passes use.

`awq_int4` and `channel_prune` name linears `llm.layers.3.q_proj` from the graph structure (`quant/linears.py`);
a layer's bucket here is `llm.layers.3`, so a slow layer in the profile is the layer a pass config names. A node
belongs to the bucket of the latest linear it depends on (itself included): a layer runs from its first linear
to the next layer's first linear, so the residual add and the next layer's input norm count in the layer before.
Nodes that depend on no linear (patch embedding, rotary tables, masks) are `<component>.pre_layers`; the vision
projector's two linears are `vision.projector`, the LLM's output linear `llm.lm_head`; a linear the structure
names no layer for keeps its `<component>.linear.<i>` name as its bucket (as in awq_int4's reports).
"""

from __future__ import annotations

import onnx

from mmtrt.quant.linears import find_linears


def layer_buckets(model: onnx.ModelProto, component: str) -> tuple[dict[str, str], list[str]]:
    """Node name -> bucket for every node of the graph, and the buckets in execution order."""
    _, linears, _ = find_linears(model, component)
    projector = {n.name for n in projector_matmuls(model.graph)} if component == "vision" else set()
    seeds = {lin.node.name: _linear_bucket(component, lin, lin.node.name in projector) for lin in linears}
    order = [f"{component}.pre_layers"] + list(dict.fromkeys(seeds.values()))
    rank = {bucket: i for i, bucket in enumerate(order)}
    tensor_rank: dict[str, int] = {}
    buckets = {}
    for node in model.graph.node:
        r = max([rank[seeds[node.name]]] if node.name in seeds else [0])
        r = max([r, *(tensor_rank.get(name, 0) for name in node.input if name)])
        for out in node.output:
            tensor_rank[out] = r
        buckets[node.name] = order[r]
    return buckets, order


def projector_matmuls(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """LLaVA's projector is linear, activation, linear: walking back from the vision output along computed
    inputs, its MatMuls are the first two met (as token_prune finds the projector)."""
    made = {out: node for node in graph.node for out in node.output}
    name, found = graph.output[0].name, []
    while name in made and len(found) < 2:
        node = made[name]
        if node.op_type == "MatMul":
            found.append(node)
        name = next((i for i in node.input if i in made and made[i].op_type != "Constant"), None)
    return found[::-1] if len(found) == 2 else []


def _linear_bucket(component: str, lin, in_projector: bool) -> str:
    if in_projector:
        return f"{component}.projector"
    if lin.role == "lm_head":
        return f"{component}.lm_head"
    if lin.layer is not None:
        return f"{component}.layers.{lin.layer}"
    return lin.name
