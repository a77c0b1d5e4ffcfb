"""The TensorRT operator table: supported nodes pass, and each kind of limit (op, dtype, attribute, shape) is
reported with its reason."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mmtrt.backends.tensorrt.support import SUPPORTED, UNSUPPORTED, GraphFacts, check_node


def facts(types=None, shapes=None, constants=None):
    return GraphFacts(types or {}, shapes or {},
                      {k: numpy_helper.from_array(np.asarray(v), k) for k, v in (constants or {}).items()})


def test_the_two_lists_do_not_overlap():
    assert not set(SUPPORTED) & UNSUPPORTED
    assert {"Attention", "RMSNormalization", "RotaryEmbedding", "LayerNormalization", "Gelu"} <= set(SUPPORTED)


@pytest.mark.parametrize("node, f", [
    (helper.make_node("MatMul", ["a", "b"], ["c"]), facts({"a": TensorProto.FLOAT, "b": TensorProto.FLOAT})),
    (helper.make_node("Attention", ["q", "k", "v", "m"], ["o"]), facts(shapes={n: [1, 2, 3, 4] for n in "qkvm"})),
    (helper.make_node("Cast", ["x"], ["y"], to=TensorProto.BOOL), facts({"x": TensorProto.INT64})),
    (helper.make_node("Unsqueeze", ["x", "axes"], ["y"]), facts(constants={"axes": [0]})),
    (helper.make_node("DequantizeLinear", ["w", "s", "z"], ["y"], block_size=128),
     facts({"w": TensorProto.INT4}, constants={"z": np.zeros(4, np.int8)})),
    (helper.make_node("DequantizeLinear", ["w", "s"], ["y"], block_size=64), facts({"w": TensorProto.INT4})),
])
def test_supported_nodes(node, f):
    assert check_node(node, f) is None


@pytest.mark.parametrize("node, f, kind, words", [
    (helper.make_node("Det", ["x"], ["y"]), facts(), "op", "not supported"),
    (helper.make_node("NoSuchOp", ["x"], ["y"]), facts(), "op", "not in TensorRT's ONNX operator table"),
    (helper.make_node("MatMulNBits", ["x"], ["y"], domain="com.microsoft"), facts(), "op", "custom-domain"),
    (helper.make_node("Add", ["a", "b"], ["c"]), facts({"a": TensorProto.DOUBLE}), "dtype", "DOUBLE"),
    (helper.make_node("MatMul", ["a", "b"], ["c"]), facts({"a": TensorProto.INT64}), "dtype", "MatMul on INT64"),
    (helper.make_node("Relu", ["a"], ["b"]), facts({"a": TensorProto.UINT8}), "dtype", "UINT8"),
    (helper.make_node("TopK", ["x", "k"], ["v", "i"], sorted=0), facts(constants={"k": [3]}), "attribute", "sorted"),
    (helper.make_node("TopK", ["x", "k"], ["v", "i"]), facts(), "attribute", "build-time constant"),
    (helper.make_node("Attention", ["q", "k", "v", "m", "pk", "pv"], ["o"]), facts(), "attribute", "past_key"),
    (helper.make_node("Attention", ["q", "k", "v"], ["o", "pk", "pv"]), facts(), "attribute", "present_key"),
    (helper.make_node("Attention", ["q", "k", "v"], ["o"], softcap=30.0), facts(), "attribute", "softcap"),
    (helper.make_node("Attention", ["q", "k", "v"], ["o"], q_num_heads=2, kv_num_heads=2),
     facts(shapes={n: [1, 3, 8] for n in "qkv"}), "shape", "4D"),
    (helper.make_node("DequantizeLinear", ["w", "s", "z"], ["y"]),
     facts({"w": TensorProto.INT8}, constants={"z": np.ones(4, np.int8)}), "attribute", "zero point"),
    (helper.make_node("DequantizeLinear", ["w", "s"], ["y"], block_size=32), facts({"w": TensorProto.INT4}),
     "attribute", "block_size 32 is not supported (TensorRT takes 64 or 128)"),
    (helper.make_node("Squeeze", ["x", "axes"], ["y"]), facts(), "attribute", "axes"),
    (helper.make_node("Resize", ["x", "", "s"], ["y"], mode="cubic"), facts(), "attribute", "nearest and linear"),
    (helper.make_node("LayerNormalization", ["x", "g"], ["y", "mean"]), facts(), "attribute", "first output"),
    (helper.make_node("GridSample", ["x", "g"], ["y"]), facts(shapes={"x": [1, 2, 3, 4, 5]}), "shape", "4D"),
])
def test_unsupported_nodes_say_why(node, f, kind, words):
    verdict = check_node(node, f)
    assert verdict is not None and verdict.kind == kind and words in verdict.reason, verdict


def test_control_flow_is_checked_through_its_bodies():
    body = helper.make_graph([helper.make_node("Unique", ["x"], ["y"])], "body", [], [])
    node = helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)
    verdict = check_node(node, facts())
    assert verdict.kind == "op" and verdict.reason.startswith("If body: Unique")
