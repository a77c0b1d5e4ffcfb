"""TensorRT 11 registration of mmtrt's plugins through `tensorrt.plugin`, as AOT plugins.

The bundle carries this file beside the PTX and launch.py; `mmtrt build-engines` imports it from there before
parsing a segment, so TensorRT's ONNX parser finds `mmtrt::TokenSelect`, `mmtrt::TokenSelectMerge`,
`mmtrt::TokenSelectScored`, `mmtrt::TokenSelectDynamic` and `mmtrt::Int4GroupGemm` in its registry (the nodes carry
plugin_namespace "mmtrt" and aot 1). `aot_impl` hands TensorRT the kernel name, the PTX, the launch parameters and
the int32 scalar arguments (launch.py computes them), so the kernel is compiled into the engine and runs without
Python.

tensorrt.plugin validates these functions when they are decorated (tensorrt/plugin/_validate.py): annotations must
be classes, not strings (so this file must not use `from __future__ import annotations`), every `aot_impl` must
declare its return type `tuple[str | bytes, str | bytes, KernelLaunchParams, SymIntExprs]`, and its symbolic sizes
have no reflected operators. tests/kernels/test_registration.py runs these checks with the TensorRT 11.4 Python
sources (tests/trt11_plugin.py loads them); TensorRT-RTX has no AOT plugin interface (see rtx.py), so no engine of
ours has run this file.
"""

import importlib.util
from pathlib import Path

import tensorrt as trt
import tensorrt.plugin as trtp

