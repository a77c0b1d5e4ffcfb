"""Quantizing a component on the exported tiny LLaVA: folding AWQ scales into the graph changes no output (random
scales on every group of the LLM and vision graphs: norm weights and biases, up_proj's output channels, pre-quant
Muls; the folded weights computed one linear at a time from the initializers), and RTN writes plain
round-to-nearest weights that the lowered graph applies exactly."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from builders import tiny_llm_feeds, unpack_int4
from mmtrt.backends.onnxruntime_backend import session_options

from mmtrt.quant.fold import Folds, awq_weight_name
from mmtrt.quant.int4 import Grid, dequantize_groups, quantize_groups
from mmtrt.quant.linears import find_linears
from mmtrt.quant.lowering import drop_unused_initializers, rebuild_nodes
from mmtrt.quant.quantize import Settings, quantize_component


def _feeds(component, rng):
    if component == "vision":
        return {"pixel_values": rng.normal(size=(2, 3, 64, 64)).astype(np.float32)}
    return tiny_llm_feeds(rng)


def _run(model, feeds):
    """ONNX Runtime with DequantizeLinear + MatMul kept exact (fused at accuracy level 0, float activations)."""
    options = session_options(None, spin=False, exact_int4=True)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("component", ["llm", "vision"])
def test_folded_scales_keep_every_output(tiny_bundle, rng, component):
    model = onnx.load(tiny_bundle / f"{component}.onnx")
    feeds = _feeds(component, rng)
    before = _run(model, feeds)
    index, linears, groups = find_linears(model, component)
    scales = [np.exp(rng.normal(0, 0.5, g.linears[0].k)).astype(np.float32) for g in groups]
    scales[-1] = np.ones_like(scales[-1])  # s = 1 leaves a group alone
    folding = Folds(index, linears)
    folds = [folding.add(g, s) for g, s in zip(groups, scales)]
    weights = [(lin, folding.weight(lin)) for lin in linears if folding.touched(lin)]
    for lin, w in weights:  # a block of output channels at a time, as rounding a wide linear takes them
        cut = w.shape[1] // 3
        for columns in (slice(0, cut), slice(cut, None)):
            np.testing.assert_array_equal(folding.weight(lin, columns), w[:, columns])
    rebuild_nodes(model.graph, folding.apply(linears), {})
    model.graph.initializer.extend(numpy_helper.from_array(w, awq_weight_name(lin)) for lin, w in weights)
    model.graph.initializer.extend(folding.initializers)
    drop_unused_initializers(model.graph)
    kinds = {f[0].split(" of ")[0] for f in folds if f is not None}
    assert kinds == ({"norm", "output channels", "prequant Mul"} if component == "llm" else {"norm", "prequant Mul"})
    assert folds[-1] is None
    onnx.checker.check_model(model, full_check=True)
    for a, b in zip(_run(model, feeds), before):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


def _settings(**overrides):
    base = dict(method="rtn", grid=Grid(64, symmetric=False), clip=True, lowering="matmulnbits", accuracy_level=0,
                search_tokens=64, select=lambda name: name != "llm.layers.1.o_proj")
    return Settings(**{**base, **overrides})


@pytest.mark.parametrize("float_zero_point", [False, True])
def test_rtn_rounds_the_original_weights_and_runs_as_its_dequantized_graph(tiny_bundle, rng, float_zero_point):
    """method rtn: every selected linear holds round-to-nearest of its own weight (no scale, no clip), an excluded
    one stays a float MatMul, and the lowered graph (asymmetric: packed or float zero points) runs as the float
    graph with the dequantized weights."""
    model = onnx.load(tiny_bundle / "llm.onnx")
    reference = onnx.ModelProto.FromString(model.SerializeToString())
    weights = {lin.name: (lin.output, numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == lin.weight)).T)
               for lin in find_linears(model, "llm")[1]}
    grid = Grid(64, symmetric=False, float_zero_point=float_zero_point)
    quantized, report = quantize_component(model, "llm", [_feeds("llm", rng)], _settings(grid=grid))
    assert len(quantized) == len(weights) - 1 and {g["alpha"] for g in report["groups"]} == {0.0}
    assert sum(n.op_type == "MatMulNBits" for n in model.graph.node) == len(quantized)
    excluded = next(n for n in model.graph.node if n.output[0] == weights["llm.layers.1.o_proj"][0])
    assert excluded.op_type == "MatMul"
    if float_zero_point:  # linears reading one tensor (q/k/v, gate/up) share its per-group sums
        sums = [n for n in model.graph.node if n.output[0].endswith(".group_sums.b64")]
        assert len(sums) == len({ql.linear.input for ql in quantized}) < len(quantized)
    for ql in quantized:
        q, scales, zp = quantize_groups(weights[ql.linear.name][1], 64, symmetric=False, float_zero_point=float_zero_point)
        np.testing.assert_array_equal(ql.q, q)
        np.testing.assert_array_equal(ql.zero_points, zp)
        np.testing.assert_array_equal(ql.scales, scales)
        _set_weight(reference, weights[ql.linear.name][0], dequantize_groups(q, scales, zp, 64))
    feeds = _feeds("llm", rng)
    for a, b in zip(_run(model, feeds), _run(reference, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


def _set_weight(model, output, w):
    node = next(n for n in model.graph.node if n.output[0] == output)
    init = next(t for t in model.graph.initializer if t.name == node.input[1])
    init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(w.T.astype(np.float32)), init.name))


def test_quantizes_after_cast_precision_in_the_graphs_type(tiny_bundle, rng):
    """After cast_precision the TensorRT segments' weights are fp16: scales, pre-quant scales and folded weights
    follow, and each INT4 DequantizeLinear computes what an fp16 constant of its dequantized weight does."""
    from mmtrt.ir.graph import Component, ModelIR, graph_io
    from passes.precision.cast_precision import CastPrecision

    comps = {}
    for name in ("vision", "embed", "llm"):
        m = onnx.load(tiny_bundle / f"{name}.onnx")
        comps[name] = Component(name, graph_io(m, "inputs"), graph_io(m, "outputs"), onnx=m,
                                metadata={"placement": {"targeted": True, "min_segment_size": 5}})
    CastPrecision(CastPrecision.Config()).run(ModelIR(comps, {}, {}))
    model = comps["llm"].onnx
    settings = _settings(method="awq", grid=Grid(64), lowering="dequantize_linear", select=lambda name: True)
    quantized, _ = quantize_component(model, "llm", [_feeds("llm", rng)], settings)
    inits = {t.name: t for t in model.graph.initializer}
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    prequant = [n for n in model.graph.node if n.op_type == "Mul" and n.input[1] in inits
                and n.input[1].endswith("prequant_scale")]
    assert len(dq) == len(quantized) == 29 and prequant
    assert {inits[n.input[1]].data_type for n in dq + prequant} == {onnx.TensorProto.FLOAT16}
    reference = onnx.ModelProto.FromString(model.SerializeToString())
    for node in [n for n in reference.graph.node if n.op_type == "DequantizeLinear"]:
        q, scale = unpack_int4(inits[node.input[0]]), numpy_helper.to_array(inits[node.input[1]])
        block = next(a.i for a in node.attribute if a.name == "block_size")
        w = q * np.repeat(scale.astype(np.float32), block, axis=0)[: q.shape[0]]
        reference.graph.initializer.append(numpy_helper.from_array(w.astype(np.float16), node.output[0]))
        reference.graph.node.remove(node)
    feeds = _feeds("llm", rng)
    expected = _run(reference, feeds)[0]
    # fp16 arithmetic in two kernels (fused MatMulNBits vs MatMul): measured up to 0.2 % of the largest logit.
    np.testing.assert_allclose(_run(model, feeds)[0], expected, rtol=1e-2, atol=5e-3 * np.abs(expected).max())
