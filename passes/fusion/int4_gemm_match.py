"""awq_int4's TensorRT lowering of a linear, as it reaches the TensorRT segment after cast_precision:

    [Mul(x, pre-quant scale [K])] -> MatMul <- [Cast] <- DequantizeLinear(INT4 W [K, N], scales [G, N], axis 0)

The plugin takes the scales as stored (cast_precision leaves the DequantizeLinear in fp32 and casts its output; the
kernel rounds q * scale to the activations' type the same way) and the INT4 weight as int8 [K, N / 2], two values a
byte (`int8_pairs`): TensorRT takes INT4 tensors only as DequantizeLinear inputs, not as plugin inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from mmtrt.kernels.catalog import KERNEL_SUFFIX
from passes.fusion.graph_view import GraphView, NoMatch, NotCandidate, attribute, check

GROUPS = (64, 128)  # the blocks awq_int4 lowers for TensorRT (TENSORRT_BLOCKS), AWQ's usual groups


@dataclass
class Int4GemmMatch:
    anchor: onnx.NodeProto  # the MatMul the plugin node replaces
    x: str
    weight: str
    scales: str  # [G, N], in the activations' type or fp32
    pre: str | None  # [K] in the activations' type, or None
    dtype: int  # the activations' ONNX type
    group: int
    k: int


def match_int4_gemm(view: GraphView, matmul: onnx.NodeProto) -> Int4GemmMatch:
    try:
        dq = view.producer(matmul.input[1], "DequantizeLinear", skip_casts=True)
    except NoMatch:
        raise NotCandidate from None
    view.single_use(matmul.input[1])
    check(view.on_trt(dq), f"{dq.name} runs on ONNX Runtime")
    weight = dq.input[0]
    check(weight in view.weights and view.weights[weight].data_type == TensorProto.INT4, "the weight is not an INT4 initializer")
    check(len(dq.input) == 2 or not dq.input[2], "the DequantizeLinear has a zero point (the kernel is symmetric)")
    group = attribute(dq, "block_size", 0)
    check(attribute(dq, "axis", 1) == 0 and group in GROUPS,
          f"block size {group} on axis {attribute(dq, 'axis', 1)}: the kernel takes groups {GROUPS} along K")
    K, N = view.weights[weight].dims
    check(N % 2 == 0, f"W [{K}, {N}] has an odd N: the kernel reads two columns a byte")
    scales = dq.input[1]
    check(list(view.const(scales).shape) == [-(-K // group), N], f"scales {scales} do not fit W [{K}, {N}]")
    dtype = view.types.get(matmul.input[0])
    check(dtype in KERNEL_SUFFIX, f"activations of type {dtype} are not fp32/fp16/bf16")
    check(view.types.get(scales) in (dtype, TensorProto.FLOAT), "the scales are neither fp32 nor the activations' type")
    x, pre = matmul.input[0], None
    mul = view.made.get(x)
    if mul is not None and mul.op_type == "Mul" and view.uses.get(x) == 1 and view.on_trt(mul):
        found = _prequant_scale(view, mul, K)
        if found is not None:
            pre = found
            x = next(i for i in mul.input if i != pre)
    return Int4GemmMatch(matmul, x, weight, scales, pre, dtype, group, K)


def _prequant_scale(view: GraphView, mul: onnx.NodeProto, K: int) -> str | None:
    """The pre-quant scale when the Mul multiplies by a constant vector of length K in the activations' type
    (AWQ's, before o_proj); None for any other Mul (down_proj's input is silu(gate) * up)."""
    for name in mul.input:
        if name in view.weights or (name in view.made and view.made[name].op_type == "Constant"):
            if view.const(name).shape == (K,) and view.types.get(name) == view.types.get(mul.output[0]):
                return name
    return None


def int8_pairs(q: np.ndarray) -> np.ndarray:
    """int4 values [K, N] (even N) as the plugin's int8 [K, N / 2]: byte j of row k holds column 2j in the low nibble
    and 2j + 1 in the high one (the bytes of ONNX's own INT4 packing of the row-major array)."""
    nibbles = np.asarray(q).astype(np.int16) & 15
    return (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).astype(np.uint8).view(np.int8)


def np_type(onnx_type: int):
    return helper.tensor_dtype_to_np_dtype(onnx_type)
