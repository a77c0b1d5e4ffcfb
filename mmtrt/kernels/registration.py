"""TensorRT registration of mmtrt's plugins through `tensorrt.plugin` (TensorRT 10.8+, written for TensorRT 11).

The bundle carries this file beside the PTX; `mmtrt build-engines` imports it from there before parsing a segment,
so TensorRT's ONNX parser finds `mmtrt::TokenSelect`, `mmtrt::TokenSelectMerge`, `mmtrt::TokenSelectScored`,
`mmtrt::TokenSelectDynamic` and `mmtrt::Int4GroupGemm` in its registry (tensorrt.plugin makes each an IPluginV3 whose
AOT build hands TensorRT the kernel; the nodes carry
plugin_namespace "mmtrt" and aot 1). `aot_impl` hands TensorRT the kernel name, the PTX and the launch
parameters, so the kernel is compiled into the engine and runs without Python. The kernels' scalar parameters are
int32 SymIntExprs in the order kernels.cu declares them, after the input pointers and before the output pointer.

NOT RUN: no machine this was written on has TensorRT. The API follows NVIDIA/TensorRT's
samples/python/quickly_deployable_plugins (qdp_defs.py: register, autotune, aot_impl returning
(name, ptx, KernelLaunchParams, SymIntExprs)) and the tensorrt.plugin reference (AutoTuneCombination type strings).
"""

from __future__ import annotations

import struct
from pathlib import Path

import tensorrt as trt
import tensorrt.plugin as trtp

PTX = Path(__file__).with_name("kernels.ptx")
SUFFIX = {trt.float32: "f32", trt.float16: "f16", trt.bfloat16: "bf16"}
FLOATS = "FP32|FP16|BF16"
TOKEN_SELECT_THREADS = 256  # kTokenSelectThreads in token_select.h
TOKEN_SELECT_ROW_BLOCKS = 8  # blocks per image that share the gather
INT4_LANES, INT4_SLICES, INT4_COLS, INT4_ROWS = 32, 8, 64, 8  # int4_gemm.h


def _ptx() -> bytes:
    return PTX.read_bytes()


def _int32(values) -> trtp.SymIntExprs:
    return trtp.SymIntExprs.from_tuple([trtp.SymInt32(v) for v in values])


def _float_bits(value: float) -> int:
    return struct.unpack("<i", struct.pack("<f", value))[0]


@trtp.register("mmtrt::TokenSelect")
def token_select_desc(q: trtp.TensorDesc, k: trtp.TensorDesc, features: trtp.TensorDesc, keep: int, cls: int,
                      scale: float) -> trtp.TensorDesc:
    out = features.like()
    out.shape_expr[1] = keep
    return out


@trtp.autotune("mmtrt::TokenSelect")
def token_select_autotune(q: trtp.TensorDesc, k: trtp.TensorDesc, features: trtp.TensorDesc,
                          outputs) -> list[trtp.AutoTuneCombination]:
    return [trtp.AutoTuneCombination(f"{FLOATS}, {FLOATS}, {FLOATS}, {FLOATS}", "LINEAR")]


@trtp.aot_impl("mmtrt::TokenSelect")
def token_select_aot(q: trtp.TensorDesc, k: trtp.TensorDesc, features: trtp.TensorDesc, keep: int, cls: int,
                     scale: float, outputs, tactic: int):
    n, heads, q_len, head_dim = (q.shape_expr[i] for i in range(4))
    kv_len, tokens, dim = k.shape_expr[2], features.shape_expr[1], features.shape_expr[2]
    params = trtp.KernelLaunchParams()
    params.grid_x = n
    params.grid_y = min(keep, TOKEN_SELECT_ROW_BLOCKS)
    params.block_x = TOKEN_SELECT_THREADS
    params.shared_mem = _token_select_smem(kv_len, tokens, keep, head_dim, 0)
    args = _int32([heads, q_len, kv_len, head_dim, cls, tokens, dim, keep, _float_bits(scale)])
    return f"mmtrt_token_select_{SUFFIX[features.dtype]}".encode(), _ptx(), params, args


def _token_select_smem(kv_len, tokens, keep, head_dim, contextual):
    """token_select_smem_floats in token_select.h, in bytes."""
    return 4 * (kv_len + 3 * tokens + keep + TOKEN_SELECT_THREADS + contextual * (head_dim + 2))


@trtp.register("mmtrt::TokenSelectMerge")
def token_select_merge_desc(q: trtp.TensorDesc, k: trtp.TensorDesc, features: trtp.TensorDesc,
                            target_at: trtp.TensorDesc, merged_at: trtp.TensorDesc, keep: int, cls: int, scale: float,
                            contextual: int) -> trtp.TensorDesc:
    out = features.like()
    out.shape_expr[1] = keep
    return out


@trtp.autotune("mmtrt::TokenSelectMerge")
def token_select_merge_autotune(q: trtp.TensorDesc, k: trtp.TensorDesc, features: trtp.TensorDesc,
                                target_at: trtp.TensorDesc, merged_at: trtp.TensorDesc,
                                outputs) -> list[trtp.AutoTuneCombination]:
    return [trtp.AutoTuneCombination(f"{FLOATS}, {FLOATS}, {FLOATS}, INT32, INT32, {FLOATS}", "LINEAR")]


