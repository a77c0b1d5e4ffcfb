"""INT4 group quantization and its two ONNX forms, each checked against ONNX Runtime and an unpacker written from
the format's spec (not from the packer's helpers). Fresh random weights every run; the `rng` fixture prints the seed.

Float tolerance against ONNX Runtime (MatMulNBits at accuracy level 0, DequantizeLinear + MatMul kept in float):
rtol 1e-5, atol 1e-4 for outputs up to about 90 in magnitude; over 240 random draws the measured difference was 0.
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from builders import tensor, unpack_int4, unpack_matmulnbits
from mmtrt.ir.rewrite import cleanup
from mmtrt.quant import int4
from mmtrt.quant.int4 import (INDICATOR_MAX_BYTES, dequantize_groups, dequantize_linear_nodes, matmulnbits_node,
                              matmulnbits_offset_nodes, quantize_groups)

# (N, K, group): K a multiple of the group or not, odd N, odd group counts (zero points packed with a pad nibble).
SHAPES = [(16, 256, 64), (7, 100, 32), (5, 130, 16), (3, 96, 32)]


def _weight(rng, n, k):
    return (rng.normal(size=(n, k)) * rng.uniform(0.01, 2.0)).astype(np.float32)


def _session(model, **config):
    options = ort.SessionOptions()
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _model(nodes, inits, m, k, n):
    graph = helper.make_graph(nodes, "g", [tensor("x", [m, k])], [tensor("y", [m, n])], inits)
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model


@pytest.mark.parametrize("n,k,group", SHAPES)
def test_symmetric_grid(rng, n, k, group):
    w = _weight(rng, n, k)
    q, scales, zero_points = quantize_groups(w, group)
    assert zero_points is None and q.dtype == np.int8 and q.shape == (n, k)
    assert scales.shape == (n, -(-k // group)) and (scales > 0).all()
    assert q.min() >= -8 and q.max() <= 7
    s = np.repeat(scales, group, axis=1)[:, :k]
    err = np.abs(w - dequantize_groups(q, scales, None, group))
    unclipped = (w / s >= -8.5) & (w / s <= 7.5)
    assert (err[unclipped] <= s[unclipped] * (0.5 + 1e-5)).all()
    # The largest magnitude of each group lands exactly on a grid end: -8 when it is negative, else +7.
    for row in range(n):
        for g in range(scales.shape[1]):
            wg, qg = w[row, g * group:(g + 1) * group], q[row, g * group:(g + 1) * group]
            i = np.argmax(np.abs(wg))
            assert qg[i] == (-8 if -wg.min() >= wg.max() else 7)


@pytest.mark.parametrize("n,k,group", SHAPES)
def test_asymmetric_grid(rng, n, k, group):
    w = _weight(rng, n, k) + np.float32(rng.normal())
    q, scales, zero_points = quantize_groups(w, group, symmetric=False)
    assert q.min() >= 0 and q.max() <= 15 and zero_points.dtype == np.uint8 and zero_points.max() <= 15
    assert zero_points.shape == scales.shape == (n, -(-k // group))
    s = np.repeat(scales, group, axis=1)[:, :k]
    assert (np.abs(w - dequantize_groups(q, scales, zero_points, group)) <= s * (0.5 + 1e-5)).all()


def test_float_zero_point_reproduces_a_min_max_grid(rng):
    """Weights already on a Q4_1-style grid (w = d q + m per group of 32, q in 0..15) come back exactly, which the
    integer zero point cannot do (its zero point rounds)."""
    d = rng.uniform(0.01, 0.1, size=(6, 4, 1)).astype(np.float32)
    m = -rng.uniform(0.1, 1.0, size=(6, 4, 1)).astype(np.float32)
    q = rng.integers(0, 16, size=(6, 4, 32))
    q[..., 0], q[..., 1] = 0, 15  # every group spans its whole grid
    w = (d * q + m).reshape(6, 128).astype(np.float32)
    got = dequantize_groups(*quantize_groups(w, 32, symmetric=False, float_zero_point=True), 32)
    np.testing.assert_allclose(got, w, rtol=0, atol=1e-6)
    rounded = dequantize_groups(*quantize_groups(w, 32, symmetric=False), 32)
    assert np.abs(rounded - w).max() > 1e-3


@pytest.mark.parametrize("symmetric", [True, False])
def test_clip_ratio_shrinks_the_range(rng, symmetric):
    w = _weight(rng, 8, 128)
    _, full, _ = quantize_groups(w, 32, symmetric)
    ratio = rng.uniform(0.5, 1.0, size=full.shape).astype(np.float32)
    q, clipped, zp = quantize_groups(w, 32, symmetric, clip_ratio=ratio)
    assert (clipped <= full * (1 + 1e-6)).all()
    if symmetric:
        np.testing.assert_allclose(clipped, full * ratio, rtol=1e-6)
        assert np.abs(dequantize_groups(q, clipped, zp, 32)).max() <= np.abs(w).max()


def test_all_zero_group_has_a_positive_scale():
    w = np.zeros((2, 64), np.float32)
    w[1, 32:] = 1.0
    for symmetric in (True, False):
        q, scales, zp = quantize_groups(w, 32, symmetric)
        assert (scales > 0).all()
        np.testing.assert_allclose(dequantize_groups(q, scales, zp, 32), w, rtol=1e-6)


def test_symmetric_grid_beats_amax_over_7(rng):
    """The chosen grid's weight MSE against modelopt's amax / 7 grid on Gaussian weights (about 11 % lower)."""
    w = rng.normal(size=(256, 1024)).astype(np.float32)
    q, scales, _ = quantize_groups(w, 128)
    ours = np.mean((dequantize_groups(q, scales, None, 128) - w) ** 2)
    amax7 = np.abs(w.reshape(256, 8, 128)).max(-1) / 7
    theirs = np.mean((np.clip(np.rint(w / np.repeat(amax7, 128, 1)), -8, 7) * np.repeat(amax7, 128, 1) - w) ** 2)
    assert ours < 0.93 * theirs


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("n,k,group", SHAPES)
def test_matmulnbits(rng, n, k, group, symmetric):
    w, x = _weight(rng, n, k), rng.normal(size=(3, k)).astype(np.float32)
    q, scales, zero_points = quantize_groups(w, group, symmetric)
    node, inits = matmulnbits_node("lin", "x", q, scales, zero_points, k, n, group, 0, output="y")
    arrays = {t.name.removeprefix("lin."): numpy_helper.to_array(t) for t in inits}
    uq, uscales, uzp = unpack_matmulnbits(arrays, n, k, group)
    np.testing.assert_array_equal(uq, q)
    np.testing.assert_array_equal(uscales, scales)
    assert (uzp is None) == (zero_points is None)
    if not symmetric:
        np.testing.assert_array_equal(uzp, zero_points)
    model = _model([node], inits, 3, k, n)
    onnx.checker.check_model(model, full_check=True)
    got = _session(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x @ dequantize_groups(q, scales, zero_points, group).T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("n,k,group", SHAPES + [(4, 4864, 32), (4, 2100, 16)])  # group sums by ReduceSum, padded
def test_matmulnbits_with_float_zero_points(rng, n, k, group, level):
    """A MatMulNBits without zero points holding q - 8, plus (x summed per group) @ offsets^T; at level 4 only the
    MatMulNBits part sees int8 activations."""
    w, x = _weight(rng, n, k) + np.float32(rng.normal()), rng.normal(size=(3, k)).astype(np.float32)
    q, scales, zero_points = quantize_groups(w, group, symmetric=False, float_zero_point=True)
    assert zero_points.dtype == np.float32
    nodes, inits = matmulnbits_offset_nodes("lin", "x", q, scales, zero_points, k, n, group, level, output="y")
    arrays = {t.name: numpy_helper.to_array(t) for t in inits}
    uq, uscales, uzp = unpack_matmulnbits({"B": arrays["lin.B"], "scales": arrays["lin.scales"]}, n, k, group)
    np.testing.assert_array_equal(uq + 8, q)
    assert uzp is None
    assert any(n.op_type == "ReduceSum" for n in nodes) == (k * -(-k // group) * 4 > INDICATOR_MAX_BYTES)
    model = _model(nodes, inits, 3, k, n)
    onnx.checker.check_model(model, full_check=True)
    got = _session(model).run(None, {"x": x})[0]
    expected = x @ dequantize_groups(q, scales, zero_points, group).T
    if level == 0:
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(expected).max() / 10))
        return
    # int8 activations (symmetric, at most max|x| / 127 per step) reach only the MatMulNBits part, (q - 8) s: its
    # rounding error is bounded by half a step times the sum of that part's magnitudes.
    int4_part = dequantize_groups(q.astype(np.int16) - 8, scales, None, group)
    bound = np.abs(x).max(axis=1, keepdims=True) / 254 * np.abs(int4_part).sum(axis=1)
    assert np.all(np.abs(got - expected) <= 1.01 * bound + 1e-4)


def test_matmulnbits_rejects_a_transposed_weight(rng):
    q, scales, _ = quantize_groups(_weight(rng, 4, 64), 32)
    with pytest.raises(ValueError, match=r"expected \[N, K\]"):
        matmulnbits_node("lin", "x", q.T, scales, None, 64, 4, 32, 0, output="y")


@pytest.mark.parametrize("n,k,group", SHAPES)
def test_dequantize_linear_int4(rng, n, k, group):
    w, x = _weight(rng, n, k), rng.normal(size=(3, k)).astype(np.float32)
    q, scales, _ = quantize_groups(w, group)
    nodes, inits = dequantize_linear_nodes("lin", "x", "y", q, scales, group)
    weight, scale = inits[:2]
    written = unpack_int4(weight)  # whole blocks: a partial last group is padded with zero rows
    np.testing.assert_array_equal(written[:k], q.T)
    assert not written[k:].any() and written.shape[0] % group == 0
    np.testing.assert_array_equal(numpy_helper.to_array(scale), scales.T)
    dq = nodes[0]
    assert dq.op_type == "DequantizeLinear" and len(dq.input) == 2
    assert {a.name: a.i for a in dq.attribute} == {"axis": 0, "block_size": group}
    assert [n.op_type for n in nodes] == ["DequantizeLinear"] + (["Pad"] if k % group else []) + ["MatMul"]
    model = _model(nodes, inits, 3, k, n)
    onnx.checker.check_model(model, full_check=True)
    # Without this entry ONNX Runtime fuses DQ + MatMul into MatMulNBits at accuracy level 4 (int8 activations).
    got = _session(model, **{"session.qdq_matmulnbits_accuracy_level": "0"}).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x @ dequantize_groups(q, scales, None, group).T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("k,group,block", [(576, 128, 64), (320, 128, 64), (288, 128, 128), (288, 64, 64)])
def test_a_partial_last_group_is_written_in_whole_blocks(rng, k, group, block):
    """TensorRT's parser takes only scale dims K / block (onnx-tensorrt validateScaleDimensions): K = 576 at group
    128 becomes nine blocks of 64 with each scale repeated, K = 288 (not a multiple of 64) zero rows and padded
    activations; the product is the one the groups define."""
    w, x = _weight(rng, 6, k), rng.normal(size=(2, 3, k)).astype(np.float32)
    q, scales, _ = quantize_groups(w, group)
    nodes, inits = dequantize_linear_nodes("lin", "x", "y", q, scales, group)
    weight, scale = (numpy_helper.to_array(t) for t in inits[:2])
    dq = next(n for n in nodes if n.op_type == "DequantizeLinear")
    assert {a.name: a.i for a in dq.attribute}["block_size"] == block
    assert weight.shape[0] % block == 0 and scale.shape[0] == weight.shape[0] // block
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    got = _session(model, **{"session.qdq_matmulnbits_accuracy_level": "0"}).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x @ dequantize_groups(q, scales, None, group).T, rtol=1e-5, atol=1e-4)


def test_dequantize_linear_survives_constant_folding(rng):
    """onnx-graphsurgeon never folds Q/DQ nodes (its NO_FOLD_OPS), so the weight stays INT4 through graph cleanup."""
    q, scales, _ = quantize_groups(_weight(rng, 8, 128), 64)
    nodes, inits = dequantize_linear_nodes("lin", "x", "y", q, scales, 64)
    cleaned = cleanup(_model(nodes, inits, 3, 128, 8), fold_constants=True)
    assert [n.op_type for n in cleaned.graph.node] == ["DequantizeLinear", "MatMul"]
    weight = next(t for t in cleaned.graph.initializer if t.name == "lin.weight")
    np.testing.assert_array_equal(unpack_int4(weight), q.T)


def test_dequantize_linear_rejects_unsigned_q():
    with pytest.raises(ValueError, match="symmetric"):
        dequantize_linear_nodes("lin", "x", "y", np.full((4, 64), 15, np.int8), np.ones((4, 2), np.float32), 32)


@pytest.mark.parametrize("symmetric, float_zero_point", [(True, False), (False, False), (False, True)])
def test_rows_rounded_in_blocks_are_rounded_as_whole(rng, monkeypatch, symmetric, float_zero_point):
    """A weight wider than one block of rows (a 151,936-row lm_head) rounds and dequantizes to the same bytes."""
    w = rng.standard_t(3, size=(45, 80)).astype(np.float32)
    clip = rng.choice([1.0, 0.9, 0.75], size=(45, 3)).astype(np.float32)
    whole = quantize_groups(w, 32, symmetric, clip, float_zero_point)
    monkeypatch.setattr(int4, "ROW_BLOCK_ELEMENTS", 10 * 80)
    blocked = quantize_groups(w, 32, symmetric, clip, float_zero_point)
    for a, b in zip(blocked, whole):
        np.testing.assert_array_equal(a, b)
    blocked_dq = dequantize_groups(*blocked, 32)
    monkeypatch.undo()
    np.testing.assert_array_equal(blocked_dq, dequantize_groups(*whole, 32))
