"""Weights moved to the compile's scratch file read back as the arrays they were (whole, by rows, by columns; in
their own dtypes; packed int4 as its values), go back into a graph as the same bytes, join and transpose as numpy
does, and leave no file behind; int64 tensors (shapes, indices) and small ones stay in memory."""

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from conftest import compile_to
from mmtrt.bundle.trust import manifest_digest
from mmtrt.ir import source_weights, spill
from mmtrt.ir.graph import Component


def _model(rng):
    weights = [numpy_helper.from_array(rng.normal(size=(96, 40)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.normal(size=(96, 24)).astype(np.float16), "half"),
               numpy_helper.from_array(rng.integers(-128, 128, (96, 56)).astype(np.int8), "codes"),
               numpy_helper.from_array(rng.integers(0, 256, (7, 3, 5)).astype(np.uint8), "cube"),
               numpy_helper.from_array(rng.integers(-8, 8, (95, 41)).astype(ml_dtypes.int4), "nibbles"),
               numpy_helper.from_array(rng.integers(0, 16, (33, 97)).astype(ml_dtypes.uint4), "unsigned"),
               numpy_helper.from_array(rng.integers(0, 99, (300,)).astype(np.int64), "index"),
               numpy_helper.from_array(rng.normal(size=(2,)).astype(np.float32), "small")]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])], weights)
    return helper.make_model(graph)


MOVED = ("w", "half", "codes", "cube", "nibbles", "unsigned")


def test_spilled_weights_read_back_as_they_were(tmp_path, rng, monkeypatch):
    monkeypatch.setattr(spill, "MIN_BYTES", 100)
    comp = Component("c", [], [], onnx=_model(rng))
    old = comp.onnx
    before = {t.name: t.SerializeToString() for t in old.graph.initializer}
    arrays = {t.name: numpy_helper.to_array(t) for t in old.graph.initializer}
    raws = {t.name: t.raw_data for t in old.graph.initializer}
    with source_weights.kept(), spill.scratch(tmp_path):
        assert spill.spill(comp) == sum(len(raws[n]) for n in MOVED)
        model = comp.onnx
        assert model is not old and model.graph.node == old.graph.node  # a fresh message: the old one's arena goes
        inits = {t.name: t for t in model.graph.initializer}
        assert sorted(n for n, t in inits.items() if source_weights.is_reference(t)) == sorted(MOVED)
        assert not any(t.raw_data for n, t in inits.items() if source_weights.is_reference(t))
        for name in MOVED:
            got = source_weights.array(inits[name])
            assert got.dtype == arrays[name].dtype and np.array_equal(got, arrays[name])
            got[...] = 0  # a new, writable array: the scratch file keeps its bytes
            assert np.array_equal(source_weights.array(inits[name], slice(1, 4)), arrays[name][:, 1:4])
            data = source_weights.tensor_data(inits[name])
            assert len(data) == len(raws[name])
            assert b"".join(bytes(p) for p in data.blocks(1000)) == raws[name]
        assert len(raws["nibbles"]) == (95 * 41 + 1) // 2  # two values a byte
        joined = source_weights.joined([inits["w"], inits["w"]], "both")
        assert np.array_equal(numpy_helper.to_array(joined), np.concatenate([arrays["w"]] * 2, axis=1))
        for name in ("codes", "nibbles"):
            flipped = numpy_helper.to_array(source_weights.transposed(inits[name]))
            assert np.array_equal(flipped, arrays[name].T)
        assert spill.spill(comp) == 0 and comp.onnx is model  # references stay as they are
        source_weights.materialize(model)
        assert {t.name: t.SerializeToString() for t in model.graph.initializer} == before
    assert list(tmp_path.iterdir()) == []


def test_outside_a_compile_nothing_moves(rng):
    comp = Component("c", [], [], onnx=_model(rng))
    with source_weights.kept():
        assert spill.spill(comp) == 0
    assert not any(source_weights.is_reference(t) for t in comp.onnx.graph.initializer)


def _anon_bytes() -> int:
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("RssAnon"))


def test_spilling_gives_the_weights_memory_back(tmp_path, rng):
    """upb keeps a cleared field's bytes in the message's arena: only a fresh message frees them."""
    comp = Component("c", [], [], onnx=onnx.ModelProto())
    for i in range(64):
        tensor = comp.onnx.graph.initializer.add(name=f"w{i}", data_type=onnx.TensorProto.INT8, dims=[4 << 20])
        tensor.raw_data = rng.integers(-128, 128, 4 << 20, dtype=np.int8).tobytes()
    del tensor
    before = _anon_bytes()
    with source_weights.kept(), spill.scratch(tmp_path):
        assert spill.spill(comp) == 64 << 22
        assert before - _anon_bytes() > 200e6, (before, _anon_bytes())


INT4_RECIPE = """model: {source: zoo, name: tiny-llava}
passes:
  - awq_int4: {method: rtn, group_size: 64, calibration: {samples: 1, text_windows: 1, search_tokens: 64}}
"""


def test_a_compile_moving_its_int4_weights_writes_the_same_bundle(tmp_path, monkeypatch):
    """awq_int4 lowered for TensorRT (the default partition: DequantizeLinear of packed int4), compiled with no
    weight moved to the scratch file and with every one moved (as made and after the pass): the same bundle, its
    writer, segment files and TensorRT's parser form reading the packed bytes back as they were."""
    monkeypatch.setattr(spill, "MIN_BYTES", 1 << 40)
    kept = compile_to(tmp_path, INT4_RECIPE, "kept.bundle")
    packed, move = [], spill._move

    def recorded(held, tensor):
        kind = tensor.data_type
        moved = move(held, tensor)
        packed.append(moved if kind == onnx.TensorProto.INT4 else 0)
        return moved
    monkeypatch.setattr(spill, "MIN_BYTES", 1)
    monkeypatch.setattr(spill, "_move", recorded)
    moved = compile_to(tmp_path, INT4_RECIPE, "moved.bundle")
    assert manifest_digest(moved) == manifest_digest(kept)
    assert sum(packed) > 0
    graph = onnx.load(moved / "llm.onnx", load_external_data=False).graph
    assert any(n.op_type == "DequantizeLinear" for n in graph.node)
