"""How each plugin kernel is launched: its name, grid, block, dynamic shared memory and int32 scalar arguments (in
the order kernels.cu declares them, after the input pointers and before the output pointers), from the input
shapes and the plugin's attributes.

One definition serves every launcher: TensorRT 11's AOT registration (registration.py) passes tensorrt.plugin's
symbolic sizes, TensorRT-RTX's plugin (rtx.py) and scripts/gpu_kernel_check.py pass ints. tensorrt.plugin's
symbolic sizes define +, -, *, // and comparisons but no reflected operators, so every expression keeps the size
on the left (`tokens * 3`, never `3 * tokens`, which raises TypeError while TensorRT builds). Shared memory
follows token_select_smem_floats (token_select.h) and scored_smem_words (token_budget.h); the tests hold these
formulas against the headers' own functions through the CPU twin. A block may take at most MAX_DYNAMIC_SMEM of
dynamic shared memory without cudaFuncAttributeMaxDynamicSharedMemorySize, which TensorRT's AOT launch does not
set, so fuse_plugins fuses only selections that fit (`token_select_bytes`, `scored_bytes` with ints).

The bundle carries this file beside registration.py, which loads it from its own folder: the launch always
matches the PTX it ships with.
"""

import struct
from dataclasses import dataclass
from typing import Any, Sequence

MAX_DYNAMIC_SMEM = 48 * 1024  # bytes a launch may ask for without the opt-in attribute
TOKEN_SELECT_THREADS = 256  # kTokenSelectThreads (token_select.h)
ROW_BLOCKS = 8  # blocks per image that share the gather of the kept rows
INT4_LANES, INT4_SLICES, INT4_COLS, INT4_ROWS = 32, 8, 64, 8  # kInt4Lanes, kInt4Slices, kInt4Cols, kInt4MaxRows
FLOATS = "FP32|FP16|BF16"
# Per plugin, the types of its inputs then outputs that kernels.cu instantiates, as tensorrt.plugin's
# AutoTuneCombination strings. Int4GroupGemm's weight is INT8 holding two INT4 per byte: TensorRT takes INT4 only
# as a DequantizeLinear input, and NVIDIA's INT4 GEMM plugins take int8-packed weights too.
IO_TYPES = {
    "TokenSelect": [f"{FLOATS}, {FLOATS}, {FLOATS}, {FLOATS}"],
    "TokenSelectMerge": [f"{FLOATS}, {FLOATS}, {FLOATS}, INT32, INT32, {FLOATS}"],
    "TokenSelectScored": [f"FP32, {FLOATS}, {FLOATS}"],
    "TokenSelectDynamic": [f"FP32, {FLOATS}, {FLOATS}, INT32"],
    "Int4GroupGemm": [f"{FLOATS}, INT8, {FLOATS}, {FLOATS}, {FLOATS}", "FP16|BF16, INT8, FP32, FP16|BF16, FP16|BF16"],
}


@dataclass
class Launch:
    kernel: str
    grid: tuple[Any, Any]
    block: tuple[int, int]
    shared_mem: Any
    args: list[Any]


def io_combinations(plugin: str) -> set[tuple[str, ...]]:
    """Every allowed tuple of types: the positions with options a|b|c all take the option of the same rank."""
    found = set()
    for text in IO_TYPES[plugin]:
        positions = [p.strip().split("|") for p in text.split(",")]
        width = max(len(p) for p in positions)
        found |= {tuple(p[i] if len(p) > 1 else p[0] for p in positions) for i in range(width)}
    return found


def float_bits(value: float) -> int:
    """A float attribute as the int32 with its bits (the kernels read it back with __int_as_float)."""
    return struct.unpack("<i", struct.pack("<f", value))[0]


def token_select_bytes(kv_len, tokens, keep: int, head_dim, contextual: int = 0):
    """Dynamic shared memory of TokenSelect (contextual 0) and TokenSelectMerge, in bytes."""
    return (kv_len + tokens * 3 + keep + TOKEN_SELECT_THREADS + (head_dim + 2) * contextual) * 4


def scored_bytes(tokens, rows: int):
    """Dynamic shared memory of TokenSelectScored (rows = keep) and TokenSelectDynamic (rows = most), in bytes."""
    return (tokens * 4 + rows + 1) * 4


def token_select(q: Sequence, k: Sequence, features: Sequence, keep: int, cls: int, scale: float, suffix: str,
                 contextual: int | None = None) -> Launch:
    """TokenSelect, or TokenSelectMerge when `contextual` is given: q [n, heads, q_len, head_dim], k [n, heads,
    kv_len, head_dim], features [n, tokens, dim]."""
    n, heads, q_len, head_dim = q[0], q[1], q[2], q[3]
    kv_len, tokens, dim = k[2], features[1], features[2]
    args = [heads, q_len, kv_len, head_dim, cls, tokens, dim, keep, float_bits(scale)]
    merge = contextual is not None
    return Launch(f"mmtrt_token_select{'_merge' if merge else ''}_{suffix}", (n, min(keep, ROW_BLOCKS)),
                  (TOKEN_SELECT_THREADS, 1), token_select_bytes(kv_len, tokens, keep, head_dim, contextual or 0),
                  [*args, contextual] if merge else args)


def token_select_scored(features: Sequence, keep: int, suffix: str) -> Launch:
    return Launch(f"mmtrt_token_select_scored_{suffix}", (features[0], min(keep, ROW_BLOCKS)),
                  (TOKEN_SELECT_THREADS, 1), scored_bytes(features[1], keep), [features[1], features[2], keep])


def token_select_dynamic(features: Sequence, most: int, least: int, mass: float, suffix: str) -> Launch:
    return Launch(f"mmtrt_token_select_dynamic_{suffix}", (features[0], min(most, ROW_BLOCKS)),
                  (TOKEN_SELECT_THREADS, 1), scored_bytes(features[1], most),
                  [features[1], features[2], most, least, float_bits(mass)])


def int4_gemm(x: Sequence, scales: Sequence, group_size: int, suffix: str, scale_suffix: str) -> Launch:
    """Int4GroupGemm: x [..., K], scales [G, N]; the partial sums live in static shared memory."""
    rows = x[0]
    for i in range(1, len(x) - 1):
        rows = rows * x[i]
    K, N = x[len(x) - 1], scales[1]
    return Launch(f"mmtrt_int4_gemm_{suffix}_{scale_suffix}", ((N + INT4_COLS - 1) // INT4_COLS,
                  (rows + INT4_ROWS - 1) // INT4_ROWS), (INT4_LANES, INT4_SLICES), 0, [rows, K, N, group_size])
