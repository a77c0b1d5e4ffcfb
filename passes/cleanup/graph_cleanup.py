"""graph_cleanup: fold constants, drop Identity nodes and remove dead nodes and initializers.

Every other pass can leave dead subgraphs behind; this one makes them disappear from the bundle.
"""

from __future__ import annotations

from mmtrt.ir.graph import ModelIR
from mmtrt.ir.rewrite import cleanup, replace_uses
from mmtrt.pipeline.pass_base import Pass
from passes.cleanup.graph_cleanup_config import GraphCleanupConfig


class GraphCleanup(Pass):
    name = "graph_cleanup"
    Config = GraphCleanupConfig
    components = ("vision", "embed", "llm")

    def run(self, ir: ModelIR) -> dict:
        changes = {}
        for name in self.components:
            comp = ir.components[name]
            identities = _drop_identities(comp.onnx)
            nodes, inits = len(comp.onnx.graph.node), len(comp.onnx.graph.initializer)
            comp.onnx = cleanup(comp.onnx, fold_constants=self.config.fold_constants)
            changes[name] = {
                "identities_removed": identities,
                "nodes_removed": nodes - len(comp.onnx.graph.node),
                "initializers_removed": inits - len(comp.onnx.graph.initializer),
            }
        return changes


def _drop_identities(model) -> int:
    """Bypass Identity nodes whose output is not a graph output; cleanup then removes them."""
    outputs = {o.name for o in model.graph.output}
    dropped = 0
    for node in list(model.graph.node):
        if node.op_type == "Identity" and node.output[0] not in outputs:
            replace_uses(model.graph, node.output[0], node.input[0])
            dropped += 1
    return dropped