PTX = Path(__file__).with_name("kernels.ptx")
SUFFIX = {trt.float32: "f32", trt.float16: "f16", trt.bfloat16: "bf16"}
AOT = tuple[bytes, bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(f"mmtrt_plugins_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


launch = _sibling("launch")


def _aot(found) -> AOT:
    """tensorrt.plugin's form of a launch: the kernel name, the PTX, the launch parameters, the scalar arguments."""
    params = trtp.KernelLaunchParams()
    params.grid_x, params.grid_y = found.grid
    params.block_x, params.block_y = found.block
    params.shared_mem = found.shared_mem
    args = trtp.SymIntExprs.from_tuple([trtp.SymInt32(v) for v in found.args])
    return found.kernel.encode(), PTX.read_bytes(), params, args


def _combinations(plugin: str) -> list[trtp.AutoTuneCombination]:
    return [trtp.AutoTuneCombination(types, "LINEAR") for types in launch.IO_TYPES[plugin]]


def _rows(features: trtp.TensorDesc, count: int) -> trtp.TensorDesc:
    out = features.like()
    out.shape_expr[1] = count
    return out


@trtp.register("mmtrt::TokenSelect")
def token_select_desc(q: trtp.TensorDesc, k: trtp.TensorDesc, features: trtp.TensorDesc, keep: int, cls: int,
                      scale: float) -> trtp.TensorDesc:
    return _rows(features, keep)


@trtp.autotune("mmtrt::TokenSelect")
def token_select_autotune(q: trtp.TensorDesc, k: trtp.TensorDesc, features: trtp.TensorDesc,
                          outputs) -> list[trtp.AutoTuneCombination]:
    return _combinations("TokenSelect")


@trtp.aot_impl("mmtrt::TokenSelect")
def token_select_aot(q: trtp.TensorDesc, k: trtp.TensorDesc, features: trtp.TensorDesc, keep: int, cls: int,
                     scale: float, outputs, tactic: int) -> AOT:
    return _aot(launch.token_select(q.shape_expr, k.shape_expr, features.shape_expr, keep, cls, scale,
                                    SUFFIX[features.dtype]))


@trtp.register("mmtrt::TokenSelectMerge")
def token_select_merge_desc(q: trtp.TensorDesc, k: trtp.TensorDesc, features: trtp.TensorDesc,
                            target_at: trtp.TensorDesc, merged_at: trtp.TensorDesc, keep: int, cls: int, scale: float,
                            contextual: int) -> trtp.TensorDesc:
    return _rows(features, keep)


@trtp.autotune("mmtrt::TokenSelectMerge")
def token_select_merge_autotune(q: trtp.TensorDesc, k: trtp.TensorDesc, features: trtp.TensorDesc,
                                target_at: trtp.TensorDesc, merged_at: trtp.TensorDesc,
                                outputs) -> list[trtp.AutoTuneCombination]:
    return _combinations("TokenSelectMerge")


@trtp.aot_impl("mmtrt::TokenSelectMerge")
def token_select_merge_aot(q: trtp.TensorDesc, k: trtp.TensorDesc, features: trtp.TensorDesc,
                           target_at: trtp.TensorDesc, merged_at: trtp.TensorDesc, keep: int, cls: int, scale: float,
                           contextual: int, outputs, tactic: int) -> AOT:
    return _aot(launch.token_select(q.shape_expr, k.shape_expr, features.shape_expr, keep, cls, scale,
                                    SUFFIX[features.dtype], contextual))


@trtp.register("mmtrt::TokenSelectScored")
def token_select_scored_desc(scores: trtp.TensorDesc, features: trtp.TensorDesc, keep: int) -> trtp.TensorDesc:
    return _rows(features, keep)


@trtp.autotune("mmtrt::TokenSelectScored")
def token_select_scored_autotune(scores: trtp.TensorDesc, features: trtp.TensorDesc,
                                 outputs) -> list[trtp.AutoTuneCombination]:
    return _combinations("TokenSelectScored")


@trtp.aot_impl("mmtrt::TokenSelectScored")
def token_select_scored_aot(scores: trtp.TensorDesc, features: trtp.TensorDesc, keep: int, outputs,
                            tactic: int) -> AOT:
    return _aot(launch.token_select_scored(features.shape_expr, keep, SUFFIX[features.dtype]))


@trtp.register("mmtrt::TokenSelectDynamic")
def token_select_dynamic_desc(scores: trtp.TensorDesc, features: trtp.TensorDesc, most: int, least: int,
                              mass: float) -> tuple[trtp.TensorDesc, trtp.TensorDesc]:
    """The padded block [n, most, dim] and the count [n] (int32): bounded shapes, no data-dependent one."""
    return _rows(features, most), trtp.from_shape_expr((features.shape_expr[0],), dtype=trt.int32)


@trtp.autotune("mmtrt::TokenSelectDynamic")
def token_select_dynamic_autotune(scores: trtp.TensorDesc, features: trtp.TensorDesc,
                                  outputs) -> list[trtp.AutoTuneCombination]:
    return _combinations("TokenSelectDynamic")


@trtp.aot_impl("mmtrt::TokenSelectDynamic")
def token_select_dynamic_aot(scores: trtp.TensorDesc, features: trtp.TensorDesc, most: int, least: int, mass: float,
                             outputs, tactic: int) -> AOT:
    return _aot(launch.token_select_dynamic(features.shape_expr, most, least, mass, SUFFIX[features.dtype]))


@trtp.register("mmtrt::Int4GroupGemm")
def int4_gemm_desc(x: trtp.TensorDesc, weight: trtp.TensorDesc, scales: trtp.TensorDesc, pre: trtp.TensorDesc,
                   group_size: int) -> trtp.TensorDesc:
    """y [..., N] from x [..., K], the weight as int8 [K, N / 2] (two int4 per byte) and the scales [G, N]."""
    out = x.like()
    out.shape_expr[x.ndim - 1] = scales.shape_expr[1]
    return out


@trtp.autotune("mmtrt::Int4GroupGemm")
def int4_gemm_autotune(x: trtp.TensorDesc, weight: trtp.TensorDesc, scales: trtp.TensorDesc, pre: trtp.TensorDesc,
                       outputs) -> list[trtp.AutoTuneCombination]:
    """x, pre and y share a type; the scales are in that type or fp32; the weight is INT8 (launch.IO_TYPES)."""
    return _combinations("Int4GroupGemm")


@trtp.aot_impl("mmtrt::Int4GroupGemm")
def int4_gemm_aot(x: trtp.TensorDesc, weight: trtp.TensorDesc, scales: trtp.TensorDesc, pre: trtp.TensorDesc,
                  group_size: int, outputs, tactic: int) -> AOT:
    return _aot(launch.int4_gemm(x.shape_expr, scales.shape_expr, group_size, SUFFIX[x.dtype],
                                 SUFFIX[scales.dtype]))
