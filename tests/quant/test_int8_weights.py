"""int8_weights on the exported tiny LLaVA's vision graph: each selected linear holds numpy's per-output-channel
int8 codes and scales, and the graph computes what the float graph computes with numpy's dequantized weights in
their place; excluded linears stay float MatMuls."""

import copy

import numpy as np
import onnxruntime as ort
from onnx import numpy_helper

from mmtrt.backends.onnxruntime_backend import session_options
from mmtrt.ir.frontend import lower
from mmtrt.pipeline.registry import get_pass
from mmtrt.quant.linears import find_linears


def _run(model, pixels):
    """ONNX Runtime fuses DequantizeLinear + MatMul into MatMulNBits; exact_int4 keeps its activations in float
    (accuracy level 0), as TensorRT's weight-only GEMM does."""
    opts = session_options(None, False, exact_int4=True)
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"pixel_values": pixels})[0]


def test_int8_vision_matches_numpy_dequantized_weights(tiny, rng):
    ir = lower(*tiny)
    float_vision = copy.deepcopy(ir.components["vision"].onnx)
    _, linears, _ = find_linears(float_vision, "vision")
    weights = {t.name: numpy_helper.to_array(t) for t in float_vision.graph.initializer}
    projector = [lin.name for lin in linears if lin.name.startswith("vision.linear.")]
    assert projector
    cls = get_pass("int8_weights")
    report = cls(cls.Config(exclude=["vision.linear.*"])).run(ir)["vision"]
    assert report["linears"] == [lin.name for lin in linears if lin.name not in projector]

    reference = copy.deepcopy(float_vision)
    _, ref_linears, _ = find_linears(reference, "vision")
    inits = {t.name: t for t in ir.components["vision"].onnx.graph.initializer}
    for lin in ref_linears:
        if lin.name in projector:
            continue
        w = weights[lin.weight].astype(np.float64)
        scales = np.abs(w).max(axis=0) / 127
        codes = np.clip(np.round(w / scales), -127, 127)
        np.testing.assert_array_equal(numpy_helper.to_array(inits[f"{lin.name}.int8_weight"]), codes)
        np.testing.assert_allclose(numpy_helper.to_array(inits[f"{lin.name}.int8_scale"]), scales, rtol=1e-6)
        name = f"{lin.name}.reference_weight"
        reference.graph.initializer.append(numpy_helper.from_array((codes * scales).astype(np.float32), name))
        lin.node.input[1] = name
    quantized_nodes = ir.components["vision"].onnx.graph.node
    float_reads = {n.input[1] for n in quantized_nodes if n.op_type == "MatMul"}
    assert {lin.weight for lin in linears if lin.name in projector} <= float_reads
    assert sum(n.op_type == "DequantizeLinear" for n in quantized_nodes) == len(report["linears"])
    assert report["weight_bytes_after"] < report["weight_bytes_before"] / 3.5

    pixels = rng.standard_normal((2, *ir.components["preprocess"].outputs[0].shape[1:])).astype(np.float32)
    got, want = _run(ir.components["vision"].onnx, pixels), _run(reference, pixels)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(got, _run(float_vision, pixels), rtol=1e-4, atol=1e-5)
