"""Quantize the linears of one ONNX component to INT4 in place: calibrate, search (AWQ or plain RTN), fold the
scales into the graph, and lower every quantized linear for the backend that will run it (mmtrt/quant/lowering.py).

Every search reads the activations of the unmodified float graph (as the reference implementations do: scaling
alone does not change any output). Calibration runs one decoder layer at a time (mmtrt/quant/layerwise.py): the
searches of a layer's groups run, and its statistics are dropped, before the next layer's are gathered; as each
group's search finishes, the linears it completes are folded, rounded and written into the graph
(mmtrt/quant/layer_rewrite.py). The weights are read from the graph's initializers one group or linear at a time,
whether they hold their bytes or refer to the source model (mmtrt/ir/source_weights.py).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterator

import numpy as np
import onnx

from mmtrt.ir import resident, source_weights
from mmtrt.pipeline.pass_base import TIMES
from mmtrt.quant.awq import GroupStats, ModuleLoss, OwnLoss, ScaleResult, scaled_blocks, search_clip, search_scale
from mmtrt.quant.layer_rewrite import GroupPlan, LayerRewrite
from mmtrt.quant.layerwise import captured
from mmtrt.quant.linears import GraphIndex, Group, find_linears, region_inputs
from mmtrt.quant.lowering import GPTQ, QuantizedLinear, Settings, sig

__all__ = ["QuantizedLinear", "Settings", "quantize_component"]

NO_CLIP_ROLES = ("q_proj", "k_proj")  # as the reference: clipping them too measured no better on dino-smollm
SCALED = ("awq", "awq_gptq")  # methods that search AWQ's scale


def quantize_component(model: onnx.ModelProto, component: str, batches: list[dict[str, np.ndarray]],
                       settings: Settings) -> tuple[list[QuantizedLinear], dict]:
    """Quantize the selected linears of `model` in place; returns them and a report (seconds, and per group the
    alpha, how the scale folded and the relative output error of RTN, of the scale alone and with clipping)."""
    started = time.perf_counter()
    index, linears, groups = find_linears(model, component)
    groups = _selected(groups, settings.select)
    if not groups:
        return [], {"groups": []}
    rewrite = LayerRewrite(model, index, linears, groups, settings)
    position = {id(g): gi for gi, g in enumerate(groups)}
    reports, searching = [], 0.0
    for chunk, stats in _calibrate(model, index, groups, batches, settings):
        searched = time.perf_counter()
        for group in chunk:
            resident.give_back_freed_memory()  # what the layer's calibration session or the last search freed
            ws = [_weight(index.initializers[lin.weight], lazy=not group.region) for lin in group.linears]
            plan, report = _search(model, index, group, ws, stats.pop(group.input), settings)
            del ws
            fold = rewrite.add(position[id(group)], plan)
            reports.append({**report, "fold": None if fold is None else fold[0]})
        searching += time.perf_counter() - searched
    calibrated = time.perf_counter() - searching  # the search ran between the layers' calibrations
    quantized, lowered = rewrite.finish()
    times = {"calibration": round(calibrated - started, 2),
             "search_and_rewrite": round(time.perf_counter() - calibrated, 2)}
    return quantized, {TIMES: times, "groups": reports, **lowered}


class _Rows:
    """A linear's weight `[N, K]` in float32, widened from the initializer it refers to a block of output channels
    at a time, as `OwnLoss` and the clip search read it: the lm_head (151,936 x 896, 0.54 GB in float32) is never
    held whole while its scale is searched."""

    def __init__(self, tensor: onnx.TensorProto):
        self.tensor, self.shape = tensor, tuple(reversed(tensor.dims))

    def __getitem__(self, rows: slice) -> np.ndarray:
        return np.asarray(source_weights.array(self.tensor, rows).T, np.float32)


def _weight(tensor: onnx.TensorProto, lazy: bool) -> np.ndarray | _Rows:
    """`[N, K]` in float32: by blocks of rows for a loss that reads it so (`lazy`) when it refers to its source or
    the scratch file, else whole."""
    if lazy and source_weights.is_reference(tensor):
        return _Rows(tensor)
    return np.asarray(source_weights.array(tensor).T, np.float32)


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
    names = [list(dict.fromkeys([g.input for g in chunk] + [n for ns in need.values() for n in ns]
                                + _narrowing_outputs(chunk)))
             for chunk, need in zip(chunks, needs)]
    for chunk, need, runs in zip(chunks, needs, captured(model, names, batches)):
        yield chunk, _chunk_stats(chunk, need, runs, settings)


def _narrowing_outputs(chunk: list[Group]) -> list[str]:
    """The outputs of the layer's linears that are narrower than their inputs (the down projection's): taken with
    the layer, its stage runs them, so the next stage is handed their outputs rather than the wide inputs
    (hidden size against 5.4x that for Qwen2's MLP, over every calibration token)."""
    lins = [lin for g in chunk for lin in [*g.linears, *([g.downstream] if g.downstream else [])]]
    return [lin.output for lin in lins if lin.layer is not None and lin.n < lin.k]


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
            settings: Settings) -> tuple[GroupPlan, dict]:
    blocks = stats.blocks() if settings.method == "awq" and settings.clip else None
    gram = stats.gram if settings.needs_hessian else None
    if gram is not None and not group.region:
        gram = gram.copy()  # OwnLoss takes the stats' Gram matrix and factors it in place
    loss = ModuleLoss(model, index, group, ws, stats.feeds) if group.region else OwnLoss(ws, stats)
    grid = settings.grid
    if settings.method in SCALED:
        result = search_scale(stats, loss, grid)
    else:
        err = loss.at(np.ones(group.linears[0].k, np.float32), grid)
        result = ScaleResult(np.ones(group.linears[0].k, np.float32), 0.0, err, err, loss.energy)
    clips = [None] * len(ws)
    if settings.method == "awq" and settings.clip:
        blocks = scaled_blocks(blocks, result.scale)
        clips = [None if lin.role in NO_CLIP_ROLES else search_clip(w, result.scale, blocks, grid)
                 for lin, w in zip(group.linears, ws)]
    final = loss.at(result.scale, grid, clips)
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
    del loss  # its own factor of the Gram matrix, before the Hessian is made
    return GroupPlan(result.scale, clips, None if gram is None else _scaled_hessian(gram, result.scale)), report


def _scaled_hessian(gram: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The Hessian of the scaled weights, S^-1 G S^-1, in the Gram matrix's own memory: at a 7B down projection's
    11,008 channels each K x K copy is 0.97 GB."""
    inv = 1.0 / scale.astype(np.float64)
    gram *= inv[:, None]
    gram *= inv[None, :]
    return gram
