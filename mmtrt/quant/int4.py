"""Group-wise INT4 weight quantization and the two ONNX forms of an INT4 linear.

Weights are in PyTorch's linear layout, `[N, K]` = (out_features, in_features), grouped along K. When K is not a
multiple of the group size the last group is shorter (ceil(K / group) groups, as ONNX Runtime's MatMulNBits counts
them).

Symmetric grid: 16 levels [-8, 7] with a positive scale per group. A group whose largest magnitude is negative gets
scale = amax / 8, so that weight lands exactly on -8; otherwise scale = amax / 7, so it lands on +7. Every backend
takes this grid as is: TensorRT requires strictly positive DequantizeLinear scales (which rules out a negative scale
that would map every group's largest weight to -8), MatMulNBits stores q + 8 under its default zero point 8, and
TensorRT-LLM's W4A16 kernels multiply signed q by the scale. On Gaussian weights (group 128) this grid's MSE is
11 % below amax / 7 (modelopt's grid, 15 levels used); the only clipping is an opposite-sign weight beyond 7.5 steps.

Asymmetric grid: uint4 [0, 15] over [min(w, 0), max(w, 0)] with an integer zero point (ONNX Runtime only: TensorRT
and TensorRT-LLM's W4A16_AWQ are symmetric). With a float zero point, uint4 over [min(w), max(w)] exactly: the
grid of GGUF's Q4_1 and of HQQ (see `matmulnbits_offset_nodes` for how ONNX Runtime runs it fast).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper


def num_groups(k: int, group_size: int) -> int:
    """ceil(K / group): the count MatMulNBits blocks and DequantizeLinear's blocked scales both use."""
    return -(-k // group_size)


def _grouped(w: np.ndarray, group_size: int) -> np.ndarray:
    """`w` [N, K] as [N, G, group_size], the short last group padded with zeros (which change no group's range)."""
    n, k = w.shape
    padded = np.zeros((n, num_groups(k, group_size) * group_size), np.float32)
    padded[:, :k] = w
    return padded.reshape(n, -1, group_size)


ROW_BLOCK_ELEMENTS = 2**23  # weights (32 MB in float32) a block of rows (output channels) holds at most


def row_blocks(n: int, k: int) -> list[slice]:
    """Slices of an [n, k] weight's rows of at most ROW_BLOCK_ELEMENTS weights each (one slice when it fits): what
    is widened, scaled or rounded at a time, so a wide linear (a 151,936-row lm_head) never is as a whole."""
    rows = max(1, ROW_BLOCK_ELEMENTS // max(k, 1))
    return [slice(a, min(a + rows, n)) for a in range(0, n, rows)]


def quantize_groups(w: np.ndarray, group_size: int, symmetric: bool = True,
                    clip_ratio: float | np.ndarray | None = None,
                    float_zero_point: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Round-to-nearest INT4 of a linear weight `w` [N, K]: (q int8 [N, K], scales float32 [N, G], zero points).

    q is signed [-8, 7] with no zero points when symmetric, unsigned [0, 15] with uint8 zero points [N, G] otherwise
    (float32 zero points with `float_zero_point`; the short last group's padding zeros are in its range).
    `clip_ratio` (a scalar or [N, G]) shrinks each group's range first, as AWQ's clip search does; values outside
    the shrunk range clip to the grid's ends. Rows are rounded a block at a time (each row on its own, so the
    result is the same), so a wide weight's float temporaries take one block's memory.
    """
    return quantize_row_blocks(lambda rows: w[rows], np.shape(w), group_size, symmetric, clip_ratio, float_zero_point)


def quantize_row_blocks(rows_of, shape: tuple[int, int], group_size: int, symmetric: bool = True,
                        clip_ratio: float | np.ndarray | None = None, float_zero_point: bool = False):
    """`quantize_groups` of the [N, K] weight that `rows_of(slice)` gives a block of rows at a time (`row_blocks`),
    so a wide weight is never whole in float32; the result is the same, each row being rounded on its own."""
    blocks = row_blocks(*shape)
    ratio = None if clip_ratio is None else np.asarray(clip_ratio, np.float32)
    if len(blocks) == 1:
        return _quantize_rows(rows_of(blocks[0]), group_size, symmetric, ratio, float_zero_point)
    out = None
    for r in blocks:
        block_ratio = ratio if ratio is None or ratio.ndim == 0 else ratio[r]
        part = _quantize_rows(rows_of(r), group_size, symmetric, block_ratio, float_zero_point)
        if out is None:  # filled in place: concatenating the blocks held q twice
            out = [None if a is None else np.empty((shape[0], *a.shape[1:]), a.dtype) for a in part]
        for whole, a in zip(out, part):
            if a is not None:
                whole[r] = a
    return tuple(out)


def _quantize_rows(w: np.ndarray, group_size: int, symmetric: bool, clip_ratio, float_zero_point: bool):
    groups = _grouped(np.asarray(w, np.float32), group_size)
    ratio = np.float32(1.0) if clip_ratio is None else np.asarray(clip_ratio, np.float32)
    lo, hi = groups.min(-1) * ratio, groups.max(-1) * ratio
    if symmetric:
        scales = np.where(-lo >= hi, -lo / 8, hi / 7)
        scales = np.where(scales > 0, scales, 1).astype(np.float32)  # an all-zero group: any positive scale
        q = np.clip(np.rint(groups / scales[..., None]), -8, 7)
        zero_points = None
    elif float_zero_point:
        scales = np.where(hi > lo, (hi - lo) / 15, 1).astype(np.float32)
        zero_points = (-lo / scales).astype(np.float32)
        q = np.clip(np.rint(groups / scales[..., None] + zero_points[..., None]), 0, 15)
    else:
        lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
        scales = np.where(hi > lo, (hi - lo) / 15, 1).astype(np.float32)
        zero_points = np.clip(np.rint(-lo / scales), 0, 15).astype(np.uint8)
        q = np.clip(np.rint(groups / scales[..., None]) + zero_points[..., None], 0, 15)
    k = np.shape(w)[1]
    return q.reshape(q.shape[0], -1)[:, :k].astype(np.int8), scales, zero_points


def dequantize_groups(q: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                      group_size: int) -> np.ndarray:
    """The reference inverse, (q - zero point) * scale in float32, [N, K]; every layout's test compares with it.
    Rows a block at a time into one array."""
    out, scales = np.empty(q.shape, np.float32), np.asarray(scales)
    for r in row_blocks(*q.shape):
        out[r] = _dequantize_rows(q[r], scales[r], None if zero_points is None else zero_points[r], group_size)
    return out


def _dequantize_rows(q: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                     group_size: int) -> np.ndarray:
    k = q.shape[1]
    s = np.repeat(np.asarray(scales, np.float32), group_size, axis=1)[:, :k]
    z = 0 if zero_points is None else np.repeat(zero_points.astype(np.float32), group_size, axis=1)[:, :k]
    return (q.astype(np.float32) - z) * s



def quantize_columns(x: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                     grid: "Grid") -> tuple[np.ndarray, np.ndarray]:
    """One weight column [N] on given per-row scales (and zero points) of `grid`: (q int8, dequantized float64),
    rounded as `quantize_groups` rounds (GPTQ picks the scales before it rounds the group's columns)."""
    if grid.symmetric:
        q = np.clip(np.rint(x / scales), -8, 7)
        return q.astype(np.int8), q * scales
    z = zero_points.astype(np.float64)
    q = np.clip(np.rint(x / scales + z) if grid.float_zero_point else np.rint(x / scales) + z, 0, 15)
    return q.astype(np.int8), (q - z) * scales


@dataclass(frozen=True)
class Grid:
    """One INT4 format: group size, symmetric or not, integer or float zero points."""

    group: int
    symmetric: bool = True
    float_zero_point: bool = False

    def quantize(self, w: np.ndarray, clip_ratio=None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        return quantize_groups(w, self.group, self.symmetric, clip_ratio, self.float_zero_point)

    def quantize_rows_of(self, rows_of, shape: tuple[int, int], clip_ratio=None):
        return quantize_row_blocks(rows_of, shape, self.group, self.symmetric, clip_ratio, self.float_zero_point)

    def fake(self, w: np.ndarray, clip_ratio=None) -> np.ndarray:
        """Quantize and dequantize: what the lowered weight is, in float."""
        return dequantize_groups(*self.quantize(w, clip_ratio), self.group)

def pack_nibbles(u: np.ndarray) -> np.ndarray:
    """Pairs along the last axis (even length) into bytes, the first of each pair in the low nibble."""
    u = u.astype(np.uint8) & 0x0F
    return u[..., 0::2] | (u[..., 1::2] << 4)


def matmulnbits_node(name: str, x_input: str, q: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                     K: int, N: int, block: int, accuracy_level: int, *,
                     output: str) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """`output` = x @ dequantized(W).T as one ONNX Runtime `com.microsoft.MatMulNBits` (4 bits) and its initializers.

    B is uint8 [N, ceil(K/block), block/2], packed along K; scales are flat [N * ceil(K/block)] in the activations'
    dtype (pass them cast); zero points, when given, are packed two per byte per row. Without zero points the op's
    default, 8, applies, so symmetric q is stored as q + 8. Accuracy level 0 keeps activations in float; 4 quantizes
    them to int8 (fastest on the CPU).
    """
    _check_shape(name, q, N, K)
    if zero_points is None:
        b = _packed(q, 8, np.full((N, 1), 8, np.uint8), block)
    else:
        b = _packed(q, 0, zero_points[:, -1:], block)  # padding dequantizes to 0
    return _matmulnbits(name, x_input, b, scales, zero_points, K, N, block, accuracy_level, output)


def _check_shape(name: str, q: np.ndarray, N: int, K: int) -> None:
    if q.shape != (N, K):
        raise ValueError(f"MatMulNBits {name}: q is {list(q.shape)}, expected [N, K] = [{N}, {K}]")


def _packed(q: np.ndarray, offset: int, pad: np.ndarray, block: int) -> np.ndarray:
    """q + offset as nibbles [N, G, block/2], each row's short last group filled with its `pad` ([N, 1]); a block
    of rows at a time in uint8 (a 151,936-row lm_head's whole-weight integer temporaries took 1.5 GB)."""
    n, k = q.shape
    g = num_groups(k, block)
    out = np.empty((n, g, block // 2), np.uint8)
    for r in row_blocks(n, k):
        rows = np.empty((r.stop - r.start, g * block), np.uint8)
        rows[:, :k] = q[r] + offset
        rows[:, k:] = pad[r]
        out[r] = pack_nibbles(rows.reshape(-1, g, block))
    return out


def _matmulnbits(name: str, x_input: str, b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                 K: int, N: int, block: int, accuracy_level: int, output: str
                 ) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    g = num_groups(K, block)
    inits = [numpy_helper.from_array(b, f"{name}.B"), numpy_helper.from_array(np.asarray(scales).reshape(-1),
                                                                               f"{name}.scales")]
    if zero_points is not None:
        zp = np.pad(zero_points, ((0, 0), (0, g % 2)))
        inits.append(numpy_helper.from_array(pack_nibbles(zp).reshape(-1), f"{name}.zero_points"))
    node = helper.make_node("MatMulNBits", [x_input, *(t.name for t in inits)], [output], name=name,
                            domain="com.microsoft", K=K, N=N, bits=4, block_size=block, accuracy_level=accuracy_level)
    return node, inits


def matmulnbits_offset_nodes(name: str, x_input: str, q: np.ndarray, scales: np.ndarray, zero_points: np.ndarray,
                             K: int, N: int, block: int, accuracy_level: int, *,
                             output: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """`output` = x @ dequantized(W).T for unsigned q with float zero points, without MatMulNBits' float zero point
    input (ONNX Runtime 1.31 runs it on a slow path, measured 6x slower than fp32): (q - z) s = (q - 8) s + (8 - z) s,
    so a MatMulNBits without zero points (its fast kernels) plus, per group, the sum of x over the group times
    (8 - z) s: `group_sum_nodes(x)` @ O^T with O the [N, G] offsets, a small float MatMul. The sums are named by
    the input and the block, so linears reading one tensor share them (callers keep the first of equal names)."""
    g = num_groups(K, block)
    scales = np.asarray(scales)
    _check_shape(name, q, N, K)
    b = _packed(q, 0, np.full((N, 1), 8, np.uint8), block)  # unsigned q under the default zero point 8
    node, inits = _matmulnbits(name, x_input, b, scales, None, K, N, block, accuracy_level, f"{name}.int4_out")
    offsets = ((8 - zero_points) * scales).astype(scales.dtype)
    sums, sum_nodes, sum_inits = group_sum_nodes(x_input, K, block, scales.dtype)
    inits += sum_inits + [numpy_helper.from_array(np.ascontiguousarray(offsets.T), f"{name}.offsets")]
    nodes = [node, *sum_nodes,
             helper.make_node("MatMul", [sums, f"{name}.offsets"], [f"{name}.offset_out"], name=f"{name}.offsets"),
             helper.make_node("Add", [f"{name}.int4_out", f"{name}.offset_out"], [output], name=f"{name}.add")]
    return nodes, inits


# Above this many bytes (a core's L2 cache) the [K, G] group indicator costs more to read per call than the four
# small kernels of a Reshape and ReduceSum; below it, one MatMul is the cheaper launch at a decode step.
INDICATOR_MAX_BYTES = 1 << 20


def group_sum_nodes(x_input: str, K: int, block: int,
                    dtype: np.dtype) -> tuple[str, list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The sum of x [..., K] over each group of `block` channels, [..., G]. A small K x G indicator is one MatMul;
    a large one (a 4,864-wide down_proj's, 2.9 MB) is x reshaped to [..., G, block] (a short last group padded
    with zeros) and a ReduceSum, which reads x once: 37x faster at 2,049 tokens, and not slower at one token."""
    g = num_groups(K, block)
    sums = f"{x_input}.group_sums.b{block}"
    if K * g * np.dtype(dtype).itemsize <= INDICATOR_MAX_BYTES:
        indicator = group_indicator(K, block, dtype)
        name = f"int4.group_indicator.k{K}.b{block}.{indicator.dtype}"
        return sums, [helper.make_node("MatMul", [x_input, name], [sums], name=sums)], [
            numpy_helper.from_array(indicator, name)]
    consts = {f"int4.group_shape.g{g}.b{block}": np.array([g, block], np.int64),
              "int4.last_axis": np.array([-1], np.int64)}
    nodes = [helper.make_node("Shape", [x_input], [f"{sums}.lead"], name=f"{sums}.lead", end=-1),
             helper.make_node("Concat", [f"{sums}.lead", f"int4.group_shape.g{g}.b{block}"], [f"{sums}.shape"],
                              name=f"{sums}.shape", axis=0)]
    grouped = x_input
    if K % block:
        consts[f"int4.group_pad.{g * block - K}"] = np.array([0, g * block - K], np.int64)
        nodes.append(helper.make_node("Pad", [x_input, f"int4.group_pad.{g * block - K}", "", "int4.last_axis"],
                                      [f"{sums}.padded"], name=f"{sums}.padded"))
        grouped = f"{sums}.padded"
    nodes += [helper.make_node("Reshape", [grouped, f"{sums}.shape"], [f"{sums}.grouped"], name=f"{sums}.grouped"),
              helper.make_node("ReduceSum", [f"{sums}.grouped", "int4.last_axis"], [sums], name=sums, keepdims=0)]
    return sums, nodes, [numpy_helper.from_array(v, k) for k, v in consts.items()]


def group_indicator(K: int, block: int, dtype: np.dtype) -> np.ndarray:
    """E [K, G]: 1 where channel k is in group g, so that x @ E sums x per group."""
    indicator = np.zeros((K, num_groups(K, block)), dtype)
    indicator[np.arange(K), np.arange(K) // block] = 1
    return indicator


def dequantize_linear_nodes(name: str, x_input: str, output: str, q: np.ndarray, scales: np.ndarray,
                            block: int) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """`output` = x @ dequantized(W).T as INT4 initializer -> DequantizeLinear -> MatMul (opset 21+).

    This is the weight-only form TensorRT builds INT4 GEMMs from. MatMul takes W as [K, N], so the INT4 weight is
    q transposed, blocked along K on axis 0, with scales [K/block, N] (same rank, strictly positive) and no zero
    point: symmetric q only. Keep constant folding away from the DequantizeLinear or the weight is float again.
    TensorRT's parser takes only whole blocks ("The quantization axis must divide into whole blocks"), so a K with
    a partial last group is written exactly in whole ones (`whole_blocks`).
    """
    if q.min() < -8 or q.max() > 7:
        raise ValueError(f"DequantizeLinear {name}: INT4 weights are signed [-8, 7] (symmetric grid only)")
    k = q.shape[1]
    q, scales, block, pad = whole_blocks(q, np.asarray(scales), block)
    weight = numpy_helper.from_array(np.ascontiguousarray(q.T).astype(ml_dtypes.int4), f"{name}.weight")
    scale = numpy_helper.from_array(np.ascontiguousarray(scales.T), f"{name}.weight_scale")
    nodes = [helper.make_node("DequantizeLinear", [weight.name, scale.name], [f"{name}.weight_dq"], name=f"{name}.dq",
                              axis=0, block_size=block)]
    inits = [weight, scale]
    if pad:  # the activations get the zero columns the weight got as zero rows
        inits += [numpy_helper.from_array(np.array([0, pad], np.int64), f"{name}.pads"),
                  numpy_helper.from_array(np.array([-1], np.int64), f"{name}.pad_axes")]
        nodes.append(helper.make_node("Pad", [x_input, f"{name}.pads", "", f"{name}.pad_axes"], [f"{name}.x_padded"],
                                      name=f"{name}.pad"))
        x_input = f"{name}.x_padded"
    nodes.append(helper.make_node("MatMul", [x_input, f"{name}.weight_dq"], [output], name=name))
    assert k + pad == q.shape[1]
    return nodes, inits


WHOLE_BLOCK = 64  # the smaller block TensorRT's INT4 DequantizeLinear takes


def whole_blocks(q: np.ndarray, scales: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """q [N, K] and scales [N, ceil(K/block)] as whole blocks, exactly: a K that is a multiple of 64 with a block
    that is one too takes block 64, each scale repeated over the 64-blocks of its group (K = 576 at block 128:
    nine blocks of 64); any other K is padded with zero weights up to whole blocks, and the caller pads the
    activations as much (returned: the padding). The dequantized weights are the same."""
    k = q.shape[1]
    if k % block == 0:
        return q, scales, block, 0
    if k % WHOLE_BLOCK == 0 and block % WHOLE_BLOCK == 0:
        return q, np.repeat(scales, block // WHOLE_BLOCK, axis=1)[:, : k // WHOLE_BLOCK], WHOLE_BLOCK, 0
    pad = num_groups(k, block) * block - k
    return np.pad(q, ((0, 0), (0, pad))), scales, block, pad
