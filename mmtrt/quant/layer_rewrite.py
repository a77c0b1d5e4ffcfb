"""A component's graph rewritten as its searches finish, one decoder layer at a time, so that quantizing holds the
INT4 graph and one layer's float weights, never a float32 copy of the component.

Once the last group that scales a linear (its own, or the one whose inverse scale its output channels absorb) has
been searched, the linear's folded weight is computed from its source (`Folds.weight`), rounded, lowered, and
its INT4 initializers go into the graph (in the order of the linears, so the bytes do not depend on when each
layer finished). Node edits wait for `finish`, as do the initializers that must sit before the INT4 ones (folded
float weights of linears that stay float, norm weights, pre-quant scales): until then the graph's nodes and
original weights are unchanged, and every calibration stage of a later layer reads the float graph. With a float
budget, which linears stay float is decided over the whole component, so the rounded linears wait for `finish`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from mmtrt.ir import spill
from mmtrt.ir.rewrite import import_domain
from mmtrt.quant.fold import Folds, awq_weight_name
from mmtrt.quant.linears import GraphIndex, Group, Linear
from mmtrt.quant.lowering import (Candidate, QuantizedLinear, Settings, drop_unused_initializers, fp16_weight,
                                  kept_float, rebuild_nodes, round_linear, sig)


@dataclass
class GroupPlan:
    """A searched group: its scale, each linear's clip ratios (None: no clipping) and, for GPTQ or mixed precision,
    the Hessian X^T X of the input the scaled weights see (x / s)."""

    scale: np.ndarray
    clips: list[np.ndarray | None]
    hessian: np.ndarray | None = None


class LayerRewrite:
    def __init__(self, model: onnx.ModelProto, index: GraphIndex, linears: list[Linear], groups: list[Group],
                 settings: Settings):
        self.model, self.linears, self.groups, self.settings = model, linears, groups, settings
        self.folds = Folds(index, linears)
        members = [(gi, lin) for gi, g in enumerate(groups) for lin in g.linears]
        self.position = {id(lin.node): p for p, (_, lin) in enumerate(members)}  # the order the graph takes them in
        self.group_of = {id(lin.node): gi for gi, lin in members}
        last = dict(self.group_of)
        for gi, g in enumerate(groups):
            if g.absorber and g.absorber[0] == "linear":
                last[id(g.absorber[1].node)] = max(gi, last.get(id(g.absorber[1].node), gi))
        self.due: dict[int, list[Linear]] = {}  # group -> the selected linears whose weights are final after it
        for lin in linears:
            if id(lin.node) in self.group_of:
                self.due.setdefault(last[id(lin.node)], []).append(lin)
        self.plans: dict[int, GroupPlan] = {}
        self.prequant: dict[int, np.ndarray | None] = {}
        self.ready: dict[int, Candidate] = {}
        self.written = 0  # candidates written, a prefix of `position`'s order
        self.tail = 0  # initializers written at the end of the graph
        self.names: set[str] = set()
        self.replaced: dict[str, list[onnx.NodeProto]] = {}
        self.quantized: list[QuantizedLinear] = []
        self.errors: dict[int, tuple[str, dict]] = {}

    def add(self, gi: int, plan: GroupPlan) -> tuple[str, np.ndarray | None] | None:
        """Fold the searched group `gi`'s scale, then round and write every linear it completes; returns the fold
        (how, the pre-quant scale) or None for s = 1."""
        fold = self.folds.add(self.groups[gi], plan.scale)
        self.plans[gi], self.prequant[gi] = plan, fold and fold[1]
        for lin in self.due.pop(gi, []):
            self._round(lin)
        if not self.settings.float_budget:
            while self.written in self.ready:
                self._write(self.ready.pop(self.written))
        return fold

    def finish(self) -> tuple[list[QuantizedLinear], dict]:
        """Decide the float budget, write what waited, and edit the nodes; returns the quantized linears and the
        report's `own_output_rel_mse`, `kept_float` and `task_sensitivity` (those that apply)."""
        settings, report = self.settings, {}
        if settings.float_budget:
            candidates = [self.ready.pop(p) for p in sorted(self.ready)]
            kept, scores = kept_float(candidates, self.folds.weight, settings)
            report["kept_float"] = sorted(kept)
            if scores is not None:
                report["task_sensitivity"] = {name: sig(v) for name, v in scores.items()}
            for c in candidates:
                if c.linear.name not in kept:
                    self._write(c)
                elif settings.float_dtype == "float16":
                    lin = c.linear
                    self.replaced[lin.output], stored = fp16_weight(lin, self.folds.input(lin), self.folds.weight(lin))
                    self._append([stored])
        graph = self.model.graph
        rebuild_nodes(graph, self.folds.apply(self.linears), self.replaced)
        drop_unused_initializers(graph)
        at = len(graph.initializer) - self.tail
        floats = [lin for lin in self.linears if self.folds.touched(lin) and lin.output not in self.replaced]
        for lin in floats:  # before the norm weights and the INT4 initializers, as the float fold wrote them
            graph.initializer.insert(at, numpy_helper.from_array(self.folds.weight(lin), awq_weight_name(lin)))
            at += 1
        for tensor in self.folds.initializers:
            graph.initializer.insert(at, tensor)
            at += 1
        if settings.lowering == "matmulnbits":
            import_domain(self.model, "com.microsoft")
        if self.errors:
            report["own_output_rel_mse"] = dict(self.errors[p] for p in sorted(self.errors))
        return self.quantized, report

    def _round(self, lin: Linear) -> None:
        gi = self.group_of[id(lin.node)]
        plan = self.plans[gi]
        clip = plan.clips[self.groups[gi].linears.index(lin)]
        candidate = round_linear(lin, lambda columns: self.folds.weight(lin, columns), self.folds.dtype(lin),
                                 self.folds.input(lin), clip, self.prequant[gi], plan.hessian, self.settings)
        position = self.position[id(lin.node)]
        self.ready[position] = candidate
        if candidate.error is not None:
            self.errors[position] = (lin.name, candidate.error)
        if all(id(other.node) in self.ready or self.position[id(other.node)] < self.written
               for other in self.groups[gi].linears):
            plan.hessian = None  # every linear of the group is rounded

    def _write(self, c: Candidate) -> None:
        """Replace the linear's MatMul by its lowering, its initializers into the graph (the group sums' constants that
        linears share, once)."""
        stored = [t for t in c.initializers if t.name not in self.names]
        self.replaced[c.linear.output] = c.nodes
        self.quantized.append(c.quantized(stored, self.settings.keep_arrays))
        self._append(stored)
        self.written += 1

    def _append(self, tensors: list[onnx.TensorProto]) -> None:
        for t in tensors:
            spill.made(self.model, t)
            self.model.graph.initializer.append(t)
            self.names.add(t.name)
        self.tail += len(tensors)
