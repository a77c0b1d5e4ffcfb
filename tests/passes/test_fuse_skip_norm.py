"""fuse_skip_norm on zoo:tiny-llava's LLM: the fused graph computes what the exporter's graph does (ONNX Runtime on
the graph before the pass, fresh random inputs), and leaves Adds it cannot fuse."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from builders import tiny_llm_feeds
from mmtrt.ir.graph import Component, ModelIR, graph_io
from passes.fusion.fuse_skip_norm import FuseSkipNorm

LAYERS = 4


def _run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _fused(model):
    comp = Component("llm", graph_io(model, "inputs"), graph_io(model, "outputs"),
                     onnx=onnx.ModelProto.FromString(model.SerializeToString()))
    report = FuseSkipNorm(FuseSkipNorm.Config()).run(ModelIR({"llm": comp}, {}, {}))
    return comp.onnx, report["llm"]["norms_fused"]


def test_residual_add_and_norm_fuse_into_one_node_with_the_same_outputs(tiny_bundle, rng):
    model = onnx.load(tiny_bundle / "llm.onnx")
    fused, count = _fused(model)
    # every norm but the first layer's (it reads the embeddings): post-attention, next input and the final norm
    assert count == 2 * LAYERS
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("SkipSimplifiedLayerNormalization") == count
    assert ops.count("Add") == [n.op_type for n in model.graph.node].count("Add") - count
    feeds = tiny_llm_feeds(rng)
    for ours, ref in zip(_run(fused, feeds), _run(model, feeds)):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_an_add_of_a_constant_is_left_alone(rng):
    bias = numpy_helper.from_array(rng.normal(size=(8,)).astype(np.float32), "bias")
    scale = numpy_helper.from_array(rng.normal(size=(8,)).astype(np.float32), "scale")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["sum"]), helper.make_node("RMSNormalization", ["sum", "scale"], ["y"])],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 8])], [bias, scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    fused, count = _fused(model)
    assert count == 0 and [n.op_type for n in fused.graph.node] == ["Add", "RMSNormalization"]
