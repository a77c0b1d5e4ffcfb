"""graph_cleanup folds constant subgraphs, bypasses Identity and drops dead nodes, without changing outputs."""

import numpy as np
import onnxruntime as ort
from onnx import helper

from builders import make_model, tensor
from mmtrt.ir.graph import Component
from passes.cleanup.graph_cleanup import GraphCleanup


class FakeIR:
    def __init__(self, model):
        self.components = {n: Component(n, [], [], onnx=model if n == "vision" else _identity()) for n in GraphCleanup.components}


def _identity():
    return make_model([helper.make_node("Identity", ["a"], ["b"])], [tensor("a", [1])], [tensor("b", [1])])


def messy_model():
    rng = np.random.default_rng()
    nodes = [
        helper.make_node("Add", ["c1", "c2"], ["c3"]),          # constant: folds
        helper.make_node("Identity", ["x"], ["xi"]),             # bypassed
        helper.make_node("Mul", ["xi", "c3"], ["y"]),
        helper.make_node("Relu", ["x"], ["dead"]),               # feeds nothing
    ]
    inits = [("c1", rng.normal(size=4).astype(np.float32)), ("c2", rng.normal(size=4).astype(np.float32))]
    return make_model(nodes, [tensor("x", [3, 4])], [tensor("y", [3, 4])], inits)


def test_cleanup_folds_bypasses_and_removes():
    model = messy_model()
    x = np.random.default_rng().normal(size=(3, 4)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    ir = FakeIR(model)
    changes = GraphCleanup(GraphCleanup.Config()).run(ir)
    cleaned = ir.components["vision"].onnx
    assert [n.op_type for n in cleaned.graph.node] == ["Mul"]
    assert changes["vision"] == {"identities_removed": 1, "nodes_removed": 3, "initializers_removed": 1}
    got = ort.InferenceSession(cleaned.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_identity_feeding_a_graph_output_stays():
    ir = FakeIR(messy_model())
    GraphCleanup(GraphCleanup.Config()).run(ir)
    assert [n.op_type for n in ir.components["llm"].onnx.graph.node] == ["Identity"]
