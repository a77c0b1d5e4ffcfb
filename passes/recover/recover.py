"""recover: refit the projector (LLaVA's bridge) after lossy passes, by distillation from the source model.

Quantizing or pruning the LLM, or pruning image tokens, changes what the LLM makes of the image features; the
projector is small (2 MB on dino-smollm) and decides them alone, so refitting it to the lossy model recovers part of
what was lost (for token_prune: a projector fitted to the kept token set, as FasterVLM and VisionZip do). The
teacher is the source PyTorch model; the student's forward pass is the IR's own graphs in ONNX Runtime
(mmtrt/recover/distill.py says how the gradient is formed). Training images come from the digits train split (the
evaluation's held-out split is never read); a second, disjoint slice of the train split scores the loss before and
after, and the weights with the lowest held-out loss (possibly the untouched ones) are written back into the vision
graph's initializers. Everything else in the IR stays as it was. The pass's time is in build_report.json
(pass_times_ms), not in the manifest, which must not change between runs.
"""

from __future__ import annotations

from typing import Any

import onnx

from mmtrt.errors import UserError
from mmtrt.ir.graph import ModelIR
from mmtrt.ir.rewrite import producers
from mmtrt.pipeline.pass_base import Pass
from mmtrt.pipeline.source import current_source
from mmtrt.recover import distill
from passes.vision.token_prune import projector_entry
from passes.recover.recover_config import RecoverConfig


class Recover(Pass):
    name = "recover"
    Config = RecoverConfig
    components = ("vision",)
    lossy = True  # it changes outputs, so the accuracy budgets measure it like the passes it follows

    def plan_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        if "anyres" in facts["vision"]:
            raise UserError(f"recover distills through one fixed-size image per prompt; this {facts['architecture']} "
                            "model tiles each image (any resolution), which it does not follow; remove recover")
        return facts

    def run(self, ir: ModelIR) -> dict[str, Any]:
        cfg = self.config
        source = current_source()
        if source is None:
            raise UserError("recover needs the source model, which only `mmtrt compile` holds; run it from a recipe")
        llava = source[0]
        vision = ir.components["vision"].onnx
        site = find_site(vision, llava.model.multi_modal_projector)
        projector = distill.load_projector(vision, site, llava.model.multi_modal_projector)
        fit, held = self._data(ir, llava, site)
        student = distill.Student(ir, llava, projector, cfg.loss, cfg.positions)
        result = distill.train(student, fit, held, cfg.epochs, cfg.batch, cfg.lr, cfg.seed)
        written = distill.write_back(vision, site, projector)
        curve = result["heldout_loss_per_epoch"]
        return {
            "trained": {"projector": written,
                        "parameters": sum(p.numel() for p in projector.parameters())},
            "samples": {"train": len(fit), "heldout": len(held), "split": "digits train (disjoint slices)"},
            "loss": cfg.loss,
            "positions": cfg.positions,
            "heldout_loss_before": curve[0],
            "heldout_loss_after": curve[result["best_epoch"]],
            "recovered_fraction": float(f"{1 - curve[result['best_epoch']] / curve[0]:.4g}") if curve[0] else 0.0,
            **result,
            "optimizer_steps": cfg.epochs * -(-len(fit) // cfg.batch),
        }

    def _data(self, ir: ModelIR, llava, site) -> tuple[list, list]:
        from mmtrt.eval import digits

        cfg = self.config
        page = ir.components["preprocess"].outputs[0].shape[-1]
        shown = [(img, digits.PROMPT) for img, _ in digits.samples("train", cfg.samples + cfg.heldout, page=page)]
        if len(shown) < cfg.samples + cfg.heldout:
            raise UserError(f"recover: samples + heldout ({cfg.samples + cfg.heldout}) exceed the digits train split "
                            f"({len(shown)} images); lower them")
        data = distill.samples(ir, llava, site, shown)
        return data[:cfg.samples], data[cfg.samples:]


def find_site(vision: onnx.ModelProto, projector) -> distill.Site:
    """The projector's MatMul/Add initializers on the path from its first MatMul to the graph's output."""
    graph = vision.graph
    entry = projector_entry(graph)
    inits = {t.name: t for t in graph.initializer}
    made = producers(graph)
    slots, name = [], graph.output[0].name
    while name in made:
        node = made[name]
        if node.op_type in ("MatMul", "Add"):
            slots += [(node, k) for k, i in enumerate(node.input) if i in inits]
        if node is entry:
            break
        name = next((i for i in node.input if i in made and made[i].op_type != "Constant"), None)
    slots.reverse()
    names = [node.input[k] for node, k in slots]
    params = list(projector.parameters())
    shapes = [tuple(inits[n].dims) for n in names]
    wanted = [tuple(p.shape[::-1]) for p in params]
    if shapes != wanted or any(inits[n].data_type != onnx.TensorProto.FLOAT for n in names):
        raise UserError(f"recover: the vision graph's projector ({shapes}) is not the source's float projector "
                        f"({wanted}); place recover before passes that quantize or cast the vision component")
    return distill.Site(entry.input[0], names, slots)
