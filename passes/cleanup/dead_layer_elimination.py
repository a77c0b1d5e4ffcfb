"""dead_layer_elimination: remove the vision encoder layers after LLaVA's feature layer.

LLaVA reads the tower's second-to-last hidden state, yet the tower (as Hugging Face runs it) computes every
layer. The lowered graph stacks all hidden states and selects one; selecting straight from the source makes
the later layers dead, and cleanup removes them.
"""

from __future__ import annotations

from mmtrt.ir.flops import count_flops
from mmtrt.ir.graph import ModelIR
from mmtrt.ir.hidden_states import stacked_selects
from mmtrt.ir.rewrite import cleanup, replace_uses
from mmtrt.pipeline.pass_base import Pass, PassConfig


class DeadLayerElimination(Pass):
    name = "dead_layer_elimination"
    Config = PassConfig
    components = ("vision",)
    requires = frozenset({"vision.hidden_state_stack"})
    removes = frozenset({"vision.hidden_state_stack"})

    def run(self, ir: ModelIR) -> dict:
        comp = ir.components["vision"]
        flops_before = count_flops(comp.onnx, {"num_images": 1})
        layers_before = _count(comp.onnx, "Attention")
        selected = _bypass_stack_selects(comp.onnx.graph)
        comp.onnx = cleanup(comp.onnx)
        flops_after = count_flops(comp.onnx, {"num_images": 1})
        layers_after = _count(comp.onnx, "Attention")
        return {
            "selects_bypassed": selected,
            "layers_removed": layers_before - layers_after,
            "encoder_layers_kept": layers_after,
            "flops_per_image_before": flops_before,
            "flops_per_image_after": flops_after,
            "flops_saved_pct": round(100 * (flops_before - flops_after) / flops_before, 2),
        }


def _count(model, op_type: str) -> int:
    return sum(n.op_type == op_type for n in model.graph.node)


def _bypass_stack_selects(graph) -> int:
    """Rewrite Gather(Concat(Unsqueeze(h_0), ..., Unsqueeze(h_n)), i) on axis 0 into h_i."""
    selects = stacked_selects(graph)
    for output, source in selects.items():
        replace_uses(graph, output, source)
    return len(selects)
