"""int8_weights on the exported tiny LLaVA's vision graph: each selected linear holds numpy's per-output-channel
int8 codes and scales, and the graph computes what the float graph computes with numpy's dequantized weights in
their place; excluded linears stay float MatMuls."""

import copy

import numpy as np
import onnxruntime as ort
import pytest
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


def _weight_codes(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy's int8 codes of w, and their per-column scales."""
    w_scales = np.abs(w).max(axis=0).astype(np.float32).astype(np.float64) / 127
    return np.clip(np.rint(w / w_scales), -127, 127).astype(np.int8), w_scales


def _per_tensor(x: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
    """ONNX's DynamicQuantizeLinear on x (uint8, one scale for the tensor, the range widened to hold 0): the codes,
    their zero point and the scale."""
    x = x.astype(np.float64)
    scale = (max(x.max(), 0) - min(x.min(), 0)) / 255
    zero = int(np.clip(np.rint(-min(x.min(), 0) / scale), 0, 255))
    return np.clip(np.rint(x / scale) + zero, 0, 255).astype(np.uint8), zero, np.float64(scale)


def _per_token(x: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
    """Each row on its own symmetric grid of 255 steps (max|row| / 127), held as uint8 around 128."""
    scale = np.abs(x).max(axis=-1, keepdims=True) / np.float32(127)
    return (np.clip(np.rint(x / scale), -127, 127) + 128).astype(np.uint8), 128, scale.astype(np.float64)


def _int8_linear(x: np.ndarray, quantized, w: np.ndarray) -> np.ndarray:
    """x [rows, K] quantized at run time times w's int8 codes, the integer sum exact, as mmtrt's sessions compute it
    on every host."""
    codes, zero, x_scale = quantized(x)
    q, w_scales = _weight_codes(w)
    return (codes.astype(np.int64) - zero) @ q.astype(np.int64) * x_scale * w_scales


@pytest.mark.parametrize("activations, quantized, ops", [
    ("dynamic", _per_tensor, ["DynamicQuantizeMatMul", "Relu", "DynamicQuantizeMatMul"]),
    ("per_token", _per_token, ["MatMulIntegerToFloat", "Relu", "MatMulIntegerToFloat"])])
def test_quantized_activations_give_the_integer_product_of_the_quantized_input(rng, activations, quantized, ops):
    """Two linears with a Relu between: each multiplies its input, quantized at run time per tensor or per row,
    by the int8 weight, exactly up to float rounding."""
    from onnx import TensorProto, helper

    from builders import make_model
    from mmtrt.quant.int8_weights import int8_weight_linears

    w1, w2 = rng.normal(size=(48, 64)).astype(np.float32), rng.normal(size=(64, 32)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                        helper.make_node("MatMul", ["r", "w2"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 5, 48])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [("w1", w1), ("w2", w2)])
    report = int8_weight_linears(model, "vision", lambda name: True, activations)
    assert report["linears_quantized"] == 2 and report["activations"] == activations
    assert [n.op_type for n in model.graph.node if n.op_type in {*ops, "MatMul"}] == ops
    x = rng.normal(size=(2, 5, 48)).astype(np.float32) + 0.5
    x[1, 2] *= 30  # one token far larger than the others
    options = session_options(None, False, ops={n.op_type for n in model.graph.node})
    got = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    hidden = np.maximum(_int8_linear(x.reshape(-1, 48), quantized, w1), 0).astype(np.float32)
    want = _int8_linear(hidden, quantized, w2).reshape(got.shape)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert not np.allclose(got, np.maximum(x @ w1, 0) @ w2, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_int8_weights_join_the_graph_in_the_scratch_file_under_as_made(rng, tmp_path, monkeypatch):
    """Where no later pass lists the component (`spill.as_made`), each int8 weight joins the graph as a reference to
    the scratch file as it is made, not at the end of the pass; the graph is the same bytes."""
    from onnx import TensorProto, helper

    from builders import make_model
    from mmtrt.ir import source_weights, spill
    from mmtrt.quant.int8_weights import int8_weight_linears

    monkeypatch.setattr(spill, "MIN_BYTES", 1024)
    weights = [(f"w{i}", rng.normal(size=shape).astype(np.float32)) for i, shape in ((1, (48, 64)), (2, (64, 32)))]

    def quantized(as_made: bool):
        nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])]
        model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 48])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)
        with source_weights.kept(), spill.scratch(tmp_path), spill.as_made([model] if as_made else []):
            int8_weight_linears(model, "vision", lambda name: True, "dynamic")
            moved = sorted(t.name for t in model.graph.initializer if source_weights.is_reference(t))
            source_weights.materialize(model)
        return moved, model.SerializeToString()

    (moved, made), (kept, whole) = quantized(True), quantized(False)
    assert moved == ["vision.linear.0.int8_weight", "vision.linear.1.int8_weight"] and kept == [] and made == whole
