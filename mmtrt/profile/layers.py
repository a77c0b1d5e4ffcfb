"""Which transformer layer each node of a component's graph belongs to, in the names the passes use.

`awq_int4` and `channel_prune` name linears `llm.layers.3.q_proj` from the graph structure (`quant/linears.py`);
a layer's bucket here is `llm.layers.3`, so a slow layer in the profile is the layer a pass config names. A node
belongs to the bucket of the latest linear it depends on (itself included): a layer runs from its first linear
to the next layer's first linear, so the residual add and the next layer's input norm count in the layer before.
Nodes that depend on no linear (patch embedding, rotary tables, masks) are `<component>.pre_layers`; linears
after the last layer are the vision `projector` or the LLM's `lm_head`.
"""

from __future__ import annotations

import onnx

from mmtrt.quant.linears import find_linears


def layer_buckets(model: onnx.ModelProto, component: str) -> tuple[dict[str, str], list[str]]:
    """Node name -> bucket for every node of the graph, and the buckets in execution order."""
    _, linears, _ = find_linears(model, component)
    seeds = {lin.node.name: _linear_bucket(component, lin) for lin in linears}
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


def _linear_bucket(component: str, lin) -> str:
    if lin.layer is not None and lin.role != "lm_head":
        return f"{component}.layers.{lin.layer}"
    if lin.role == "lm_head":
        return f"{component}.lm_head"
    return f"{component}.projector" if component == "vision" else f"{component}.head"
