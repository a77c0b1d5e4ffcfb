"""Layer-by-layer calibration on the exported tiny LLaVA: the stages run every node once between them, each stage
reads only the graph inputs and what earlier stages made, and the tensors they capture equal the whole graph's
run on fresh random inputs; quantization gathers one decoder layer's statistics at a time."""

import numpy as np
import onnx
import pytest

from builders import tiny_llm_feeds
from mmtrt.quant import quantize
from mmtrt.quant.session import run_with_outputs
from mmtrt.quant.int4 import Grid
from mmtrt.quant.layerwise import captured, plan_stages
from mmtrt.quant.linears import find_linears, region_inputs


def _feeds(component, rng):
    if component == "vision":
        return {"pixel_values": rng.normal(size=(2, 3, 64, 64)).astype(np.float32)}
    return tiny_llm_feeds(rng)


def _chunks(model, component):
    index, _, groups = find_linears(model, component)
    chunks = quantize._by_layer(groups)
    return [list(dict.fromkeys(n for g in chunk for n in region_inputs(index, g))) for chunk in chunks], chunks


@pytest.mark.parametrize("component", ["llm", "vision"])
def test_stages_capture_what_the_whole_graph_computes(tiny_bundle, rng, component):
    model = onnx.load(tiny_bundle / f"{component}.onnx")
    names, chunks = _chunks(model, component)
    assert len(chunks) > 1 and all(len({g.linears[0].layer for g in c}) == 1 for c in chunks)
    stages = plan_stages(model.graph, names)
    ran = [i for s in stages for i in s.nodes]
    assert len(ran) == len(set(ran))
    available = {v.name for v in model.graph.input}
    for stage in stages:
        assert set(stage.inputs) <= available
        available.update(stage.outputs)
    batches = [_feeds(component, rng) for _ in range(2)]
    whole = list(run_with_outputs(model, [n for ns in names for n in ns], batches))
    for chunk_names, runs in zip(names, captured(model, names, batches)):
        for b, tensors in enumerate(runs):
            assert set(tensors) == set(chunk_names)
            for name in chunk_names:
                np.testing.assert_allclose(tensors[name], whole[b][name], rtol=1e-6, atol=1e-6)


def test_quantization_holds_one_layers_statistics_at_a_time(tiny_bundle, rng, monkeypatch):
    """AWQ on the LLM: a layer's groups are searched before the next layer's statistics are gathered."""
    model = onnx.load(tiny_bundle / "llm.onnx")
    events = []
    chunk_stats, search = quantize._chunk_stats, quantize._search

    def gathered(chunk, needs, runs, settings):
        events.append(("stats", chunk[0].linears[0].layer))
        return chunk_stats(chunk, needs, runs, settings)

    def searched(model, index, group, ws, stats, settings):
        events.append(("search", group.linears[0].layer))
        return search(model, index, group, ws, stats, settings)

    monkeypatch.setattr(quantize, "_chunk_stats", gathered)
    monkeypatch.setattr(quantize, "_search", searched)
    settings = quantize.Settings(method="awq", grid=Grid(64, symmetric=False), clip=True, lowering="matmulnbits",
                                 accuracy_level=0, search_tokens=64, select=lambda name: True)
    quantize.quantize_component(model, "llm", [tiny_llm_feeds(rng) for _ in range(2)], settings)
    assert [layer for kind, layer in events if kind == "stats"][:4] == [0, 1, 2, 3]
    current = None
    for kind, layer in events:
        if kind == "stats":
            current = layer
        else:
            assert layer == current
