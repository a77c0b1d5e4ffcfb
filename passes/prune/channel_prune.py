"""channel_prune: remove whole MLP channels and attention heads, so the model is smaller and faster everywhere.

Unstructured sparsity needs special kernels; removing whole channels gives every backend plain smaller matrices.
Per component, `mlp` removes that share of every layer's MLP hidden channels (gate and up columns with down rows
for gated MLPs, fc1 columns and bias with fc2 rows otherwise) and `heads` that share of every layer's attention
heads (Q, K, V columns and biases with the output projection's rows; with grouped-query attention whole KV groups,
so the KV cache shrinks too). Every layer keeps the same count, so the model facts (heads, KV heads) stay uniform
and TensorRT-LLM's config still describes the model; which units a layer keeps is its own ranking by `l2` (DepGraph)
or `activation` (Minitron) importance. The removed units' mean contribution on calibration data goes into the
consuming linear's bias (FLAP's compensation), which the layer after it would otherwise miss. Calibration data is
the digits task and English text, or the recipe's own (`calibration: {images: recipe, text: recipe}`). The component's
external I/O is unchanged, but for the LLM's KV cache when KV groups go. No retraining: the accuracy cost is
reported by the eval suites (recipe `budgets` / `evaluate`).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import numpy as np

from mmtrt.ir.flops import count_flops
from mmtrt.ir.graph import ModelIR
from mmtrt.pipeline.pass_base import Pass
from mmtrt.prune.groups import PruneGroup, bias_of, find_groups
from mmtrt.prune.importance import activation_stats, kept_count, kept_units, l2_scores
from mmtrt.prune.slicing import prune_graph
from mmtrt.quant.calibration import calibration_batches
from mmtrt.quant.linears import GraphIndex, Linear
from passes.prune.channel_prune_config import ChannelPruneConfig, Ratios

LLM_FLOP_TOKENS = 128  # the prefill the LLM's FLOPs are reported at


class ChannelPrune(Pass):
    name = "channel_prune"
    Config = ChannelPruneConfig
    components = ("vision", "llm")
    lossy = True

    def plan_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        heads = self.config.llm.heads
        if not heads:
            return facts
        out = copy.deepcopy(facts)
        llm = out["llm"]
        kv = kept_count(llm["num_kv_heads"], heads, "heads", 1)
        llm["num_heads"], llm["num_kv_heads"] = llm["num_heads"] // llm["num_kv_heads"] * kv, kv
        return out

    def run(self, ir: ModelIR) -> dict:
        wanted = {name: getattr(self.config, name) for name in ("vision", "llm")}
        wanted = {name: r for name, r in wanted.items() if r.mlp or r.heads}
        report: dict[str, Any] = {"importance": self.config.importance}
        if not wanted:
            return {**report, "graph_changed": False}
        batches = self._batches(ir)
        for name, ratios in wanted.items():
            comp = ir.components[name]
            groups = [g for g in find_groups(comp.onnx, name) if (ratios.mlp if g.kind == "mlp" else ratios.heads)]
            scores, means = self._stats(comp.onnx, groups, batches.get(name))
            kept = self._decide(groups, ratios, scores)
            before = _measure(comp.onnx, name)
            predicted = _params_removed(comp.onnx, groups, kept, self.config.bias_compensation)
            comp.set_graph(prune_graph(comp.onnx, groups, kept, means if self.config.bias_compensation else None))
            report[name] = _component_report(groups, kept, before, _measure(comp.onnx, name), predicted)
        ir.config = self.plan_facts(ir.config)
        return {**report, "graph_changed": True}

    def _batches(self, ir: ModelIR) -> dict[str, list]:
        if not self.config.calibrates:
            return {}
        cal = self.config.calibration
        batches = calibration_batches(ir, cal.images, cal.samples, cal.text_windows, cal.text)
        return {"vision": batches.vision, "llm": batches.llm}

    def _stats(self, model, groups: list[PruneGroup], batches) -> tuple[dict[str, np.ndarray], dict | None]:
        """Scores per group, and the activation means when calibration ran."""
        scores, means = activation_stats(model, groups, batches) if self.config.calibrates and groups else ({}, None)
        if self.config.importance == "l2":
            scores = {g.label: l2_scores(model, g) for g in groups}
        return scores, means

    def _decide(self, groups: list[PruneGroup], ratios: Ratios, scores: dict) -> dict[str, np.ndarray]:
        kept = {}
        for g in groups:
            count = kept_count(g.units, ratios.mlp if g.kind == "mlp" else ratios.heads, g.kind, self.config.multiple)
            kept[g.label] = kept_units(scores[g.label], count)
        return kept


def _params_removed(model, groups: list[PruneGroup], kept: dict[str, np.ndarray], compensate: bool) -> int:
    """What slicing will remove, from the shapes alone: every pruned use of an initializer gets a sliced copy
    (its size over the units times the units kept), an initializer all of whose uses were sliced goes, and
    compensation gives each pruned group's consumer a bias of its own (replacing the use of any it had)."""
    index = GraphIndex(model.graph)
    sizes = {t.name: int(np.prod(t.dims)) for t in model.graph.initializer}
    uses = Counter(name for node in model.graph.node for name in node.input if name in sizes)
    sliced: Counter = Counter()
    added = 0
    for g in (g for g in groups if len(kept[g.label]) < g.units):
        for m in g.members:
            sliced[m.name] += 1
            added += sizes[m.name] // g.units * len(kept[g.label])
        if compensate:
            consumer = g.consumer
            n_out = index.initializers[consumer.name].dims[1]
            added += n_out
            for node, slot in bias_of(index, Linear(consumer.node, consumer.name, g.units, n_out)):
                sliced[node.input[slot]] += 1
    return sum(sizes[name] for name, n in sliced.items() if n == uses[name]) - added


def _measure(model, component: str) -> dict[str, int]:
    dims = {"num_images": 1} if component == "vision" else {"batch": 1, "seq": LLM_FLOP_TOKENS, "past": 0,
                                                             "total": LLM_FLOP_TOKENS}
    floats = sum(int(np.prod(t.dims)) for t in model.graph.initializer if t.data_type in (1, 10, 16))
    return {"params": floats, "flops": count_flops(model, dims)}


def _component_report(groups: list[PruneGroup], kept: dict[str, np.ndarray], before: dict, after: dict,
                      predicted: int) -> dict[str, Any]:
    layers = []
    for g in groups:
        removed = np.setdiff1d(np.arange(g.units), kept[g.label])
        unit = "channels" if g.kind == "mlp" else ("heads" if g.queries_per_unit == 1 else "kv_groups")
        layers.append({"layer": g.label, unit + "_before": g.units, unit + "_after": len(kept[g.label]),
                       "removed": removed.tolist()})
    return {
        "layers": layers,
        "params_before": before["params"], "params_after": after["params"],
        "params_removed_predicted": predicted, "params_removed": before["params"] - after["params"],
        "params_reduction_pct": round(100 * (before["params"] - after["params"]) / before["params"], 2),
        "flops_before": before["flops"], "flops_after": after["flops"],
        "flops_reduction_pct": round(100 * (before["flops"] - after["flops"]) / before["flops"], 2),
        "flops_at": "one image" if groups and groups[0].component == "vision" else f"{LLM_FLOP_TOKENS}-token prefill",
    }
