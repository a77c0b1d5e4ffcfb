"""fold_prequant_scale on zoo:tiny-llava's LLM: per-channel Muls put after a norm, an INT4 linear and a float linear
fold away and the graph computes what it did with them (ONNX Runtime on the unfolded graph, fresh random inputs);
AWQ's Muls before o_proj (after attention, with 2 query heads per KV head) are left."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from builders import tiny_llm_feeds
from mmtrt.ir.graph import Component, ModelIR, graph_io
from mmtrt.ir.rewrite import attr
from mmtrt.quant.int4 import Grid
from mmtrt.quant.quantize import Settings, quantize_component
from passes.fusion.fold_prequant_scale import FoldPrequantScale



def _run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _folded(model):
    comp = Component("llm", graph_io(model, "inputs"), graph_io(model, "outputs"),
                     onnx=onnx.ModelProto.FromString(model.SerializeToString()))
    report = FoldPrequantScale(FoldPrequantScale.Config()).run(ModelIR({"llm": comp}, {}, {}))
    return comp.onnx, report["llm"]


def _insert_mul(model, tensor, scale):
    """Consumers of `tensor` read tensor * scale instead."""
    for node in model.graph.node:
        node.input[:] = [f"{tensor}.scaled" if i == tensor else i for i in node.input]
    model.graph.initializer.append(numpy_helper.from_array(scale, f"{tensor}.scale"))
    model.graph.node.append(helper.make_node("Mul", [tensor, f"{tensor}.scale"], [f"{tensor}.scaled"]))


def _quantized(bundle, method, rng):
    model = onnx.load(bundle / "llm.onnx")
    settings = Settings(method, Grid(32), False, "matmulnbits", 0, 64, lambda name: True)
    quantize_component(model, "llm", [tiny_llm_feeds(rng)], settings)
    return model


def test_muls_after_a_norm_an_int4_linear_and_a_float_linear_fold_with_the_same_outputs(tiny_bundle, rng):
    model = _quantized(tiny_bundle, "rtn", rng)
    norm = next(n for n in model.graph.node if n.op_type == "RMSNormalization")
    nbits = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    float_model = onnx.load(tiny_bundle / "llm.onnx")
    matmul = next(n for n in float_model.graph.node if n.op_type == "MatMul"
                  and any(t.name == n.input[1] for t in float_model.graph.initializer))
    width = next(t for t in float_model.graph.initializer if t.name == matmul.input[1]).dims[1]
    gamma = next(t for t in model.graph.initializer if t.name == norm.input[1])  # the exporter shares equal ones
    model.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(gamma), "own.gamma"))
    norm.input[1] = "own.gamma"
    _insert_mul(model, norm.output[0], rng.uniform(0.5, 2, 128).astype(np.float32))
    _insert_mul(model, nbits.output[0], rng.uniform(0.5, 2, attr(nbits, "N")).astype(np.float32))
    _insert_mul(float_model, matmul.output[0], rng.uniform(0.5, 2, width).astype(np.float32))
    feeds = tiny_llm_feeds(rng)
    for before, expected in ((model, {"RMSNormalization": 1, "MatMulNBits": 1}), (float_model, {"MatMul": 1})):
        folded, report = _folded(before)
        assert report["muls_folded"] == expected
        assert sum(n.op_type == "Mul" for n in folded.graph.node) == sum(
            n.op_type == "Mul" for n in before.graph.node) - sum(expected.values())
        for ours, ref in zip(_run(folded, feeds), _run(before, feeds)):
            np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_awq_muls_before_o_proj_are_left(tiny_bundle, rng):
    model = _quantized(tiny_bundle, "awq", rng)
    before = [n for n in model.graph.node if n.op_type == "Mul" and n.output[0] in
              {i for m in model.graph.node if m.op_type == "MatMulNBits" and "o_proj" in m.name for i in m.input}]
    assert before  # AWQ keeps a layer's o_proj Mul unless its search picks alpha 0 (no scale)
    folded, report = _folded(model)
    assert report["muls_folded"] == {} and report["muls_left"]["Reshape"] == len(before)  # attention's [B, S, H*D]
    assert {n.name for n in before} <= {n.name for n in folded.graph.node}
