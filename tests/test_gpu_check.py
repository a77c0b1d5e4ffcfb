"""scripts/gpu_check.sh and its Python steps, as far as a CPU host can check them: the shell parses, and the engine
step's Polygraphy comparison (its simple compare function, results keyed by runner-name pairs) passes two equal
models and fails two different ones, on ONNX Runtime runners standing where the TensorRT engine goes on a GPU host."""

import importlib.util
import subprocess

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conftest import ROOT

spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")]).returncode == 0


def linear(path, weight):
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(weight, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), path)
    return str(path)


def test_the_engine_comparison_passes_equal_outputs_and_fails_different_ones(tmp_path, rng):
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    w = rng.standard_normal((8, 4)).astype(np.float32)
    feeds = [{"x": rng.standard_normal((2, 8)).astype(np.float32)} for _ in range(3)]
    runner = lambda weight, name, file: OnnxrtRunner(SessionFromOnnx(linear(tmp_path / file, weight)), name=name)
    ok, rows, ms = gpu_check.compare([runner(w, "trt", "a.onnx"), runner(w, "ort-cpu", "b.onnx")], feeds, 1e-3)
    assert ok and rows == [("y", 0.0, 0.0, True)] and set(ms) == {"trt", "ort-cpu"}
    ok, rows, _ = gpu_check.compare([runner(w * 1.1, "trt", "c.onnx"), runner(w, "ort-cpu", "d.onnx")], feeds, 1e-3)
    assert not ok and rows[0][0] == "y" and rows[0][1] > 1e-3 and rows[0][3] is False
