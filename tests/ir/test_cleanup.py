"""cleanup without onnx-graphsurgeon: on an unsorted graph with dead branches it keeps what onnx-graphsurgeon's
cleanup keeps, in an order the ONNX checker takes, computing the same outputs, in the model it was given."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
from onnx import helper, numpy_helper

from mmtrt.ir.rewrite import cleanup


def _unsorted_graph(rng) -> onnx.ModelProto:
    """y = relu(x @ w1) @ w2, its nodes out of order (as passes leave them: a rewritten node appended at the end),
    beside a dead branch with its own weight and value_info."""
    w1, w2, dead = (rng.standard_normal(s).astype(np.float32) for s in ((4, 8), (8, 3), (4, 4)))
    nodes = [helper.make_node("MatMul", ["h", "w2"], ["y"], name="second"),
             helper.make_node("MatMul", ["x", "dead_w"], ["unused"], name="dead"),
             helper.make_node("Relu", ["x1"], ["h"], name="relu"),
             helper.make_node("MatMul", ["x", "w1"], ["x1"], name="first")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 3])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (dead, "dead_w"))],
        value_info=[helper.make_tensor_value_info("unused", onnx.TensorProto.FLOAT, ["n", 4]),
                    helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT, ["n", 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_cleanup_keeps_what_graphsurgeon_keeps_sorted_and_in_place(rng):
    model = _unsorted_graph(rng)
    reference = gs.import_onnx(model)
    reference.cleanup(remove_unused_graph_inputs=False).toposort()
    want = gs.export_onnx(reference)
    x = rng.standard_normal((5, 4)).astype(np.float32)

    assert cleanup(model) is model
    onnx.checker.check_model(model, full_check=True)
    assert sorted(n.name for n in model.graph.node) == sorted(n.name for n in want.graph.node)
    assert [t.name for t in model.graph.initializer] == ["w1", "w2"]
    assert [v.name for v in model.graph.value_info] == ["h"]
    got, expected = (ort.InferenceSession(m.SerializeToString()).run(["y"], {"x": x})[0] for m in (model, want))
    np.testing.assert_array_equal(got, expected)