@trtp.aot_impl("mmtrt::TokenSelectMerge")
def token_select_merge_aot(q: trtp.TensorDesc, k: trtp.TensorDesc, features: trtp.TensorDesc,
                           target_at: trtp.TensorDesc, merged_at: trtp.TensorDesc, keep: int, cls: int, scale: float,
                           contextual: int, outputs, tactic: int):
    n, heads, q_len, head_dim = (q.shape_expr[i] for i in range(4))
    kv_len, tokens, dim = k.shape_expr[2], features.shape_expr[1], features.shape_expr[2]
    params = trtp.KernelLaunchParams()
    params.grid_x = n
    params.grid_y = min(keep, TOKEN_SELECT_ROW_BLOCKS)
    params.block_x = TOKEN_SELECT_THREADS
    params.shared_mem = _token_select_smem(kv_len, tokens, keep, head_dim, contextual)
    args = _int32([heads, q_len, kv_len, head_dim, cls, tokens, dim, keep, _float_bits(scale), contextual])
    return f"mmtrt_token_select_merge_{SUFFIX[features.dtype]}".encode(), _ptx(), params, args


def _scored_launch(features: trtp.TensorDesc, rows) -> trtp.KernelLaunchParams:
    """One block per image (times row chunks); shared memory: scored_smem_words in token_budget.h, in bytes."""
    tokens = features.shape_expr[1]
    params = trtp.KernelLaunchParams()
    params.grid_x = features.shape_expr[0]
    params.grid_y = min(rows, TOKEN_SELECT_ROW_BLOCKS)
    params.block_x = TOKEN_SELECT_THREADS
    params.shared_mem = 4 * (4 * tokens + rows + 1)
    return params


@trtp.register("mmtrt::TokenSelectScored")
def token_select_scored_desc(scores: trtp.TensorDesc, features: trtp.TensorDesc, keep: int) -> trtp.TensorDesc:
    out = features.like()
    out.shape_expr[1] = keep
    return out


@trtp.autotune("mmtrt::TokenSelectScored")
def token_select_scored_autotune(scores: trtp.TensorDesc, features: trtp.TensorDesc,
                                 outputs) -> list[trtp.AutoTuneCombination]:
    return [trtp.AutoTuneCombination(f"FP32, {FLOATS}, {FLOATS}", "LINEAR")]


@trtp.aot_impl("mmtrt::TokenSelectScored")
def token_select_scored_aot(scores: trtp.TensorDesc, features: trtp.TensorDesc, keep: int, outputs, tactic: int):
    args = _int32([features.shape_expr[1], features.shape_expr[2], keep])
    return f"mmtrt_token_select_scored_{SUFFIX[features.dtype]}".encode(), _ptx(), _scored_launch(features, keep), args


@trtp.register("mmtrt::TokenSelectDynamic")
def token_select_dynamic_desc(scores: trtp.TensorDesc, features: trtp.TensorDesc, most: int, least: int,
                              mass: float) -> tuple[trtp.TensorDesc, trtp.TensorDesc]:
    """The padded block [n, most, dim] and the count [n] (int32): bounded shapes, no data-dependent one."""
    block = features.like()
    block.shape_expr[1] = most
    return block, trtp.from_shape_expr((features.shape_expr[0],), dtype=trt.int32)


@trtp.autotune("mmtrt::TokenSelectDynamic")
def token_select_dynamic_autotune(scores: trtp.TensorDesc, features: trtp.TensorDesc,
                                  outputs) -> list[trtp.AutoTuneCombination]:
    return [trtp.AutoTuneCombination(f"FP32, {FLOATS}, {FLOATS}, INT32", "LINEAR")]


@trtp.aot_impl("mmtrt::TokenSelectDynamic")
def token_select_dynamic_aot(scores: trtp.TensorDesc, features: trtp.TensorDesc, most: int, least: int, mass: float,
                             outputs, tactic: int):
    args = _int32([features.shape_expr[1], features.shape_expr[2], most, least, _float_bits(mass)])
    return f"mmtrt_token_select_dynamic_{SUFFIX[features.dtype]}".encode(), _ptx(), _scored_launch(features, most), args


@trtp.register("mmtrt::Int4GroupGemm")
def int4_gemm_desc(x: trtp.TensorDesc, weight: trtp.TensorDesc, scales: trtp.TensorDesc, pre: trtp.TensorDesc,
                   group_size: int) -> trtp.TensorDesc:
    out = x.like()
    out.shape_expr[x.ndim - 1] = weight.shape_expr[1]
    return out


@trtp.autotune("mmtrt::Int4GroupGemm")
def int4_gemm_autotune(x: trtp.TensorDesc, weight: trtp.TensorDesc, scales: trtp.TensorDesc, pre: trtp.TensorDesc,
                       outputs) -> list[trtp.AutoTuneCombination]:
    """x, pre and y share a type; the scales are in that type or fp32 (the kernels kernels.cu instantiates)."""
    same = trtp.AutoTuneCombination(f"{FLOATS}, INT4, {FLOATS}, {FLOATS}, {FLOATS}", "LINEAR")
    fp32_scales = trtp.AutoTuneCombination("FP16|BF16, INT4, FP32, FP16|BF16, FP16|BF16", "LINEAR")
    return [same, fp32_scales]


@trtp.aot_impl("mmtrt::Int4GroupGemm")
def int4_gemm_aot(x: trtp.TensorDesc, weight: trtp.TensorDesc, scales: trtp.TensorDesc, pre: trtp.TensorDesc,
                  group_size: int, outputs, tactic: int):
    K, N = weight.shape_expr[0], weight.shape_expr[1]
    M = x.shape_expr.numel() // K
    params = trtp.KernelLaunchParams()
    params.grid_x = trtp.cdiv(N, INT4_COLS)
    params.grid_y = trtp.cdiv(M, INT4_ROWS)
    params.block_x, params.block_y = INT4_LANES, INT4_SLICES
    params.shared_mem = 0  # the partial sums are static shared memory
    kernel = f"mmtrt_int4_gemm_{SUFFIX[x.dtype]}_{SUFFIX[scales.dtype]}"
    return kernel.encode(), _ptx(), params, _int32([M, K, N, group_size])
