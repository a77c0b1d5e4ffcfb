"""ONNX Runtime's uint8 x int8 GEMM on this host: without the exact products entry, the exact integer sum where
`saturates()` says no and the 16-bit saturating sum of neighbouring products where it says yes; with it, as every
session mmtrt makes sets it, the exact sum on every host. A bundle with int8 linears says once at load where they
run on the slower exact GEMM, and a bundle without them says nothing."""

import json
import logging

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mmtrt.backends.int8_gemm import graph_ops, integer_linears, integer_product, probe_model, saturates
from mmtrt.backends.onnxruntime_backend import OrtRunner
from mmtrt.runtime.pipeline import load


def _paired(a, b, zero=128):
    """The saturating sum: each two neighbouring products along K added in 16 bits with saturation first."""
    a, b = a.astype(np.int64), b.astype(np.int64)
    pairs = a[:, 0::2, None] * b[None, 0::2] + a[:, 1::2, None] * b[None, 1::2]
    return np.clip(pairs, -32768, 32767).sum(axis=1) - zero * b.sum(axis=0)


def _operands(rng):
    a = rng.integers(0, 256, size=(24, 320)).astype(np.uint8)
    b = rng.integers(-127, 128, size=(320, 48)).astype(np.int8)
    return a, b, (a.astype(np.int64) - 128) @ b.astype(np.int64)


def test_the_probe_says_how_this_hosts_gemm_adds(rng):
    a, b, exact = _operands(rng)
    got = integer_product(a, b)
    assert np.array_equal(got, _paired(a, b) if saturates() else exact)
    assert not np.array_equal(_paired(a, b), exact)


def test_the_exact_products_entry_sums_exactly_on_every_host(rng):
    a, b, exact = _operands(rng)
    assert np.array_equal(integer_product(a, b, exact=True), exact)


def test_the_probe_model_is_the_bytes_onnx_writes(rng):
    """The probe is written without `onnx` (the light runtime does not import it); onnx serializes the same model
    to the same bytes."""
    for m, k, n in [(4, 64, 16), (1, 300, 1), (24, 320, 48)]:
        b = rng.integers(-128, 128, size=(k, n)).astype(np.int8)
        graph = helper.make_graph(
            [helper.make_node("MatMulInteger", ["a", "b", "zero"], ["y"])], "int8_gemm_probe",
            [helper.make_tensor_value_info("a", TensorProto.UINT8, [m, k])],
            [helper.make_tensor_value_info("y", TensorProto.INT32, [m, n])],
            [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(128, np.uint8), "zero")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
        assert probe_model((m, k), b) == model.SerializeToString()


def _saved(tmp_path, name, nodes, weights, x_type, y_type):
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", x_type, [None, 320])],
                              [helper.make_tensor_value_info("y", y_type, None)], weights)
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), path)
    return path


def test_the_runner_makes_integer_gemms_exact_and_leaves_other_int8_graphs_alone(tmp_path, rng):
    """The entry goes on graphs with an integer GEMM only: on a per-channel int8 DequantizeLinear without a zero
    point (weight-only int8) ONNX Runtime's rewrite breaks the run."""
    a, b, exact = _operands(rng)
    gemm = _saved(tmp_path, "gemm", [helper.make_node("MatMulInteger", ["x", "b", "zero"], ["y"])],
                  [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(128, np.uint8), "zero")],
                  TensorProto.UINT8, TensorProto.INT32)
    assert np.array_equal(OrtRunner(gemm, threads=1).run({"x": a})["y"], exact)
    scales = rng.uniform(0.01, 0.1, 48).astype(np.float32)
    weight_only = _saved(tmp_path, "dequantize", [helper.make_node("DequantizeLinear", ["b", "s"], ["w"], axis=1),
                                                  helper.make_node("MatMul", ["x", "w"], ["y"])],
                         [numpy_helper.from_array(b, "b"), numpy_helper.from_array(scales, "s")], TensorProto.FLOAT,
                         TensorProto.FLOAT)
    x = np.eye(320, dtype=np.float32)[:24]
    got = OrtRunner(weight_only, threads=1).run({"x": x})["y"]
    want = b[:24].astype(np.float32) * scales
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_graph_ops_reads_the_op_types_onnx_reads(tiny_prefill_bundle, tmp_path):
    for path in sorted(tiny_prefill_bundle.glob("*.onnx")):
        assert graph_ops(path) == {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}
    (tmp_path / "text.onnx").write_text("not a model\n" * 3)
    assert graph_ops(tmp_path / "text.onnx") == set()


class _Kept(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_bundle_with_int8_linears_says_where_they_run_on_the_exact_gemm(tiny_prefill_bundle, tiny_bundle):
    manifest = json.loads((tiny_prefill_bundle / "manifest.json").read_text())
    assert integer_linears(manifest) == ["int8_prefill"]
    logger = logging.getLogger("mmtrt.runtime")
    for bundle, said in ((tiny_prefill_bundle, saturates()), (tiny_bundle, False)):
        kept, level = _Kept(), logger.level
        logger.addHandler(kept)
        logger.setLevel(logging.INFO)
        try:
            load(bundle)
        finally:
            logger.removeHandler(kept)
            logger.setLevel(level)
        notes = [m for m in kept.messages if "VNNI" in m]
        assert len(notes) == said and all("int8_prefill linears" in n and "uint8 x uint8" in n for n in notes)


def test_a_passes_record_in_another_form_names_no_integer_linears():
    """The manifest's record of its passes is informational: an edited one must not fail a load."""
    good = {"pass": "int8_weights", "config": {"activations": "dynamic"}}
    for passes in (None, 3, "x", [{}], [7], [{"pass": "int8_weights", "config": 3}], [{"config": {}}]):
        assert integer_linears({"passes": passes}) == []
    assert integer_linears({"passes": [{}, good, {"pass": "int8_prefill"}]}) == ["int8_weights", "int8_prefill"]
