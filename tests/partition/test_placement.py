"""Placement splits a component into TensorRT and ONNX Runtime segments with reasons; the segments, run one after
another, compute what the whole graph computes; the demo bundles are whole TensorRT segments."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from builders import make_model, tensor
from mmtrt.backends.onnxruntime_backend import OrtRunner
from mmtrt.bundle.manifest import read_manifest
from mmtrt.bundle.stored import StoredTensors
from mmtrt.bundle.writer import save_onnx
from mmtrt.partition import segments
from mmtrt.partition.placement import ONNXRUNTIME, TENSORRT, place
from mmtrt.runtime.executors import SegmentChain


def split_model():
    """Six TensorRT nodes, BitwiseNot (no TensorRT), a one-node island, BitwiseNot, six TensorRT nodes that also
    read a tensor of the first segment."""
    rng = np.random.default_rng()
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
        helper.make_node("Add", ["h1", "b1"], ["h2"], name="add1"),
        helper.make_node("Relu", ["h2"], ["h3"], name="relu1"),
        helper.make_node("Sigmoid", ["h3"], ["h4"], name="sig1"),
        helper.make_node("Mul", ["h4", "hundred"], ["h5"], name="scale"),
        helper.make_node("Cast", ["h5"], ["i1"], to=TensorProto.INT32, name="to_int"),
        helper.make_node("BitwiseNot", ["i1"], ["i2"], name="not1"),
        helper.make_node("Neg", ["i2"], ["i3"], name="island"),
        helper.make_node("BitwiseNot", ["i3"], ["i4"], name="not2"),
        helper.make_node("Cast", ["i4"], ["f1"], to=TensorProto.FLOAT, name="to_float"),
        helper.make_node("Add", ["f1", "h5"], ["g1"], name="add2"),
        helper.make_node("MatMul", ["g1", "w2"], ["g2"], name="mm2"),
        helper.make_node("Abs", ["g2"], ["g3"], name="abs2"),  # Relu here could zero the whole output
        helper.make_node("Mul", ["g3", "hundred"], ["g4"], name="mul2"),
        helper.make_node("Tanh", ["g4"], ["y"], name="tanh"),
    ]
    inits = [("w1", rng.normal(size=(8, 8)).astype(np.float32)), ("b1", rng.normal(size=8).astype(np.float32)),
             ("w2", rng.normal(size=(8, 4)).astype(np.float32) / 100), ("hundred", np.array(100, np.float32))]
    model = make_model(nodes, [tensor("x", ["batch", 8])], [tensor("y", ["batch", 4])], inits, opset=23)
    return model


def test_split_segments_reasons_and_boundaries():
    p = place(split_model(), "vision", targeted=True, min_segment_size=5)
    assert [(s.backend, len(s.nodes)) for s in p.segments] == [(TENSORRT, 6), (ONNXRUNTIME, 3), (TENSORRT, 6)]
    report = {n["name"]: n for n in p.to_json()["nodes"]}
    assert report["not1"]["kind"] == "op" and "BitwiseNot" in report["not1"]["reason"]
    assert report["island"]["kind"] == "segment" and "1 nodes, fewer than partition.min_segment_size 5" in report["island"]["reason"]
    assert report["mm2"]["backend"] == TENSORRT and report["mm2"]["segment"] == "vision.2"
    first, middle, last = p.segments
    assert first.inputs == ["x"] and set(first.outputs) == {"i1", "h5"}
    assert middle.inputs == ["i1"] and middle.outputs == ["i4"]
    assert last.inputs == ["i4", "h5"] and last.outputs == ["y"]


def test_a_smaller_minimum_keeps_the_island_on_tensorrt():
    p = place(split_model(), "vision", targeted=True, min_segment_size=1)
    assert [(s.backend, len(s.nodes)) for s in p.segments] == [
        (TENSORRT, 6), (ONNXRUNTIME, 1), (TENSORRT, 1), (ONNXRUNTIME, 1), (TENSORRT, 6)]


def test_a_component_not_offered_to_tensorrt_stays_whole_on_onnxruntime():
    p = place(split_model(), "embed", targeted=False, min_segment_size=5)
    assert [(s.backend, len(s.nodes)) for s in p.segments] == [(ONNXRUNTIME, 15)]
    assert {n["reason"] for n in p.to_json()["nodes"]} == {"partition.embed does not list tensorrt"}


def test_segments_run_in_order_compute_the_whole_graph_from_its_weights(tmp_path, rng):
    """The segment files read the component's external data, so its weights are in the folder once."""
    model = split_model()
    p = place(model, "vision", targeted=True, min_segment_size=5)
    stored = StoredTensors(tmp_path)
    whole = save_onnx(model, tmp_path / "vision.onnx", 64, stored)
    written = segments.write(p, tmp_path, 64, {"artifact": whole[0], "files": whole}, stored)
    assert [w["onnx"] for w in written] == [f"vision.{i}.segment.onnx" for i in range(3)]
    assert [w["files"][1:] for w in written] == [["vision.onnx.data"], [], ["vision.onnx.data"]]
    assert [f.name for f in tmp_path.glob("*.data")] == ["vision.onnx.data"]
    steps = [(OrtRunner(tmp_path / w["onnx"]), s.inputs) for w, s in zip(written, p.segments)]
    x = rng.normal(size=(3, 8)).astype(np.float32)
    expected = OrtRunner(tmp_path / "vision.onnx").run({"x": x})["y"]
    got = SegmentChain(steps, ["y"]).run({"x": x})["y"]
    np.testing.assert_array_equal(got, expected)
    assert np.abs(expected).max() > 0


