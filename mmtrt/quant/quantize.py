"""Quantize the linears of one ONNX component to INT4 in place: calibrate, search (AWQ or plain RTN), fold the
scales into the graph, and lower every quantized linear for the backend that will run it (mmtrt/quant/lowering.py).

Every search reads the activations of the unmodified float graph (as the reference implementations do: scaling
alone does not change any output). Calibration runs one decoder layer at a time (mmtrt/quant/layerwise.py): the
searches of a layer's groups run, and its statistics are dropped, before the next layer's are gathered.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mmtrt.quant.awq import (GroupStats, ModuleLoss, OwnLoss, ScaleResult, effective_weight, scaled_blocks, search_clip,
                             search_scale)
from mmtrt.quant.layerwise import captured
from mmtrt.quant.linears import GraphIndex, Group, Linear, find_linears, region_inputs
from mmtrt.quant.lowering import GPTQ, QuantizedLinear, Settings, lower_linears, replace_nodes, sig

__all__ = ["QuantizedLinear", "Settings", "fold_scales", "quantize_component"]

NO_CLIP_ROLES = ("q_proj", "k_proj")  # as the reference: clipping them too measured no better on dino-smollm
SCALED = ("awq", "awq_gptq")  # methods that search AWQ's scale


@dataclass
class _Plan:
    """A group's search result: its scale, each linear's clip ratios (None: no clipping) and, for GPTQ or mixed
    precision, the Hessian X^T X of the input the scaled weights see (x / s)."""

    result: ScaleResult
    clips: list[np.ndarray | None]
    hessian: np.ndarray | None = None


def quantize_component(model: onnx.ModelProto, component: str, batches: list[dict[str, np.ndarray]],
                       settings: Settings) -> tuple[list[QuantizedLinear], dict]:
    """Quantize the selected linears of `model` in place; returns them and a report (seconds, and per group the
    alpha, how the scale folded and the relative output error of RTN, of the scale alone and with clipping)."""
    started = time.perf_counter()
    index, linears, groups = find_linears(model, component)
    groups = _selected(groups, settings.select)
    if not groups:
        return [], {"groups": []}
    weights = {lin.weight: index.initializers[lin.weight] for g in groups for lin in g.linears}
    plans, reports, searching = [], [], 0.0
    for chunk, stats in _calibrate(model, index, groups, batches, settings):
        searched = time.perf_counter()
        for group in chunk:
            ws = [numpy_helper.to_array(weights[lin.weight]).T.astype(np.float32) for lin in group.linears]
            plan, report = _search(model, index, group, ws, stats.pop(group.input), settings)
            plans.append(plan)
            reports.append(report)
        searching += time.perf_counter() - searched
    calibrated = time.perf_counter() - searching  # the search ran between the layers' calibrations
    folds = fold_scales(model, index, linears, groups, [p.result.scale for p in plans])
    for report, fold in zip(reports, folds):
        report["fold"] = None if fold is None else fold[0]
    quantized, lowered = lower_linears(model, groups, [p.clips for p in plans], [f and f[1] for f in folds], settings,
                                       [p.hessian for p in plans])
    return quantized, {"calibration_s": round(calibrated - started, 2),
                       "search_and_rewrite_s": round(time.perf_counter() - calibrated, 2), "groups": reports, **lowered}


def _selected(groups: list[Group], select: Callable[[str], bool]) -> list[Group]:
    """Groups cut to the selected linears; a group that lost some keeps no absorber (others read its input)."""
    out = []
    for g in groups:
        keep = [lin for lin in g.linears if select(lin.name)]
        if keep:
            out.append(dataclasses.replace(g, linears=keep, absorber=g.absorber if len(keep) == len(g.linears) else None))
    return out


def _by_layer(groups: list[Group]) -> list[list[Group]]:
    """Runs of consecutive groups in one decoder layer (a group outside the layers alone)."""
    chunks: list[list[Group]] = []
    for g in groups:
        layer = g.linears[0].layer
        if chunks and layer is not None and chunks[-1][0].linears[0].layer == layer:
            chunks[-1].append(g)
        else:
            chunks.append([g])
    return chunks


def _calibrate(model, index: GraphIndex, groups: list[Group], batches,
               settings: Settings) -> Iterator[tuple[list[Group], dict[str, GroupStats]]]:
    """Per chunk of `_by_layer`, in graph order: its groups and, over all batches, the |x| sums and Gram matrices
    of their inputs and the module regions' feeds over the first batches holding at most `search_tokens` tokens
    (at least one batch)."""
    chunks = _by_layer(groups)
    needs = [{g.input: region_inputs(index, g) for g in chunk if g.region} for chunk in chunks]
    names = [list(dict.fromkeys([g.input for g in chunk] + [n for ns in need.values() for n in ns]))
             for chunk, need in zip(chunks, needs)]
    for chunk, need, runs in zip(chunks, needs, captured(model, names, batches)):
        yield chunk, _chunk_stats(chunk, need, runs, settings)


def _chunk_stats(chunk: list[Group], needs: dict[str, list[str]], runs, settings: Settings) -> dict[str, GroupStats]:
    stats = {g.input: GroupStats.empty(g.linears[0].k, settings.grid.group, full=settings.needs_hessian or not g.region)
             for g in chunk}
    searched = 0
    for i, tensors in enumerate(runs):
        first = tensors[chunk[0].input]
        tokens = first.size // first.shape[-1]
        keep = i == 0 or searched + tokens <= settings.search_tokens
        searched += tokens if keep else 0
        for name, s in stats.items():
            s.add(tensors[name])
            if keep and name in needs:
                s.feeds.append({n: tensors[n] for n in needs[name]})
    return stats


def _search(model, index, group: Group, ws: list[np.ndarray], stats: GroupStats,
            settings: Settings) -> tuple[_Plan, dict]:
    loss = ModuleLoss(model, index, group, ws, stats.feeds) if group.region else OwnLoss(ws, stats)
    grid = settings.grid
    if settings.method in SCALED:
        result = search_scale(ws, stats, loss, grid)
    else:
        err = loss([grid.fake(w) for w in ws])
        result = ScaleResult(np.ones(group.linears[0].k, np.float32), 0.0, err, err, loss.energy)
    clips = [None] * len(ws)
    if settings.method == "awq" and settings.clip:
        blocks = scaled_blocks(stats.blocks(), result.scale)
        clips = [None if lin.role in NO_CLIP_ROLES else search_clip(w * result.scale, blocks, grid)
                 for lin, w in zip(group.linears, ws)]
    final = loss([effective_weight(w, result.scale, grid, c) for w, c in zip(ws, clips)])
    if final > result.loss:  # the clip search minimises each weight group's share; keep it only when the module gains
        clips, final = [None] * len(ws), result.loss
    energy = max(result.energy, 1e-30)
    report = {
        "group": group.name,
        "loss_at": "module" if group.region else "own outputs",
        "alpha": result.alpha,
        "rtn_rel_mse": sig(result.rtn_loss / energy),
        "scaled_rel_mse": sig(result.loss / energy),
        "final_rel_mse": sig(final / energy),
    }
    if settings.method in GPTQ:  # GPTQ rounds at lowering: its error is in the report's own_output_rel_mse
        report["final_rel_mse"] = report["scaled_rel_mse"]
        report["rounding"] = "gptq"
    hessian = None
    if settings.needs_hessian:
        inv = 1.0 / result.scale.astype(np.float64)
        hessian = stats.gram * inv[:, None] * inv[None, :]
    return _Plan(result, clips, hessian), report


def fold_scales(model: onnx.ModelProto, index: GraphIndex, linears: list[Linear], groups: list[Group],
                scales: list[np.ndarray]) -> list[tuple[str, np.ndarray | None] | None]:
    """Make every group compute x/s times W diag(s), a float graph with the same outputs: the group's weights take
    s on their input channels and 1/s goes into the normalisation that made x (its weight and bias), into the
    output channels of the linear that made one factor of x, or into a pre-quant Mul. Per group: (how, the
    pre-quant scale when a Mul applies it), None when s = 1. New initializers throughout: the exporter shares
    identical ones between nodes."""
    weights: dict[int, np.ndarray] = {}

    def weight(lin: Linear) -> np.ndarray:  # [K, N] as stored, in float32 while groups fold into it
        if id(lin.node) not in weights:
            weights[id(lin.node)] = numpy_helper.to_array(index.initializers[lin.weight]).astype(np.float32)
        return weights[id(lin.node)]

    new, inserts, folds = [], {}, []
    for group, s in zip(groups, scales):
        if np.all(s == 1):
            folds.append(None)
            continue
        for lin in group.linears:
            weight(lin)[...] *= s[:, None]
        kind, target = group.absorber or (None, None)
        if kind == "norm":
            new += _fold_into_norm(index, target, s, group.linears[0].name)
            folds.append(("norm", None))
        elif kind == "linear":
            weight(target)[...] /= s[None, :]
            folds.append((f"output channels of {target.name}", None))
        else:
            inv = (1.0 / s).astype(_dtype(index, group.linears[0]))
            name = f"{group.linears[0].name}.prequant_scale"
            new.append(numpy_helper.from_array(inv, name))
            out = f"{group.input}.awq_prequant"
            first = min(group.linears, key=lambda lin: index.position[id(lin.node)])
            inserts[index.position[id(first.node)]] = helper.make_node("Mul", [group.input, name], [out], name=f"{name}.mul")
            for lin in group.linears:
                lin.node.input[0] = out
            folds.append(("prequant Mul", inv))
    for lin in linears:
        if id(lin.node) in weights:
            dtype = _dtype(index, lin)
            lin.weight = lin.node.input[1] = f"{lin.name}.awq_weight"
            # into the graph one at a time: a list of them would be a second float32 copy of every scaled linear
            model.graph.initializer.append(numpy_helper.from_array(weights.pop(id(lin.node)).astype(dtype), lin.weight))
    replace_nodes(model, {i: [mul, model.graph.node[i]] for i, mul in inserts.items()}, new)
    return folds


def _dtype(index: GraphIndex, lin: Linear) -> np.dtype:
    """The linear's float type (fp32, or fp16/bf16 after cast_precision): its scales and pre-quant scale take it."""
    return helper.tensor_dtype_to_np_dtype(index.initializers[lin.weight].data_type)


def _fold_into_norm(index: GraphIndex, norm: onnx.NodeProto, s: np.ndarray, label: str) -> list[onnx.TensorProto]:
    out = []
    for i, suffix in ((1, "weight"), (2, "bias")):
        if len(norm.input) > i and norm.input[i]:
            value = numpy_helper.to_array(index.initializers[norm.input[i]])
            norm.input[i] = f"{label}.awq_norm_{suffix}"
            out.append(numpy_helper.from_array((value / s).astype(value.dtype), norm.input[i]))
    return out
