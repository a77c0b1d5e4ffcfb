"""fuse_projections on zoo:tiny-llava's LLM: the fused graph computes what the unfused one does (ONNX Runtime on the
graph before the pass, fresh random inputs), for every INT4 format awq_int4 writes and for float MatMuls."""

import json

import onnx
import onnxruntime as ort
import pytest
import numpy as np

from builders import static_llm_feeds, tiny_llm_feeds
from mmtrt.ir.graph import Component, ModelIR, graph_io
from mmtrt.quant.int4 import Grid
from mmtrt.quant.quantize import Settings, quantize_component
from passes.fusion.fuse_projections import FuseProjections

LAYERS = 4


def _quantized(bundle, grid, level, rng):
    model = onnx.load(bundle / "llm.onnx")
    settings = Settings("rtn", grid, False, "matmulnbits", level, 64, lambda name: True)
    quantize_component(model, "llm", [tiny_llm_feeds(rng)], settings)
    return model


def _run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _fused(model, **config):
    comp = Component("llm", graph_io(model, "inputs"), graph_io(model, "outputs"),
                     onnx=onnx.ModelProto.FromString(model.SerializeToString()))
    report = FuseProjections(FuseProjections.Config(**config)).run(ModelIR({"llm": comp}, {}, {}))
    return comp.onnx, report["llm"]


@pytest.mark.parametrize("grid,level", [(Grid(32), 4), (Grid(32, False), 0), (Grid(64, False, True), 0)],
                         ids=["symmetric-level4", "int4-zero-points", "float-zero-points"])
def test_fused_int4_projections_compute_the_unfused_outputs(tiny_bundle, rng, grid, level):
    model = _quantized(tiny_bundle, grid, level, rng)
    fused, report = _fused(model, ops=["matmulnbits"])
    nbits = [n for n in fused.graph.node if n.op_type == "MatMulNBits"]
    assert report["groups_fused"] == 2 * LAYERS  # q/k/v and the MLP's two input projections, per layer
    assert len(nbits) == sum(n.op_type == "MatMulNBits" for n in model.graph.node) - report["linears_fused"] + 8
    assert sum(n.op_type == "Split" for n in fused.graph.node) == 2 * LAYERS
    feeds = tiny_llm_feeds(rng)
    for ours, ref in zip(_run(fused, feeds), _run(model, feeds)):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_fused_float_projections_compute_the_unfused_outputs(tiny_bundle, rng):
    model = onnx.load(tiny_bundle / "llm.onnx")
    fused, report = _fused(model, ops=["matmul"])
    assert report["groups_fused"] == 2 * LAYERS
    feeds = tiny_llm_feeds(rng)
    for ours, ref in zip(_run(fused, feeds), _run(model, feeds)):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_linears_on_different_inputs_or_formats_stay_apart(tiny_bundle, rng):
    model = _quantized(tiny_bundle, Grid(32), 4, rng)
    fused, _ = _fused(model, ops=["matmulnbits"])
    for node in fused.graph.node:
        if node.op_type == "MatMulNBits" and "+" in node.name:
            parts = node.name.split("+")
            assert {p.rsplit(".", 1)[0] for p in parts} == {parts[0].rsplit(".", 1)[0]}  # one layer's projections
    again, report = _fused(fused, ops=["matmulnbits"])
    assert report["groups_fused"] == 0


def test_float_zero_points_add_their_offsets_before_one_split(tiny_bundle, rng):
    """The MatMulNBits parts and their offsets' parts are added before the Split: one Add and one Split per fused
    group instead of an Add per projection and two Splits."""
    model = _quantized(tiny_bundle, Grid(64, False, True), 0, rng)
    fused, report = _fused(model)
    assert report["sums_before_split"] == 2 * LAYERS
    assert sum(n.op_type == "Split" for n in fused.graph.node) == 2 * LAYERS
    adds = sum(n.op_type == "Add" for n in model.graph.node) - 5 * LAYERS + 2 * LAYERS
    assert sum(n.op_type == "Add" for n in fused.graph.node) == adds
    feeds = tiny_llm_feeds(rng)
    for ours, ref in zip(_run(fused, feeds), _run(model, feeds)):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_qwen2_biases_join_their_projections_before_the_split(onevision_bundle, rng):
    """Qwen2's q/k/v biases are added once to the fused projection, before its Split (which pack_qkv_rotary then
    finds in front of the rotaries)."""
    model = onnx.load(onevision_bundle / "llm.onnx")
    fused, report = _fused(model, ops=["matmul"])
    made = {o: n for n in fused.graph.node for o in n.output}
    splits = [n for n in fused.graph.node if n.op_type == "Split"]
    assert report["sums_before_split"] == sum(made[s.input[0]].op_type == "Add" for s in splits) > 0
    layers = sum(n.op_type == "RotaryEmbedding" for n in model.graph.node) // 2
    assert sum(n.op_type == "Add" for n in model.graph.node) - sum(n.op_type == "Add" for n in fused.graph.node) \
        == 2 * layers  # three bias Adds become one in every layer
    llm = json.loads((onevision_bundle / "manifest.json").read_text())["model"]["llm"]
    feeds = static_llm_feeds(rng, llm, [3], 5, 16)
    for ours, ref in zip(_run(fused, feeds), _run(model, feeds)):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