def test_profiles_follow_the_shape_plan_and_name_what_they_cannot_plan():
    dims = {"batch": {"min": 1, "opt": 2, "max": 4}, "past": {"min": 0, "opt": 8, "max": 31},
            "seq": {"min": 1, "opt": 4, "max": 16}}
    model = make_model([helper.make_node("Relu", ["a"], ["b"]), helper.make_node("Relu", ["c"], ["d"])],
                       [tensor("a", ["batch", "past + seq"]), tensor("c", ["batch", "n_unknown"])],
                       [tensor("b", ["batch", "past + seq"]), tensor("d", ["batch", "n_unknown"])])
    p = place(model, "llm", targeted=True, min_segment_size=1)
    seg = p.segments[0]
    seg.inputs = ["a"]
    profile, why = segments.profile(p, seg, dims)
    assert why is None and profile["a"] == {"min": [1, 1], "opt": [2, 12], "max": [4, 47]}
    planned = {**dims, "past + seq": {"min": 1, "opt": 9, "max": 32}}
    assert segments.profile(p, seg, planned)[0]["a"]["max"] == [4, 32]
    seg.inputs = ["a", "c"]
    profile, why = segments.profile(p, seg, dims)
    assert profile is None and "n_unknown" in why


@pytest.mark.parametrize("bundle_fixture", ["tiny_bundle", "siglip_bundle"])
def test_demo_bundles_are_whole_tensorrt_segments(bundle_fixture, request):
    bundle = request.getfixturevalue(bundle_fixture)
    m = read_manifest(bundle)
    for comp in ("vision", "llm"):
        placement = m["placement"][comp]
        assert [s["backend"] for s in placement["segments"]] == [TENSORRT], placement["segments"]
        assert all(n["backend"] == TENSORRT for n in placement["nodes"])
        assert placement["segments"][0]["onnx"] == m["components"][comp]["artifact"]
    assert {n["reason"] for n in m["placement"]["embed"]["nodes"]} == {"partition.embed does not list tensorrt"}
    plan = {e["id"]: e for e in m["tensorrt"]["segments"]}
    assert set(plan) == {"vision.0", "llm.0"}
    for comp in ("vision", "llm"):
        decode_or_all = plan[f"{comp}.0"]["profiles"][0]["shapes"]
        assert {k: v for k, v in decode_or_all.items() if k.startswith("past.") or comp == "vision"} == {
            k: v for k, v in m["profiles"][comp].items() if k.startswith("past.") or comp == "vision"}
        assert plan[f"{comp}.0"]["precision"]["dtype"] == "fp32"
